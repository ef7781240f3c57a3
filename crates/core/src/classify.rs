//! Classification of scanned events into tokens, meta events, keepalives, ends and errors.

use std::fmt;
use std::sync::Arc;

use crate::scan::Event;

/// What one event means for latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Carries output: text, reasoning, a tool-call delta, a refusal, a gRPC message.
    Token,
    /// Protocol bookkeeping that carries no output: a role-only delta, a usage-only chunk, a
    /// finish chunk with an empty delta, `message_start`.
    Meta,
    /// Keeps the connection alive and says nothing about progress: SSE comments, `event: ping`.
    Keepalive,
    /// The stream says it is complete: `data: [DONE]`, `message_stop`.
    Done,
    /// An in-band error event.
    Error,
}

/// Decides the [`Class`] of each event.
///
/// `first_token_seen` is true once the stream has produced a token. The presets parse JSON only
/// while it is false and decide from syntax alone afterwards; a classifier of your own should do
/// the same to keep the steady state cheap. After the first token the scanner captures only
/// [`capture_after_first_token`](Classify::capture_after_first_token) bytes of each event.
///
/// Any `Fn(&Event<'_>, bool) -> Class + Send + Sync` closure is a classifier.
pub trait Classify: Send + Sync + 'static {
    /// The class of `event`.
    fn classify(&self, event: &Event<'_>, first_token_seen: bool) -> Class;

    /// How many bytes of each event's data to capture once the first token was seen
    /// (default 16: enough to tell `[DONE]` and `{"error"` from anything else).
    fn capture_after_first_token(&self) -> usize {
        16
    }
}

impl<F> Classify for F
where
    F: Fn(&Event<'_>, bool) -> Class + Send + Sync + 'static,
{
    fn classify(&self, event: &Event<'_>, first_token_seen: bool) -> Class {
        self(event, first_token_seen)
    }
}

/// The framing of a response body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Framing {
    /// Server-sent events (`text/event-stream`).
    Sse,
    /// gRPC length-prefixed messages (`application/grpc`).
    Grpc,
    /// Newline-delimited JSON (`application/x-ndjson`, `application/jsonl`).
    Ndjson,
    /// Anything else: every non-empty run of bytes is an event.
    Bytes,
}

/// How a layer finds tokens in response bodies: a preset, or a classifier of the user's own.
///
/// [`Dialect::Auto`] (the default) decides per response from its `content-type`:
/// `text/event-stream` → [`Dialect::LlmSse`], `application/grpc*` → [`Dialect::Grpc`],
/// `application/x-ndjson` / `application/jsonl` → [`Dialect::Ndjson`], anything else (e.g. a
/// non-streamed JSON completion) → [`Dialect::AnyByte`], whose first body byte is the first token.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Dialect {
    /// Choose per response from `content-type` (see above).
    #[default]
    Auto,
    /// OpenAI, and OpenAI or Anthropic recognised per event: events named like Anthropic's
    /// (`message_start`, `content_block_delta`, `ping`, ...) follow [`Dialect::Anthropic`], all
    /// others [`Dialect::OpenAi`]. The right choice for a gateway in front of mixed servers.
    LlmSse,
    /// OpenAI chat and completions SSE (vLLM, llama.cpp, TGI, hosted APIs).
    OpenAi,
    /// Anthropic messages SSE.
    Anthropic,
    /// Any SSE data event is a token; comments are keepalives.
    AnySse,
    /// Any non-empty body bytes are a token.
    AnyByte,
    /// gRPC: every message is a token.
    Grpc,
    /// NDJSON: every non-empty line is a token, except a line with an `error` key (error) or
    /// `"done": true` and no output (done).
    Ndjson,
    /// A framing with a classifier of the user's own.
    Custom {
        /// How to split the body into events.
        framing: Framing,
        /// How to classify each event.
        classifier: Arc<dyn Classify>,
    },
}

impl Dialect {
    /// A custom dialect from a framing and a classifier.
    pub fn custom(framing: Framing, classifier: impl Classify) -> Self {
        Dialect::Custom {
            framing,
            classifier: Arc::new(classifier),
        }
    }
}

impl fmt::Debug for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dialect::Auto => f.write_str("Auto"),
            Dialect::LlmSse => f.write_str("LlmSse"),
            Dialect::OpenAi => f.write_str("OpenAi"),
            Dialect::Anthropic => f.write_str("Anthropic"),
            Dialect::AnySse => f.write_str("AnySse"),
            Dialect::AnyByte => f.write_str("AnyByte"),
            Dialect::Grpc => f.write_str("Grpc"),
            Dialect::Ndjson => f.write_str("Ndjson"),
            Dialect::Custom { framing, .. } => f
                .debug_struct("Custom")
                .field("framing", framing)
                .finish_non_exhaustive(),
        }
    }
}

/// The wire dialect a stream turned out to speak, for rendering a terminal error in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Wire {
    /// OpenAI-style SSE (`data: {...}` then `data: [DONE]`).
    OpenAiSse,
    /// Anthropic-style SSE (`event: ...` names).
    AnthropicSse,
    /// SSE of no known dialect.
    Sse,
    /// gRPC.
    Grpc,
    /// NDJSON.
    Ndjson,
    /// Anything else.
    Opaque,
}
