//! What upstreams send: the pieces of an OpenAI SSE stream, gRPC messages, error events.

use bytes::Bytes;

/// A role-only first chunk (no content: not a token).
pub const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
/// One content chunk (a token).
pub const TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
/// Two content chunks in one piece.
pub const TWO_TOKENS: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n";
/// An SSE comment, as proxies and servers send to keep a connection alive.
pub const KEEPALIVE: &str = ": keepalive\n\n";
/// The terminal event of an OpenAI stream. A stream that ends properly says why first
/// ([`FINISH`]; both in one piece: [`END`]); a bare `[DONE]` is an interrupted one.
pub const DONE: &str = "data: [DONE]\n\n";
/// The last chunk of an OpenAI answer: no content, its finish reason.
pub const FINISH: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
/// The proper end of an OpenAI stream in one piece: [`FINISH`], then [`DONE`].
pub const END: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n"
);
/// A usage-only chunk (`stream_options.include_usage`): 11 prompt and 4 completion tokens.
pub const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":4,\"total_tokens\":15}}\n\n";
/// An OpenAI in-band error event.
pub const IN_BAND_ERROR: &str =
    "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}\n\n";

/// A content chunk carrying `text`.
pub fn token(text: &str) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
}

/// A gRPC message: the uncompressed flag, the big-endian length, the payload.
pub fn grpc_message(payload: &[u8]) -> Bytes {
    let len = u32::try_from(payload.len()).expect("a gRPC message under 4 GiB");
    let mut v = Vec::with_capacity(5 + payload.len());
    v.push(0);
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(payload);
    Bytes::from(v)
}

/// The JSON of an OpenAI error event `data: {"error":..}`; panics on anything else.
pub fn error_json(event: &str) -> serde_json::Value {
    let json = event.strip_prefix("data: ").expect("data event");
    let v: serde_json::Value = serde_json::from_str(json).expect("valid json");
    assert!(v.get("error").is_some(), "not an error event: {event}");
    v
}

/// Whether an SSE parser fed `bytes` (LF line ends) holds no partial event: they end at a
/// blank line, or after a comment line outside an event.
pub fn at_event_boundary(bytes: &[u8]) -> bool {
    if !(bytes.is_empty() || bytes.ends_with(b"\n")) {
        return false;
    }
    let mut in_event = false;
    for line in bytes.split(|b| *b == b'\n') {
        if line.is_empty() {
            in_event = false;
        } else if !line.starts_with(b":") {
            in_event = true;
        }
    }
    !in_event
}
