//! How a stream that the layer ends finishes for the client: why it ends ([`Failure`]: a timer,
//! or the upstream failing) and what follows the last whole event ([`End`]).

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body::Frame;
use tailguard_core::render::{self, ErrorInfo, GrpcCode, RenderError};
use tailguard_core::{
    BoxError, EndReason, ScanError, TimeoutError, UpstreamError, UpstreamFailure, Wire,
};

use crate::layer::OnExpiry;

/// What the body yields once the inner body is gone.
#[derive(Debug)]
pub(crate) enum End {
    /// A rendered in-band error event, then the end.
    Local(Bytes),
    /// Trailers (the inner body's, or rendered gRPC ones), then the end.
    Trailers(HeaderMap),
    /// A body error, then the end.
    Error(BoxError),
    /// Nothing more.
    Finished,
}

impl End {
    /// The next frame, leaving `Finished`.
    pub(crate) fn take<D: From<Bytes>>(&mut self) -> Option<Result<Frame<D>, BoxError>> {
        match std::mem::replace(self, End::Finished) {
            End::Local(bytes) => Some(Ok(Frame::data(D::from(bytes)))),
            End::Trailers(t) => Some(Ok(Frame::trailers(t))),
            End::Error(e) => Some(Err(e)),
            End::Finished => None,
        }
    }
}

/// Why the layer ends a stream: the end reason it reports, what the client is told, and the
/// error a body error carries.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) reason: EndReason,
    info: ErrorInfo,
    error: BoxError,
}

impl Failure {
    /// A timer expired.
    pub(crate) fn timeout(err: TimeoutError) -> Self {
        Failure {
            reason: err.phase().end_reason(),
            info: err.error_info(),
            error: Box::new(err),
        }
    }

    /// The layer's shutdown signal fired ([`with_shutdown`]): a 503-shaped error the client may
    /// retry, reported as [`EndReason::Deadline`] (the shutdown's grace period is over). For
    /// gRPC the status is `UNAVAILABLE`.
    ///
    /// [`with_shutdown`]: crate::SseIdleTimeoutLayer::with_shutdown
    pub(crate) fn shutdown() -> Self {
        let message = "the server is shutting down and ended this stream; retry the request";
        let info = ErrorInfo::new(
            StatusCode::SERVICE_UNAVAILABLE,
            message,
            "server_shutdown",
            "shutdown",
        );
        Failure {
            reason: EndReason::Deadline,
            info,
            error: message.into(),
        }
    }

    /// The body ended without the dialect's terminal event, or inside an event. For gRPC the
    /// status is `UNAVAILABLE`: the upstream went away before it finished.
    pub(crate) fn truncated(events: u64) -> Self {
        let message =
            format!("the upstream ended the stream without its final event ({events} events)");
        Self::upstream(UpstreamFailure::Truncated, message, None)
    }

    /// The stream's terminal event (`[DONE]`, `message_stop`) came without a finish reason: the
    /// upstream cut the answer short and said it ended (an interrupting server's bare `[DONE]`
    /// when a newer request takes its slot), which an SDK would return as a whole answer.
    pub(crate) fn interrupted(events: u64) -> Self {
        let message = format!(
            "the upstream ended the stream without a finish reason: the answer was cut short ({events} events)"
        );
        Self::upstream(UpstreamFailure::Truncated, message, None)
    }

    /// The body failed (a reset, a connection error). In the body-error flavour the client gets
    /// `err` itself.
    pub(crate) fn transport(err: BoxError, events: u64) -> Self {
        let message = format!("the upstream connection failed mid-stream ({events} events): {err}");
        Self::upstream(UpstreamFailure::Transport, message, Some(err))
    }

    /// The stream broke its framing (an event over the scanner's cap).
    pub(crate) fn protocol(err: ScanError, events: u64) -> Self {
        let message = format!("the upstream stream broke its framing ({events} events): {err}");
        Self::upstream(UpstreamFailure::Protocol, message, None)
    }

    /// The stream sent junk: an event its dialect cannot carry (for OpenAI and Anthropic SSE,
    /// data that is not a JSON object), which the client would fail to decode.
    pub(crate) fn malformed(events: u64) -> Self {
        let message = format!(
            "the upstream sent data that is not a JSON object mid-stream ({events} events); \
             the stream was ended here instead of passing it on"
        );
        Self::upstream(UpstreamFailure::Protocol, message, None)
    }

    /// An upstream failure, told to the client as an `upstream_error` whose code is the end
    /// reason's label.
    fn upstream(failure: UpstreamFailure, message: String, cause: Option<BoxError>) -> Self {
        let (code, grpc) = match failure {
            UpstreamFailure::Truncated => ("upstream_error_truncated", GrpcCode::Unavailable),
            UpstreamFailure::Transport => ("upstream_error_transport", GrpcCode::Unavailable),
            _ => ("upstream_error_protocol", GrpcCode::Internal),
        };
        let info = ErrorInfo::new(
            StatusCode::BAD_GATEWAY,
            message.clone(),
            "upstream_error",
            code,
        )
        .with_grpc(grpc);
        let error = cause.unwrap_or_else(|| Box::new(UpstreamError::new(failure, message)));
        Failure {
            reason: EndReason::UpstreamError(failure),
            info,
            error,
        }
    }

    /// The message the client is told.
    pub(crate) fn message(&self) -> &str {
        &self.info.message
    }

    /// How a stream of `wire` ends, per `on_expiry`: an in-band error event where the dialect
    /// has one, gRPC trailers for gRPC, a body error otherwise.
    pub(crate) fn into_end(self, wire: Wire, on_expiry: OnExpiry) -> End {
        let mode = match on_expiry {
            OnExpiry::Auto | OnExpiry::InBand => match render::in_band(wire, &self.info) {
                Some(bytes) => return End::Local(bytes),
                None if wire == Wire::Grpc => OnExpiry::GrpcTrailers,
                None => OnExpiry::BodyError,
            },
            other => other,
        };
        match mode {
            OnExpiry::GrpcTrailers => {
                End::Trailers(render::grpc_trailers(self.info.grpc, &self.info.message))
            }
            _ => End::Error(self.error),
        }
    }
}
