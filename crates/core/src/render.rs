//! Turning a rejection or a timeout into what the client's protocol expects.
//!
//! One place decides the shape of every error tailguard sends:
//!
//! * before headers: an HTTP response with the right status, an OpenAI-style JSON error body
//!   (`{"error":{"message":..,"type":..,"code":..}}`) and `Retry-After` where it applies
//!   ([`error_response`]);
//! * mid-stream, a terminal in-band event in the stream's own dialect ([`in_band`]): OpenAI
//!   `data: {"error":{..}}` followed by `data: [DONE]`, Anthropic `event: error`, or the
//!   OpenAI Responses API's `event: error`;
//! * for gRPC, trailers with `grpc-status` and `grpc-message` ([`grpc_trailers`]), or before
//!   headers a trailers-only response ([`respond`], which picks this or [`error_response`]).
//!
//! Rendered events always begin at an event boundary and end with a blank line; a layer that
//! ends a stream early must hold back the bytes of an event the client has not fully received
//! (see [`StreamTracker::pending_bytes`](crate::StreamTracker::pending_bytes)).

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use crate::classify::Wire;
use crate::error::{OverloadReason, Overloaded, Phase, TimeoutError};

/// `Retry-After` in whole seconds: rounded up, never 0.
pub fn retry_after_secs(d: Duration) -> u64 {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    secs.max(1)
}

/// A gRPC status code (the codes of the gRPC specification, 0 to 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GrpcCode {
    /// 0: the call succeeded.
    Ok,
    /// 1: the call was cancelled.
    Cancelled,
    /// 2: an unknown error.
    Unknown,
    /// 3: the request is invalid.
    InvalidArgument,
    /// 4: the deadline passed.
    DeadlineExceeded,
    /// 5: not found.
    NotFound,
    /// 6: already exists.
    AlreadyExists,
    /// 7: permission denied.
    PermissionDenied,
    /// 8: a resource (capacity) is exhausted.
    ResourceExhausted,
    /// 9: a precondition failed.
    FailedPrecondition,
    /// 10: the call was aborted.
    Aborted,
    /// 11: out of range.
    OutOfRange,
    /// 12: not implemented.
    Unimplemented,
    /// 13: an internal error.
    Internal,
    /// 14: the service is unavailable.
    Unavailable,
    /// 15: data was lost.
    DataLoss,
    /// 16: the caller is not authenticated.
    Unauthenticated,
}

impl GrpcCode {
    const ALL: [GrpcCode; 17] = [
        GrpcCode::Ok,
        GrpcCode::Cancelled,
        GrpcCode::Unknown,
        GrpcCode::InvalidArgument,
        GrpcCode::DeadlineExceeded,
        GrpcCode::NotFound,
        GrpcCode::AlreadyExists,
        GrpcCode::PermissionDenied,
        GrpcCode::ResourceExhausted,
        GrpcCode::FailedPrecondition,
        GrpcCode::Aborted,
        GrpcCode::OutOfRange,
        GrpcCode::Unimplemented,
        GrpcCode::Internal,
        GrpcCode::Unavailable,
        GrpcCode::DataLoss,
        GrpcCode::Unauthenticated,
    ];

    /// The numeric code.
    pub fn as_u8(self) -> u8 {
        // The variants are declared in code order.
        self as u8
    }

    /// The code of a numeric value (`None` above 16).
    pub fn from_u16(code: u16) -> Option<GrpcCode> {
        Self::ALL.get(usize::from(code)).copied()
    }
}

/// Everything needed to render one error in any protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ErrorInfo {
    /// HTTP status, for errors sent before headers.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: Cow<'static, str>,
    /// OpenAI error `type`, e.g. `"timeout_error"`, `"rate_limit_exceeded"`.
    pub kind: &'static str,
    /// Machine-readable `code`, e.g. `"idle_timeout"`, `"queue_full"`.
    pub code: &'static str,
    /// Anthropic error `type`, e.g. `"timeout_error"`, `"overloaded_error"`.
    pub anthropic_kind: &'static str,
    /// gRPC status code.
    pub grpc: GrpcCode,
    /// Time after which a retry may succeed (sent as `Retry-After`).
    pub retry_after: Option<Duration>,
}

impl ErrorInfo {
    /// Builds an error description.
    pub fn new(
        status: StatusCode,
        message: impl Into<Cow<'static, str>>,
        kind: &'static str,
        code: &'static str,
    ) -> Self {
        let (anthropic_kind, grpc) = match status.as_u16() {
            429 => ("rate_limit_error", GrpcCode::ResourceExhausted),
            503 | 529 => ("overloaded_error", GrpcCode::Unavailable),
            504 | 408 => ("timeout_error", GrpcCode::DeadlineExceeded),
            _ => ("api_error", GrpcCode::Internal),
        };
        ErrorInfo {
            status,
            message: message.into(),
            kind,
            code,
            anthropic_kind,
            grpc,
            retry_after: None,
        }
    }

    /// Sets `Retry-After`.
    pub fn with_retry_after(mut self, d: Duration) -> Self {
        self.retry_after = Some(d);
        self
    }

    /// Sets the gRPC code.
    pub fn with_grpc(mut self, code: GrpcCode) -> Self {
        self.grpc = code;
        self
    }
}

/// An error that knows how it is rendered.
pub trait RenderError {
    /// The rendering description of this error.
    fn error_info(&self) -> ErrorInfo;
}

impl RenderError for TimeoutError {
    fn error_info(&self) -> ErrorInfo {
        let code = match self.phase() {
            Phase::Head => "head_timeout",
            Phase::FirstToken => "first_token_timeout",
            Phase::Idle => "idle_timeout",
            Phase::Liveness => "liveness_timeout",
            Phase::Total => "deadline_exceeded",
        };
        ErrorInfo::new(
            StatusCode::GATEWAY_TIMEOUT,
            self.to_string(),
            "timeout_error",
            code,
        )
        .with_grpc(GrpcCode::DeadlineExceeded)
    }
}

impl RenderError for Overloaded {
    fn error_info(&self) -> ErrorInfo {
        let kind = if self.status() == StatusCode::TOO_MANY_REQUESTS {
            "rate_limit_exceeded"
        } else {
            "server_overloaded"
        };
        let mut info = ErrorInfo::new(
            self.status(),
            self.to_string(),
            kind,
            self.reason().as_str(),
        );
        info.grpc = match self.reason() {
            OverloadReason::QueueTimeout => GrpcCode::Unavailable,
            OverloadReason::DeadlineTooShort => GrpcCode::DeadlineExceeded,
            _ => GrpcCode::ResourceExhausted,
        };
        if let Some(after) = self.retry_after() {
            info = info.with_retry_after(after);
        }
        info
    }
}

/// The OpenAI error object: `{"error":{"message":..,"type":..,"param":null,"code":..}}`.
pub fn openai_json(info: &ErrorInfo) -> Bytes {
    Bytes::from(openai_error(info).to_string())
}

fn openai_error(info: &ErrorInfo) -> serde_json::Value {
    serde_json::json!({
        "error": {
            "message": info.message,
            "type": info.kind,
            "param": null,
            "code": info.code,
        }
    })
}

/// An HTTP error response: `info.status`, `content-type: application/json`, the OpenAI error
/// body, and `Retry-After` (whole seconds, rounded up, never 0) when `info` has one.
///
/// `body` turns the JSON bytes into the response body type of the caller's stack.
pub fn error_response<T>(info: &ErrorInfo, body: impl FnOnce(Bytes) -> T) -> Response<T> {
    let mut res = Response::new(body(openai_json(info)));
    *res.status_mut() = info.status;
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(after) = info.retry_after {
        h.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
    }
    res
}

/// The response that answers a request with `info` before headers: for a gRPC request
/// (`grpc`) a trailers-only gRPC response (status 200, `content-type: application/grpc`, the
/// [`grpc_trailers`] in the headers, and the body `body(None)`), which a gRPC client reads as
/// that status; for any other request the [`error_response`], with the body `body(Some(json))`.
pub fn respond<T>(
    info: &ErrorInfo,
    grpc: bool,
    body: impl FnOnce(Option<Bytes>) -> T,
) -> Response<T> {
    if !grpc {
        return error_response(info, |json| body(Some(json)));
    }
    let mut res = Response::new(body(None));
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.extend(grpc_trailers(info.grpc, &info.message));
    res
}

/// The terminal in-band event(s) that end a stream of dialect `wire` with `info`.
///
/// * OpenAI (and SSE of no known dialect): `data: {"error":{..}}` then `data: [DONE]`;
/// * Anthropic: `event: error` with `{"type":"error","error":{"type":..,"message":..}}`;
/// * the OpenAI Responses API: `event: error` with
///   `{"type":"error","code":..,"message":..,"param":null}`, no `[DONE]`;
/// * NDJSON: one line `{"error":{..}}`;
/// * gRPC and opaque bodies: `None` (use [`grpc_trailers`] or a body error).
///
/// The bytes begin at an event boundary and end with the blank line that dispatches the event.
pub fn in_band(wire: Wire, info: &ErrorInfo) -> Option<Bytes> {
    let text = match wire {
        Wire::OpenAiSse | Wire::Sse => format!("data: {}\n\ndata: [DONE]\n\n", openai_error(info)),
        Wire::AnthropicSse => {
            let v = serde_json::json!({
                "type": "error",
                "error": { "type": info.anthropic_kind, "message": info.message },
            });
            format!("event: error\ndata: {v}\n\n")
        }
        // The Responses API's `error` stream event; the stream ends with it (no `[DONE]`).
        // Its `sequence_number` is left out: only the upstream knows the stream's count.
        Wire::OpenAiResponsesSse => {
            let v = serde_json::json!({
                "type": "error",
                "code": info.code,
                "message": info.message,
                "param": null,
            });
            format!("event: error\ndata: {v}\n\n")
        }
        Wire::Ndjson => format!("{}\n", openai_error(info)),
        Wire::Grpc | Wire::Opaque => return None,
    };
    Some(Bytes::from(text))
}

/// gRPC trailers: `grpc-status` and a percent-encoded `grpc-message`.
pub fn grpc_trailers(code: GrpcCode, message: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("grpc-status", HeaderValue::from(u16::from(code.as_u8())));
    if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
        h.insert("grpc-message", v);
    }
    h
}

/// Percent-encodes as the gRPC spec asks of `grpc-message`: every byte outside printable ASCII
/// (0x20..=0x7E) and `%` itself.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_round_trip_through_their_numbers() {
        for n in 0..=16u16 {
            let code = GrpcCode::from_u16(n).unwrap();
            assert_eq!(u16::from(code.as_u8()), n);
        }
        assert_eq!(GrpcCode::from_u16(14), Some(GrpcCode::Unavailable));
        assert_eq!(GrpcCode::from_u16(17), None);
    }

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn http_error_response_has_status_body_and_retry_after() {
        let o = Overloaded::new(OverloadReason::QueueFull, StatusCode::TOO_MANY_REQUESTS)
            .with_retry_after(Duration::from_millis(300));
        let res = error_response(&o.error_info(), |b| b);
        assert_eq!(res.status(), 429);
        assert_eq!(res.headers()[RETRY_AFTER], "1");
        assert_eq!(res.headers()[CONTENT_TYPE], "application/json");
        let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(v["error"]["type"], "rate_limit_exceeded");
        assert_eq!(v["error"]["code"], "queue_full");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("queue is full")
        );
    }

    #[test]
    fn openai_in_band_is_an_error_event_then_done() {
        let t = TimeoutError::new(Phase::Idle, Duration::from_secs(1), Duration::from_secs(3));
        let b = in_band(Wire::OpenAiSse, &t.error_info()).unwrap();
        let s = std::str::from_utf8(&b).unwrap();
        assert!(s.starts_with("data: {\"error\":"));
        assert!(s.ends_with("\n\ndata: [DONE]\n\n"));
        let json = s
            .strip_prefix("data: ")
            .unwrap()
            .split("\n\n")
            .next()
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v["error"]["code"], "idle_timeout");
    }

    #[test]
    fn responses_in_band_is_the_responses_error_event_without_done() {
        let t = TimeoutError::new(Phase::Idle, Duration::from_secs(1), Duration::from_secs(3));
        let b = in_band(Wire::OpenAiResponsesSse, &t.error_info()).unwrap();
        let s = std::str::from_utf8(&b).unwrap();
        let data = s.strip_prefix("event: error\ndata: ").unwrap();
        assert!(data.ends_with("\n\n") && !s.contains("[DONE]"));
        let v: serde_json::Value = serde_json::from_str(data.trim_end()).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["code"], "idle_timeout");
        assert!(v["param"].is_null());
        assert!(v["message"].as_str().unwrap().contains("idle"));
    }

    #[test]
    fn anthropic_in_band_is_an_error_event() {
        let t = TimeoutError::new(
            Phase::FirstToken,
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        let b = in_band(Wire::AnthropicSse, &t.error_info()).unwrap();
        let s = std::str::from_utf8(&b).unwrap();
        assert!(s.starts_with("event: error\ndata: {"));
        assert!(s.ends_with("}\n\n"));
        let v: serde_json::Value =
            serde_json::from_str(s.lines().nth(1).unwrap().strip_prefix("data: ").unwrap())
                .unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "timeout_error");
        assert!(in_band(Wire::Grpc, &t.error_info()).is_none());
    }

    #[test]
    fn grpc_trailers_encode_message() {
        let h = grpc_trailers(GrpcCode::DeadlineExceeded, "idle timeout 100% \u{e9}");
        assert_eq!(h["grpc-status"], "4");
        assert_eq!(h["grpc-message"], "idle timeout 100%25 %C3%A9");
    }
}
