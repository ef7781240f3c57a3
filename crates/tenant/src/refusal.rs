//! The 429 of a refused reservation, in the client's dialect.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use tailguard_core::headers::is_grpc;
use tailguard_core::render::{ErrorInfo, in_band, respond, retry_after_secs};
use tailguard_core::{GrpcCode, OverloadReason, Wire};

use crate::store::Shortfall;

/// The `code` of a refusal that a later retry can pass.
pub const CODE_EXCEEDED: &str = "token_budget_exceeded";
/// The `code` of a refusal no retry can pass: the request reserves more than a limit.
pub const CODE_TOO_LARGE: &str = "request_exceeds_token_budget";

/// How the client expects its errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// OpenAI's JSON error object (every path but Anthropic's).
    OpenAi,
    /// Anthropic's: `{"type":"error","error":{"type":..,"message":..}}`.
    Anthropic,
    /// A trailers-only gRPC response (`RESOURCE_EXHAUSTED`).
    Grpc,
}

impl Answer {
    /// The dialect of a request: gRPC by its `content-type`, Anthropic by a path whose last
    /// segment is `messages` (`/v1/messages`, `/anthropic/v1/messages`), OpenAI otherwise.
    pub(crate) fn of<B>(req: &Request<B>) -> Answer {
        if is_grpc(req.headers()) {
            return Answer::Grpc;
        }
        let path = req.uri().path().trim_end_matches('/');
        if path.rsplit('/').next() == Some("messages") {
            Answer::Anthropic
        } else {
            Answer::OpenAi
        }
    }
}

/// What a refusal says: status 429, the limit, the numbers, and when to retry.
pub(crate) fn error_info(s: &Shortfall) -> ErrorInfo {
    let l = &s.limit;
    let (message, code) = match s.retry_after {
        Some(after) => (
            format!(
                "token budget exceeded: the request reserves {} {} tokens and {} of the {} per \
                 {} are left; retry in {} s",
                s.wanted,
                l.kind(),
                s.available,
                l.tokens(),
                l.window(),
                retry_after_secs(after)
            ),
            CODE_EXCEEDED,
        ),
        None => (
            format!(
                "token budget exceeded: the request reserves {} {} tokens, more than the {} per \
                 {} its tenant may use; lower max_tokens or shorten the prompt",
                s.wanted,
                l.kind(),
                l.tokens(),
                l.window()
            ),
            CODE_TOO_LARGE,
        ),
    };
    let info = ErrorInfo::new(
        StatusCode::TOO_MANY_REQUESTS,
        message,
        "rate_limit_exceeded",
        code,
    )
    .with_grpc(GrpcCode::ResourceExhausted);
    match s.retry_after {
        Some(after) => info.with_retry_after(after),
        None => info,
    }
}

/// What a store that cannot decide says (see [`Decision::Unavailable`]): 503 with admission's
/// code for an unreachable cluster store, `cluster_unavailable`, and `retry_after`.
///
/// [`Decision::Unavailable`]: crate::Decision::Unavailable
pub(crate) fn unavailable(retry_after: Duration) -> ErrorInfo {
    ErrorInfo::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the shared token budget store is unreachable; retry later",
        "server_overloaded",
        OverloadReason::ClusterUnavailable.as_str(),
    )
    .with_retry_after(retry_after)
}

/// The refusal response: status, `content-type`, `Retry-After` (whole seconds, rounded up)
/// and the body `body` makes of the error JSON (`None` for gRPC, whose status travels in the
/// headers).
pub(crate) fn response<T>(
    answer: Answer,
    info: &ErrorInfo,
    body: impl FnOnce(Option<Bytes>) -> T,
) -> Response<T> {
    if answer != Answer::Anthropic {
        return respond(info, answer == Answer::Grpc, body);
    }
    let mut res = Response::new(body(Some(anthropic_json(info))));
    *res.status_mut() = info.status;
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(after) = info.retry_after {
        h.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
    }
    res
}

/// Anthropic's error object, `{"type":"error","error":{"type":..,"message":..}}`: the data of
/// the in-band `event: error` core renders for Anthropic streams, which is the same object.
fn anthropic_json(info: &ErrorInfo) -> Bytes {
    const PREFIX: &[u8] = b"event: error\ndata: ";
    let event = in_band(Wire::AnthropicSse, info).unwrap_or_default();
    match event
        .strip_prefix(PREFIX)
        .and_then(|e| e.strip_suffix(b"\n\n"))
    {
        Some(json) => event.slice_ref(json),
        None => tailguard_core::render::openai_json(info),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limit::{Kind, Limit};

    #[test]
    fn the_answer_follows_the_path_and_the_content_type() {
        let req = |uri: &str, ct: &str| {
            Request::post(uri)
                .header("content-type", ct)
                .body(())
                .unwrap()
        };
        let json = "application/json";
        assert_eq!(Answer::of(&req("/v1/messages", json)), Answer::Anthropic);
        assert_eq!(
            Answer::of(&req("/anthropic/v1/messages/", json)),
            Answer::Anthropic
        );
        assert_eq!(
            Answer::of(&req("/v1/chat/completions", json)),
            Answer::OpenAi
        );
        assert_eq!(Answer::of(&req("/v1/messages/count", json)), Answer::OpenAi);
        assert_eq!(
            Answer::of(&req("/gen.Generator/Stream", "application/grpc")),
            Answer::Grpc
        );
    }

    #[test]
    fn anthropic_bodies_are_the_anthropic_error_object() {
        let s = Shortfall {
            limit: Limit::per_minute(Kind::Output, 60),
            wanted: 100,
            available: 7,
            retry_after: None,
        };
        let info = error_info(&s);
        let json: serde_json::Value = serde_json::from_slice(&anthropic_json(&info)).unwrap();
        assert_eq!(json["type"], "error");
        assert_eq!(json["error"]["type"], "rate_limit_error");
        let message = json["error"]["message"].as_str().unwrap();
        assert!(message.contains("more than the 60 per minute"), "{message}");
        assert_eq!(json.as_object().unwrap().len(), 2);
        let with_wait = error_info(&Shortfall {
            retry_after: Some(Duration::from_millis(1500)),
            ..s
        });
        assert_eq!(with_wait.code, CODE_EXCEEDED);
        assert!(with_wait.message.ends_with("retry in 2 s"));
    }
}
