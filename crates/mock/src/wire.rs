//! The bytes of each dialect: SSE events for OpenAI chat / completions and Anthropic
//! messages, gRPC length-prefixed messages, and the error bodies.
//!
//! Shapes follow the captured streams in `testdata/fixtures/` (compact JSON as llmock and the
//! hosted APIs send it).

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::json;
use tailguard_core::Wire;
use tailguard_core::render::{ErrorInfo, GrpcCode, grpc_trailers, in_band, openai_json};

use crate::grpc::GenerateResponse;

/// `created` timestamp of every mock chunk (fixed, so output is reproducible).
const CREATED: u64 = 1_796_053_661;

/// The words the mock "generates", in turn.
const WORDS: &[&str] = &[
    "Hello",
    " there",
    ",",
    " this",
    " is",
    " a",
    " mock",
    " reply",
    " from",
    " tailguard",
    ".",
    "\n",
];

/// Text of token `i` (0-based).
pub(crate) fn token_text(i: u32) -> &'static str {
    WORDS[i as usize % WORDS.len()]
}

/// The whole text of `n` tokens.
pub(crate) fn full_text(n: u32) -> String {
    (0..n).map(token_text).collect()
}

/// The API a request speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    Chat,
    Completions,
    Anthropic,
    Grpc,
}

/// Per-request parameters of the event builders.
#[derive(Clone, Debug)]
pub(crate) struct Ctx {
    pub(crate) api: Api,
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) include_usage: bool,
    pub(crate) tool_calls: bool,
    pub(crate) prompt_tokens: u64,
    /// `"length"` when `max_tokens` cut the script short, else `"stop"` (or `"tool_calls"`).
    pub(crate) truncated: bool,
}

fn sse_data(v: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn sse_event(name: &str, v: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
}

/// `data: [DONE]`.
pub(crate) const DONE: &[u8] = b"data: [DONE]\n\n";
/// The OpenAI-style keepalive comment.
pub(crate) const KEEPALIVE_COMMENT: &[u8] = b": keepalive\n\n";
/// Anthropic's keepalive.
pub(crate) const PING: &[u8] = b"event: ping\ndata: {\"type\":\"ping\"}\n\n";

impl Ctx {
    fn usage_field(&self) -> serde_json::Value {
        if self.include_usage {
            serde_json::Value::Null
        } else {
            serde_json::Value::Bool(false) // marker: removed below
        }
    }

    fn chat_chunk(&self, delta: serde_json::Value, finish: Option<&str>) -> Bytes {
        let mut v = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": self.model,
            "system_fingerprint": null,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            "usage": self.usage_field(),
        });
        if !self.include_usage {
            if let Some(o) = v.as_object_mut() {
                o.remove("usage");
            }
        }
        sse_data(&v)
    }

    fn completion_chunk(&self, text: &str, finish: Option<&str>) -> Bytes {
        let mut v = json!({
            "id": self.id,
            "object": "text_completion",
            "created": CREATED,
            "model": self.model,
            "system_fingerprint": null,
            "choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": finish}],
            "usage": self.usage_field(),
        });
        if !self.include_usage {
            if let Some(o) = v.as_object_mut() {
                o.remove("usage");
            }
        }
        sse_data(&v)
    }

    fn finish_reason(&self) -> &'static str {
        if self.truncated {
            "length"
        } else if self.tool_calls && self.api == Api::Chat {
            "tool_calls"
        } else {
            "stop"
        }
    }

    /// Events that precede the first token (they are meta, never tokens).
    pub(crate) fn preamble(&self) -> Vec<Bytes> {
        match self.api {
            Api::Chat => {
                let delta = if self.tool_calls {
                    json!({"role": "assistant", "content": null})
                } else {
                    json!({"role": "assistant"})
                };
                vec![self.chat_chunk(delta, None)]
            }
            Api::Completions | Api::Grpc => Vec::new(),
            Api::Anthropic => vec![
                sse_event(
                    "message_start",
                    &json!({"type": "message_start", "message": {
                        "id": self.id, "type": "message", "role": "assistant", "content": [],
                        "model": self.model, "stop_reason": null, "stop_sequence": null,
                        "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 1}}}),
                ),
                sse_event(
                    "content_block_start",
                    &json!({"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": ""}}),
                ),
                Bytes::from_static(PING),
            ],
        }
    }

    /// Token `i` (0-based).
    pub(crate) fn token(&self, i: u32) -> Bytes {
        let text = token_text(i);
        match self.api {
            Api::Chat if self.tool_calls => {
                let call = if i == 0 {
                    json!({"index": 0, "id": format!("call_{}", self.id), "type": "function",
                        "function": {"name": "get_weather", "arguments": text}})
                } else {
                    json!({"index": 0, "function": {"arguments": text}})
                };
                self.chat_chunk(json!({"tool_calls": [call]}), None)
            }
            Api::Chat => self.chat_chunk(json!({"content": text}), None),
            Api::Completions => self.completion_chunk(text, None),
            Api::Anthropic => sse_event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": text}}),
            ),
            Api::Grpc => grpc_frame(&GenerateResponse {
                text: text.to_owned(),
                index: i,
                finish_reason: None,
            }),
        }
    }

    /// Events after the last token of a completed stream (`n` tokens sent).
    pub(crate) fn epilogue(&self, n: u32) -> Vec<Bytes> {
        let usage = json!({"prompt_tokens": self.prompt_tokens, "completion_tokens": n,
            "total_tokens": self.prompt_tokens + u64::from(n)});
        match self.api {
            Api::Chat | Api::Completions => {
                let mut out = Vec::with_capacity(3);
                out.push(if self.api == Api::Chat {
                    self.chat_chunk(json!({}), Some(self.finish_reason()))
                } else {
                    self.completion_chunk("", Some(self.finish_reason()))
                });
                if self.include_usage {
                    let object = if self.api == Api::Chat {
                        "chat.completion.chunk"
                    } else {
                        "text_completion"
                    };
                    out.push(sse_data(&json!({
                        "id": self.id, "object": object, "created": CREATED,
                        "model": self.model, "system_fingerprint": null,
                        "choices": [], "usage": usage,
                    })));
                }
                out.push(Bytes::from_static(DONE));
                out
            }
            Api::Anthropic => vec![
                sse_event(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": 0}),
                ),
                sse_event(
                    "message_delta",
                    &json!({"type": "message_delta",
                        "delta": {"stop_reason": if self.truncated { "max_tokens" } else { "end_turn" },
                            "stop_sequence": null},
                        "usage": {"output_tokens": n}}),
                ),
                sse_event("message_stop", &json!({"type": "message_stop"})),
            ],
            Api::Grpc => vec![grpc_frame(&GenerateResponse {
                text: String::new(),
                index: n,
                finish_reason: Some(self.finish_reason().to_owned()),
            })],
        }
    }

    /// The keepalive of this dialect (`None` for gRPC).
    pub(crate) fn keepalive(&self) -> Option<Bytes> {
        match self.api {
            Api::Chat | Api::Completions => Some(Bytes::from_static(KEEPALIVE_COMMENT)),
            Api::Anthropic => Some(Bytes::from_static(PING)),
            Api::Grpc => None,
        }
    }

    /// The in-band error that ends a stream (SSE bytes; gRPC uses [`grpc_error_trailers`]).
    pub(crate) fn error_event(&self) -> Option<Bytes> {
        let wire = match self.api {
            Api::Chat | Api::Completions => Wire::OpenAiSse,
            Api::Anthropic => Wire::AnthropicSse,
            Api::Grpc => return None,
        };
        in_band(wire, &upstream_error_info())
    }

    /// The non-streamed response body.
    pub(crate) fn non_streamed(&self, n: u32) -> Bytes {
        let text = full_text(n);
        let usage = json!({"prompt_tokens": self.prompt_tokens, "completion_tokens": n,
            "total_tokens": self.prompt_tokens + u64::from(n)});
        let v = match self.api {
            Api::Chat => json!({
                "id": self.id, "object": "chat.completion", "created": CREATED,
                "model": self.model, "system_fingerprint": null,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                    "logprobs": null, "finish_reason": self.finish_reason()}],
                "usage": usage,
            }),
            Api::Completions => json!({
                "id": self.id, "object": "text_completion", "created": CREATED,
                "model": self.model, "system_fingerprint": null,
                "choices": [{"text": text, "index": 0, "logprobs": null,
                    "finish_reason": self.finish_reason()}],
                "usage": usage,
            }),
            Api::Anthropic | Api::Grpc => json!({
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [{"type": "text", "text": text}],
                "stop_reason": if self.truncated { "max_tokens" } else { "end_turn" },
                "stop_sequence": null,
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": n},
            }),
        };
        Bytes::from(v.to_string())
    }
}

/// The error the mock reports in-band and in 500s.
pub(crate) fn upstream_error_info() -> ErrorInfo {
    ErrorInfo::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "mock upstream error",
        "server_error",
        "mock_error",
    )
}

/// The error body of a scripted HTTP status, in the route's dialect.
pub(crate) fn error_body(api: Api, status: StatusCode) -> Bytes {
    let mut info = ErrorInfo::new(
        status,
        format!("mock upstream answered {}", status.as_u16()),
        match status.as_u16() {
            429 => "rate_limit_exceeded",
            503 | 529 => "server_overloaded",
            _ => "server_error",
        },
        "mock_status",
    );
    if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS {
        info.kind = "invalid_request_error";
    }
    match api {
        Api::Anthropic => Bytes::from(
            json!({"type": "error", "error": {"type": info.anthropic_kind, "message": info.message}})
                .to_string(),
        ),
        _ => openai_json(&info),
    }
}

/// The gRPC code a scripted HTTP status maps to.
pub(crate) fn grpc_code_for(status: StatusCode) -> u16 {
    match status.as_u16() {
        400 => 3,
        401 => 16,
        403 => 7,
        404 => 12,
        408 | 504 => u16::from(GrpcCode::DeadlineExceeded.as_u8()),
        429 => u16::from(GrpcCode::ResourceExhausted.as_u8()),
        500 => u16::from(GrpcCode::Internal.as_u8()),
        502..=503 => u16::from(GrpcCode::Unavailable.as_u8()),
        _ => 2,
    }
}

/// gRPC `grpc-status: 0` trailers.
pub(crate) fn grpc_ok_trailers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("grpc-status", HeaderValue::from_static("0"));
    h
}

/// Trailers of the in-band gRPC error: `grpc-status: 13`.
pub(crate) fn grpc_error_trailers() -> HeaderMap {
    grpc_trailers(GrpcCode::Internal, "mock upstream error")
}

/// One gRPC length-prefixed, uncompressed message.
pub(crate) fn grpc_frame<M: prost::Message>(m: &M) -> Bytes {
    let len = m.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    // Encoding into a buffer with enough capacity cannot fail.
    let _ = m.encode(&mut buf);
    buf.freeze()
}
