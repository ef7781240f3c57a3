//! Request builders.

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body_util::Full;

/// A streamed OpenAI chat request body.
pub const CHAT: &str =
    r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi there"}]}"#;

/// A streamed Anthropic messages request body.
pub const MESSAGES: &str = r#"{"model":"claude-3-5-sonnet","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;

/// A JSON `POST` of `body` to `uri`, with `headers`.
pub fn post(uri: &str, body: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::post(uri).header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .expect("a valid request")
}

/// A [`CHAT`] request to `{base}/v1/chat/completions`, with `headers`.
pub fn chat(base: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    post(&format!("{base}/v1/chat/completions"), CHAT, headers)
}

/// Response headers with this `content-type` only.
pub fn content_type(value: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        "content-type",
        value.parse().expect("a valid content-type value"),
    );
    h
}
