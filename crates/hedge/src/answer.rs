//! What the client gets when every attempt of a race failed before its first token.

use std::error::Error;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body::Body;
use tailguard_core::render::{self, RenderError};
use tailguard_core::{
    BoxError, EndReason, ErrorInfo, GrpcCode, TimeoutError, UpstreamError, UpstreamFailure,
};

use crate::body::{Forward, HedgeBody};
use crate::error::RequestBodyError;
use crate::inflight::Failure;
use crate::verdict::Fault;

/// The answer when every attempt failed, `failure` the most informative one, with the reason
/// for the request's end report. `forward` (the attempt's own end report) is applied first, so
/// an inner layer's own reason for that attempt wins; except for a rendered answer, which ends
/// for a reason the hedge knows (the attempt's own report only says how a stream the client
/// never sees ended, or that the race dropped it).
pub(crate) fn every_attempt_failed<RB, E>(
    failure: Failure<RB, E>,
    mut forward: Option<Forward>,
    as_errors: bool,
    attempts: u8,
    grpc: bool,
) -> (Result<Response<HedgeBody<RB>>, Escape<E>>, EndReason)
where
    RB: Body,
    RB::Data: From<Bytes>,
    RB::Error: Into<BoxError>,
    E: Into<BoxError>,
{
    let fault = failure.fault();
    let mut reason = EndReason::UpstreamError(fault.kind);
    let answer = match failure {
        _ if as_errors => Err(Escape::Own(as_error(failure, attempts), grpc)),
        Failure::Service(e) => Err(Escape::Inner(e)),
        Failure::Response { stream, error, .. } if fault.replayed() => {
            Ok(stream.into_response(error, forward.take()))
        }
        Failure::Response { error, .. } => {
            forward = None;
            let (res, why) = rendered(fault, error.map(Into::into), attempts, grpc);
            reason = why;
            Ok(res)
        }
    };
    if let Some(f) = &forward {
        f.apply();
    }
    (answer, reason)
}

/// The [`UpstreamError`] of
/// error mode ([`with_error_mode`](crate::FirstTokenHedgeLayer::with_error_mode)): the kind
/// of the most informative failure, with what it was.
fn as_error<RB: Body, E: Into<BoxError>>(failure: Failure<RB, E>, attempts: u8) -> BoxError {
    let fault = failure.fault();
    let kind = fault.kind;
    let best = match failure {
        Failure::Service(e) => format!("the last error: {}", e.into()),
        Failure::Response { stream, .. } if matches!(kind, UpstreamFailure::Status(_)) => {
            format!("the best answer was {}", stream.status())
        }
        Failure::Response { .. } => format!("in the best, {}", fault.what),
    };
    let message = format!("{attempts} attempts failed before a first token; {best}");
    Box::new(UpstreamError::new(kind, message))
}

/// How a hedged request ends without a response, before the mode says what the caller gets.
pub(crate) enum Escape<E> {
    /// The inner service's own error (no attempt got a response): passed on in both modes.
    Inner(E),
    /// The hedge's own failure (a request body that failed while buffered; in error mode,
    /// every attempt failed), and whether the request was a gRPC one: rendered in response
    /// mode, returned in error mode.
    Own(BoxError, bool),
}

/// The response-mode answer to the hedge's own failure `error`: a `400` for a request body
/// that failed while buffered, a `502` otherwise; for a gRPC request a trailers-only response.
pub(crate) fn own_failure<B>(error: &BoxError, grpc: bool) -> Response<HedgeBody<B>>
where
    B: Body,
    B::Data: From<Bytes>,
{
    let info = if error.downcast_ref::<RequestBodyError>().is_some() {
        ErrorInfo::new(
            StatusCode::BAD_REQUEST,
            error.to_string(),
            "invalid_request_error",
            "request_body_failed",
        )
        .with_grpc(GrpcCode::InvalidArgument)
    } else {
        ErrorInfo::new(
            StatusCode::BAD_GATEWAY,
            error.to_string(),
            "upstream_error",
            "upstream_error",
        )
        .with_grpc(GrpcCode::Unavailable)
    };
    respond(&info, grpc)
}

/// `info` as a response: OpenAI JSON, or for gRPC a trailers-only response.
fn respond<B>(info: &ErrorInfo, grpc: bool) -> Response<HedgeBody<B>>
where
    B: Body,
    B::Data: From<Bytes>,
{
    render::respond(info, grpc, |json| HedgeBody::local(json.map(B::Data::from)))
}

/// The answer to a race whose most informative failure was a `2xx` stream with no token (see
/// [`Fault::replayed`]), with the reason for the request's end report: a `504` when that
/// stream's body error was a timeout (an inner layer's [`TimeoutError`]), a `502` otherwise.
/// Rendered by core: an OpenAI JSON error body, or for gRPC a trailers-only response
/// (`grpc-status` 4 for a timeout, 14 otherwise).
fn rendered<B>(
    fault: Fault,
    error: Option<BoxError>,
    attempts: u8,
    grpc: bool,
) -> (Response<HedgeBody<B>>, EndReason)
where
    B: Body,
    B::Data: From<Bytes>,
{
    let timeout = error.as_deref().and_then(|e| timeout_in(e));
    let (info, reason) = match timeout {
        Some(t) => (t.error_info(), t.phase().end_reason()),
        None => (
            bad_gateway(fault, attempts),
            EndReason::UpstreamError(fault.kind),
        ),
    };
    (respond(&info, grpc), reason)
}

/// A timeout anywhere in the error's source chain.
fn timeout_in<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a TimeoutError> {
    std::iter::successors(Some(e), |&e| e.source()).find_map(|e| e.downcast_ref::<TimeoutError>())
}

/// The `502` of a `2xx` answer that failed with `fault` before its first token: a stream that
/// broke, ended short, completed without a token or sent junk, or an answer that is no stream.
fn bad_gateway(fault: Fault, attempts: u8) -> ErrorInfo {
    let message = format!(
        "every upstream attempt failed before a first token ({attempts} sent); in the best, {}",
        fault.what
    );
    ErrorInfo::new(
        StatusCode::BAD_GATEWAY,
        message,
        "upstream_error",
        fault.code,
    )
    .with_grpc(GrpcCode::Unavailable)
}
