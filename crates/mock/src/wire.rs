//! The bytes of each dialect: SSE events for OpenAI chat / completions and Anthropic
//! messages (the OpenAI Responses API's in [`crate::responses`]), gRPC length-prefixed
//! messages, and the error bodies.
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
pub(crate) const CREATED: u64 = 1_796_053_661;
/// The same instant as Ollama writes it.
const OLLAMA_CREATED_AT: &str = "2026-12-01T10:27:41Z";

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
    /// OpenAI Responses API (`/v1/responses`, named `response.*` events).
    Responses,
    Grpc,
    /// Ollama `/api/generate` (NDJSON, `response` field).
    OllamaGenerate,
    /// Ollama `/api/chat` (NDJSON, `message.content`).
    OllamaChat,
}

impl Api {
    pub(crate) fn is_ollama(self) -> bool {
        matches!(self, Api::OllamaGenerate | Api::OllamaChat)
    }
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
    /// Tokens of the answer before this response (a continuation request's prefix).
    pub(crate) offset: u32,
}

/// JSON text. The mock writes its events with keys in the order real servers send them (`id`
/// first); `serde_json`'s own map would sort them.
#[derive(Clone, Debug)]
pub(crate) struct J(pub(crate) String);

impl J {
    pub(crate) fn null() -> J {
        J("null".to_owned())
    }

    /// `[a,b,..]`.
    pub(crate) fn arr(items: impl IntoIterator<Item = J>) -> J {
        let items: Vec<String> = items.into_iter().map(|j| j.0).collect();
        J(format!("[{}]", items.join(",")))
    }

    /// Adds a key to an object.
    pub(crate) fn with(mut self, key: &str, value: impl Into<J>) -> J {
        self.0.pop();
        if self.0.len() > 1 {
            self.0.push(',');
        }
        self.0.push_str(&J::from(key).0);
        self.0.push(':');
        self.0.push_str(&value.into().0);
        self.0.push('}');
        self
    }
}

impl From<&str> for J {
    fn from(s: &str) -> J {
        // Serialising a string cannot fail.
        J(serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned()))
    }
}

impl From<&String> for J {
    fn from(s: &String) -> J {
        J::from(s.as_str())
    }
}

impl From<Option<&str>> for J {
    fn from(s: Option<&str>) -> J {
        s.map_or_else(J::null, J::from)
    }
}

impl From<u64> for J {
    fn from(n: u64) -> J {
        J(n.to_string())
    }
}

impl From<u32> for J {
    fn from(n: u32) -> J {
        J(n.to_string())
    }
}

/// `{"k":v,...}` with keys in the order written.
macro_rules! obj {
    ($($k:literal : $v:expr),* $(,)?) => {{
        #[allow(unused_mut)]
        let mut o = J("{}".to_owned());
        $( o = o.with($k, $v); )*
        o
    }};
}
pub(crate) use obj;

fn sse_data(v: &J) -> Bytes {
    Bytes::from(format!("data: {}\n\n", v.0))
}

pub(crate) fn sse_event(name: &str, v: &J) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {}\n\n", v.0))
}

/// `data: [DONE]`.
pub(crate) const DONE: &[u8] = b"data: [DONE]\n\n";
/// The OpenAI-style keepalive comment.
pub(crate) const KEEPALIVE_COMMENT: &[u8] = b": keepalive\n\n";
/// Anthropic's keepalive.
pub(crate) const PING: &[u8] = b"event: ping\ndata: {\"type\":\"ping\"}\n\n";

impl Ctx {
    /// With `include_usage`, OpenAI puts `"usage": null` in every chunk but the last.
    fn with_usage_null(&self, v: J) -> Bytes {
        if self.include_usage {
            sse_data(&v.with("usage", J::null()))
        } else {
            sse_data(&v)
        }
    }

    fn head(&self, object: &str) -> J {
        obj! {
            "id": &self.id,
            "object": object,
            "created": CREATED,
            "model": &self.model,
            "system_fingerprint": J::null(),
        }
    }

    fn chat_chunk(&self, delta: J, finish: Option<&str>) -> Bytes {
        let choice =
            obj! {"index": 0u32, "delta": delta, "logprobs": J::null(), "finish_reason": finish};
        self.with_usage_null(
            self.head("chat.completion.chunk")
                .with("choices", J::arr([choice])),
        )
    }

    fn completion_chunk(&self, text: &str, finish: Option<&str>) -> Bytes {
        let choice =
            obj! {"text": text, "index": 0u32, "logprobs": J::null(), "finish_reason": finish};
        self.with_usage_null(
            self.head("text_completion")
                .with("choices", J::arr([choice])),
        )
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

    fn stop_reason(&self) -> &'static str {
        if self.truncated {
            "max_tokens"
        } else {
            "end_turn"
        }
    }

    fn usage(&self, n: u32) -> J {
        obj! {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": n,
            "total_tokens": self.prompt_tokens + u64::from(n),
        }
    }

    /// One Ollama NDJSON line.
    fn ollama_line(&self, text: &str, done: Option<u32>) -> Bytes {
        let mut o = obj! {"model": &self.model, "created_at": OLLAMA_CREATED_AT};
        o = if self.api == Api::OllamaChat {
            o.with("message", obj! {"role": "assistant", "content": text})
        } else {
            o.with("response", text)
        };
        o = match done {
            None => o.with("done", J("false".to_owned())),
            Some(n) => o
                .with("done", J("true".to_owned()))
                .with(
                    "done_reason",
                    if self.truncated { "length" } else { "stop" },
                )
                .with("prompt_eval_count", self.prompt_tokens)
                .with("eval_count", n),
        };
        Bytes::from(format!("{}\n", o.0))
    }

    /// Events that precede the first token (they are meta, never tokens).
    pub(crate) fn preamble(&self) -> Vec<Bytes> {
        match self.api {
            Api::Chat => {
                let delta = if self.tool_calls {
                    obj! {"role": "assistant", "content": J::null()}
                } else {
                    obj! {"role": "assistant"}
                };
                vec![self.chat_chunk(delta, None)]
            }
            Api::Completions | Api::Grpc | Api::OllamaGenerate | Api::OllamaChat => Vec::new(),
            Api::Responses => self.responses_preamble(),
            Api::Anthropic => vec![
                sse_event(
                    "message_start",
                    &obj! {"type": "message_start", "message": obj! {
                        "id": &self.id, "type": "message", "role": "assistant",
                        "content": J::arr([]), "model": &self.model,
                        "stop_reason": J::null(), "stop_sequence": J::null(),
                        "usage": obj! {"input_tokens": self.prompt_tokens, "output_tokens": 1u32},
                    }},
                ),
                sse_event(
                    "content_block_start",
                    &obj! {"type": "content_block_start", "index": 0u32,
                    "content_block": obj! {"type": "text", "text": ""}},
                ),
                Bytes::from_static(PING),
            ],
        }
    }

    /// Token `i` (0-based).
    pub(crate) fn token(&self, i: u32) -> Bytes {
        let text = self.text(i);
        match self.api {
            Api::Chat if self.tool_calls => {
                let call = if i == 0 {
                    obj! {"index": 0u32, "id": &format!("call_{}", self.id), "type": "function",
                    "function": obj! {"name": "get_weather", "arguments": text}}
                } else {
                    obj! {"index": 0u32, "function": obj! {"arguments": text}}
                };
                self.chat_chunk(obj! {"tool_calls": J::arr([call])}, None)
            }
            Api::Chat => self.chat_chunk(obj! {"content": text}, None),
            Api::Completions => self.completion_chunk(text, None),
            Api::Anthropic => sse_event(
                "content_block_delta",
                &obj! {"type": "content_block_delta", "index": 0u32,
                "delta": obj! {"type": "text_delta", "text": text}},
            ),
            Api::Responses => self.responses_token(i),
            Api::Grpc => grpc_frame(&GenerateResponse {
                text: text.to_owned(),
                index: i,
                finish_reason: None,
            }),
            Api::OllamaGenerate | Api::OllamaChat => self.ollama_line(text, None),
        }
    }

    /// Events after the last token of a completed stream (`n` tokens sent).
    pub(crate) fn epilogue(&self, n: u32) -> Vec<Bytes> {
        match self.api {
            Api::Chat | Api::Completions => {
                let mut out = Vec::with_capacity(3);
                let object = if self.api == Api::Chat {
                    out.push(self.chat_chunk(obj! {}, Some(self.finish_reason())));
                    "chat.completion.chunk"
                } else {
                    out.push(self.completion_chunk("", Some(self.finish_reason())));
                    "text_completion"
                };
                if self.include_usage {
                    out.push(sse_data(
                        &self
                            .head(object)
                            .with("choices", J::arr([]))
                            .with("usage", self.usage(n)),
                    ));
                }
                out.push(Bytes::from_static(DONE));
                out
            }
            Api::Anthropic => vec![
                sse_event(
                    "content_block_stop",
                    &obj! {"type": "content_block_stop", "index": 0u32},
                ),
                sse_event(
                    "message_delta",
                    &obj! {"type": "message_delta",
                    "delta": obj! {"stop_reason": self.stop_reason(), "stop_sequence": J::null()},
                    "usage": obj! {"output_tokens": n}},
                ),
                sse_event("message_stop", &obj! {"type": "message_stop"}),
            ],
            Api::Responses => self.responses_epilogue(n),
            Api::Grpc => vec![grpc_frame(&GenerateResponse {
                text: String::new(),
                index: n,
                finish_reason: Some(self.finish_reason().to_owned()),
            })],
            Api::OllamaGenerate | Api::OllamaChat => vec![self.ollama_line("", Some(n))],
        }
    }

    /// The keepalive of this dialect (`None` for gRPC).
    pub(crate) fn keepalive(&self) -> Option<Bytes> {
        match self.api {
            Api::Chat | Api::Completions | Api::Responses => {
                Some(Bytes::from_static(KEEPALIVE_COMMENT))
            }
            Api::Anthropic => Some(Bytes::from_static(PING)),
            Api::Grpc | Api::OllamaGenerate | Api::OllamaChat => None,
        }
    }

    /// The in-band error that ends a stream (SSE bytes; gRPC uses [`grpc_error_trailers`]).
    pub(crate) fn error_event(&self) -> Option<Bytes> {
        let wire = match self.api {
            Api::Chat | Api::Completions => Wire::OpenAiSse,
            Api::Anthropic => Wire::AnthropicSse,
            Api::Responses => return Some(self.responses_error(&upstream_error_info())),
            // Ollama's own shape: `{"error":"..."}`.
            Api::OllamaGenerate | Api::OllamaChat => {
                return Some(Bytes::from(format!(
                    "{}\n",
                    obj! {"error": upstream_error_info().message.as_ref()}.0
                )));
            }
            Api::Grpc => return None,
        };
        in_band(wire, &upstream_error_info())
    }

    /// The non-streamed response body.
    pub(crate) fn non_streamed(&self, n: u32) -> Bytes {
        let text = self.text_of(n);
        let v = match self.api {
            Api::Chat => self
                .head("chat.completion")
                .with(
                    "choices",
                    J::arr([obj! {"index": 0u32,
                    "message": obj! {"role": "assistant", "content": &text},
                    "logprobs": J::null(), "finish_reason": self.finish_reason()}]),
                )
                .with("usage", self.usage(n)),
            Api::Completions => self
                .head("text_completion")
                .with(
                    "choices",
                    J::arr([obj! {"text": &text, "index": 0u32, "logprobs": J::null(),
                    "finish_reason": self.finish_reason()}]),
                )
                .with("usage", self.usage(n)),
            Api::Responses => self.response_object("completed", &text, n),
            Api::OllamaGenerate | Api::OllamaChat => {
                let line = self.ollama_line(&text, Some(n));
                return line.slice(..line.len() - 1);
            }
            Api::Anthropic | Api::Grpc => obj! {
                "id": &self.id, "type": "message", "role": "assistant", "model": &self.model,
                "content": J::arr([obj! {"type": "text", "text": &text}]),
                "stop_reason": self.stop_reason(), "stop_sequence": J::null(),
                "usage": obj! {"input_tokens": self.prompt_tokens, "output_tokens": n},
            },
        };
        Bytes::from(v.0)
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
        Api::OllamaGenerate | Api::OllamaChat => {
            Bytes::from(obj! {"error": info.message.as_ref()}.0)
        }
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
