//! Classification of scanned events into tokens, meta events, keepalives, ends and errors.

use std::fmt;
use std::sync::Arc;

use crate::scan::{Captured, Event};

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

impl Dialect {
    /// The dialect to use for a response with `headers`: [`Dialect::Auto`] resolved from the
    /// `content-type` (see [`Dialect`]), any other dialect as it is.
    pub fn resolve(&self, headers: &http::HeaderMap) -> Dialect {
        match self {
            Dialect::Auto => {
                let ct = headers
                    .get(http::header::CONTENT_TYPE)
                    .map(|v| v.as_bytes())
                    .unwrap_or_default();
                let essence = ct
                    .split(|&b| b == b';')
                    .next()
                    .unwrap_or_default()
                    .trim_ascii();
                if essence.eq_ignore_ascii_case(b"text/event-stream") {
                    Dialect::LlmSse
                } else if essence.len() >= 16
                    && essence[..16].eq_ignore_ascii_case(b"application/grpc")
                {
                    Dialect::Grpc
                } else if essence.eq_ignore_ascii_case(b"application/x-ndjson")
                    || essence.eq_ignore_ascii_case(b"application/jsonl")
                {
                    Dialect::Ndjson
                } else {
                    Dialect::AnyByte
                }
            }
            other => other.clone(),
        }
    }

    /// The framing of this dialect (`None` for [`Dialect::Auto`], which depends on the response).
    pub fn framing(&self) -> Option<Framing> {
        match self {
            Dialect::Auto => None,
            Dialect::LlmSse | Dialect::OpenAi | Dialect::Anthropic | Dialect::AnySse => {
                Some(Framing::Sse)
            }
            Dialect::AnyByte => Some(Framing::Bytes),
            Dialect::Grpc => Some(Framing::Grpc),
            Dialect::Ndjson => Some(Framing::Ndjson),
            Dialect::Custom { framing, .. } => Some(*framing),
        }
    }
}

/// The [`Dialect::OpenAi`] classifier: OpenAI chat and completions SSE.
///
/// Before the first token the event's JSON is parsed: a token is a choice with non-empty
/// `delta.content`, `text`, `delta.reasoning_content` / `delta.reasoning`, `delta.tool_calls`,
/// `delta.refusal` (or a legacy `delta.function_call`); a role-only delta, a usage-only chunk
/// (`choices: []`) and a finish chunk with an empty delta are meta; JSON that does not parse is
/// meta (undecidable, never a crash). After the first token only the syntax is looked at:
/// `[DONE]` is done, data starting with `{"error"` is an error, any other data is a token.
/// `data: [DONE]` is done, a JSON `error` member or `event: error` is an error, comments are
/// keepalives.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenAiClassifier;

/// The [`Dialect::Anthropic`] classifier: Anthropic messages SSE, decided from the event name.
///
/// `content_block_delta` is a token, `ping` a keepalive, `message_start`,
/// `content_block_start`, `content_block_stop` and `message_delta` meta, `message_stop` done and
/// `error` an error. An event without a name is looked up by its JSON `type` before the first
/// token; other unknown events are meta.
#[derive(Clone, Copy, Debug, Default)]
pub struct AnthropicClassifier;

/// The [`Dialect::LlmSse`] classifier: [`AnthropicClassifier`] for events named like
/// Anthropic's, [`OpenAiClassifier`] for all others.
#[derive(Clone, Copy, Debug, Default)]
pub struct LlmSseClassifier;

/// The [`Dialect::AnySse`] classifier: every SSE data event is a token, comments keepalives.
#[derive(Clone, Copy, Debug, Default)]
pub struct AnySseClassifier;

/// The [`Dialect::AnyByte`] classifier: every event (in practice every non-empty run of body
/// bytes) is a token.
#[derive(Clone, Copy, Debug, Default)]
pub struct AnyByteClassifier;

/// The [`Dialect::Grpc`] classifier: every message is a token.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcClassifier;

/// The [`Dialect::Ndjson`] classifier: every line is a token, except a line with an `error`
/// member (error) and a line with `"done": true` and no output (done).
///
/// Before the first token the JSON is parsed; afterwards a line starting with `{"error"` is an
/// error and a line containing `"done":true` (or `"done": true`) is done. It keeps capturing
/// whole lines after the first token to find that member.
#[derive(Clone, Copy, Debug, Default)]
pub struct NdjsonClassifier;

impl Classify for OpenAiClassifier {
    fn classify(&self, event: &Event<'_>, first_token_seen: bool) -> Class {
        match event {
            Event::Sse { name, data } => openai(name, data, first_token_seen),
            other => fallback(other, first_token_seen),
        }
    }
}

impl Classify for AnthropicClassifier {
    fn classify(&self, event: &Event<'_>, first_token_seen: bool) -> Class {
        match event {
            Event::Sse { name, data } => anthropic(name, data, first_token_seen),
            other => fallback(other, first_token_seen),
        }
    }
}

impl Classify for LlmSseClassifier {
    fn classify(&self, event: &Event<'_>, first_token_seen: bool) -> Class {
        match event {
            Event::Sse { name, data } if name.is_empty() => openai(name, data, first_token_seen),
            Event::Sse { name, data } => match anthropic_event(name) {
                Some(class) => class,
                None => openai(name, data, first_token_seen),
            },
            other => fallback(other, first_token_seen),
        }
    }
}

impl Classify for AnySseClassifier {
    fn classify(&self, event: &Event<'_>, first_token_seen: bool) -> Class {
        fallback(event, first_token_seen)
    }
}

impl Classify for AnyByteClassifier {
    fn classify(&self, event: &Event<'_>, first_token_seen: bool) -> Class {
        fallback(event, first_token_seen)
    }
}

impl Classify for GrpcClassifier {
    fn classify(&self, event: &Event<'_>, first_token_seen: bool) -> Class {
        fallback(event, first_token_seen)
    }
}

impl Classify for NdjsonClassifier {
    fn classify(&self, event: &Event<'_>, first_token_seen: bool) -> Class {
        match event {
            Event::Line { data } => ndjson(data, first_token_seen),
            other => fallback(other, first_token_seen),
        }
    }

    fn capture_after_first_token(&self) -> usize {
        usize::MAX
    }
}

/// Comments are keepalives, NDJSON lines follow the NDJSON rules, everything else is a token.
fn fallback(event: &Event<'_>, first_token_seen: bool) -> Class {
    match event {
        Event::Comment { .. } => Class::Keepalive,
        Event::Line { data } => ndjson(data, first_token_seen),
        _ => Class::Token,
    }
}

/// Whether the name is one of Anthropic's event names, and its class.
pub(crate) fn anthropic_event(name: &[u8]) -> Option<Class> {
    Some(match name {
        b"content_block_delta" => Class::Token,
        b"ping" => Class::Keepalive,
        b"message_start" | b"content_block_start" | b"content_block_stop" | b"message_delta" => {
            Class::Meta
        }
        b"message_stop" => Class::Done,
        b"error" => Class::Error,
        _ => return None,
    })
}

fn is_done(data: &[u8]) -> bool {
    data.trim_ascii_start().starts_with(b"[DONE]")
}

/// The class of an OpenAI-style data event from its first bytes only: `[DONE]` is done, `{"error"`
/// an error, anything else a token.
#[inline]
fn openai_syntax(data: &[u8]) -> Class {
    let data = data.trim_ascii_start();
    match data.first() {
        Some(b'{') if data[1..].trim_ascii_start().starts_with(b"\"error\"") => Class::Error,
        Some(b'[') if data.starts_with(b"[DONE]") => Class::Done,
        _ => Class::Token,
    }
}

/// `{` then optional whitespace then `"error"`.
fn starts_with_error(data: &[u8]) -> bool {
    match data.trim_ascii_start().split_first() {
        Some((b'{', rest)) => rest.trim_ascii_start().starts_with(b"\"error\""),
        _ => false,
    }
}

#[inline]
fn openai(name: &[u8], data: &Captured<'_>, first_token_seen: bool) -> Class {
    if name == b"error" {
        Class::Error
    } else if first_token_seen || !data.is_complete() {
        openai_syntax(data.bytes)
    } else {
        openai_json(data)
    }
}

/// Before the first token: the whole event's JSON decides.
#[inline(never)]
fn openai_json(data: &Captured<'_>) -> Class {
    if is_done(data.bytes) {
        return Class::Done;
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data.bytes) else {
        // Malformed or cut short: undecidable, so not a token.
        return Class::Meta;
    };
    let Some(object) = value.as_object() else {
        return Class::Meta;
    };
    if object.get("error").is_some_and(|e| !e.is_null()) {
        return Class::Error;
    }
    let has_token = object
        .get("choices")
        .and_then(|c| c.as_array())
        .is_some_and(|choices| choices.iter().any(choice_has_output));
    if has_token { Class::Token } else { Class::Meta }
}

fn choice_has_output(choice: &serde_json::Value) -> bool {
    if non_empty(choice.get("text")) {
        return true;
    }
    let Some(delta) = choice.get("delta") else {
        return false;
    };
    [
        "content",
        "reasoning_content",
        "reasoning",
        "tool_calls",
        "refusal",
        "function_call",
    ]
    .iter()
    .any(|key| non_empty(delta.get(key)))
}

fn non_empty(value: Option<&serde_json::Value>) -> bool {
    match value {
        Some(serde_json::Value::String(s)) => !s.is_empty(),
        Some(serde_json::Value::Array(a)) => !a.is_empty(),
        Some(serde_json::Value::Object(o)) => !o.is_empty(),
        _ => false,
    }
}

fn anthropic(name: &[u8], data: &Captured<'_>, first_token_seen: bool) -> Class {
    if let Some(class) = anthropic_event(name) {
        return class;
    }
    if name.is_empty() && !first_token_seen && data.is_complete() {
        let typ = serde_json::from_slice::<serde_json::Value>(data.bytes)
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned));
        if let Some(class) = typ.and_then(|t| anthropic_event(t.as_bytes())) {
            return class;
        }
    }
    Class::Meta
}

fn ndjson(data: &Captured<'_>, first_token_seen: bool) -> Class {
    if starts_with_error(data.bytes) {
        return Class::Error;
    }
    if first_token_seen || !data.is_complete() {
        let done = memchr::memmem::find(data.bytes, b"\"done\":true").is_some()
            || memchr::memmem::find(data.bytes, b"\"done\": true").is_some();
        return if done { Class::Done } else { Class::Token };
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data.bytes) else {
        return Class::Token;
    };
    if value.get("error").is_some_and(|e| !e.is_null()) {
        return Class::Error;
    }
    let done = value.get("done").and_then(|d| d.as_bool()) == Some(true);
    if !done {
        return Class::Token;
    }
    let output = non_empty(value.get("response"))
        || value
            .get("message")
            .is_some_and(|m| non_empty(m.get("content")) || non_empty(m.get("tool_calls")));
    if output { Class::Token } else { Class::Done }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sse<'a>(name: &'a [u8], data: &'a [u8]) -> Event<'a> {
        Event::Sse {
            name,
            data: Captured {
                bytes: data,
                len: data.len(),
            },
        }
    }

    fn openai(data: &str, first: bool) -> Class {
        OpenAiClassifier.classify(&sse(b"", data.as_bytes()), first)
    }

    #[test]
    fn openai_tokens() {
        for data in [
            r#"{"choices":[{"delta":{"content":"Hi"}}]}"#,
            r#"{"choices":[{"text":" the","index":0}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":"hmm"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"refusal":"no"}}]}"#,
            r#"{"choices":[{"delta":{}},{"delta":{"content":"second choice"}}]}"#,
        ] {
            assert_eq!(openai(data, false), Class::Token, "{data}");
        }
    }

    #[test]
    fn openai_meta() {
        for data in [
            r#"{"choices":[{"delta":{"role":"assistant"}}]}"#,
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"delta":{"role":"assistant","content":null}}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":12}}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"text":"","finish_reason":"length"}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[]}}]}"#,
            r#"{"id":"x","object":"chat.completion.chunk","#,
            r#"not json"#,
            r#"[1,2]"#,
            r#""#,
            r#"{"error":null,"choices":[]}"#,
        ] {
            assert_eq!(openai(data, false), Class::Meta, "{data}");
        }
    }

    #[test]
    fn openai_done_and_errors() {
        assert_eq!(openai("[DONE]", false), Class::Done);
        assert_eq!(openai("[DONE]", true), Class::Done);
        assert_eq!(openai(" [DONE] ", true), Class::Done);
        let err = r#"{"error":{"message":"overloaded","type":"server_error"}}"#;
        assert_eq!(openai(err, false), Class::Error);
        assert_eq!(openai(err, true), Class::Error);
        assert_eq!(openai(r#"{ "error" : {}}"#, true), Class::Error);
        assert_eq!(
            OpenAiClassifier.classify(&sse(b"error", b"{}"), true),
            Class::Error
        );
    }

    #[test]
    fn openai_after_first_token_decides_from_syntax() {
        // Meta before the first token, token after: JSON is not parsed any more.
        let finish = r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#;
        assert_eq!(openai(finish, false), Class::Meta);
        assert_eq!(openai(finish, true), Class::Token);
        // A captured prefix is enough.
        let prefix = Event::Sse {
            name: b"",
            data: Captured {
                bytes: br#"{"id":"chatcmpl-"#,
                len: 300,
            },
        };
        assert_eq!(OpenAiClassifier.classify(&prefix, true), Class::Token);
        // An incomplete capture before the first token is never parsed either.
        assert_eq!(OpenAiClassifier.classify(&prefix, false), Class::Token);
    }

    #[test]
    fn comments_are_keepalives_everywhere() {
        let comment = Event::Comment {
            text: Captured {
                bytes: b" keepalive",
                len: 10,
            },
        };
        let presets: [&dyn Classify; 7] = [
            &OpenAiClassifier,
            &AnthropicClassifier,
            &LlmSseClassifier,
            &AnySseClassifier,
            &AnyByteClassifier,
            &GrpcClassifier,
            &NdjsonClassifier,
        ];
        for c in presets {
            assert_eq!(c.classify(&comment, false), Class::Keepalive);
            assert_eq!(c.classify(&comment, true), Class::Keepalive);
        }
    }

    #[test]
    fn anthropic_by_event_name() {
        let cases: [(&[u8], Class); 8] = [
            (b"message_start", Class::Meta),
            (b"content_block_start", Class::Meta),
            (b"ping", Class::Keepalive),
            (b"content_block_delta", Class::Token),
            (b"content_block_stop", Class::Meta),
            (b"message_delta", Class::Meta),
            (b"message_stop", Class::Done),
            (b"error", Class::Error),
        ];
        for (name, class) in cases {
            for first in [false, true] {
                assert_eq!(
                    AnthropicClassifier.classify(&sse(name, b"{}"), first),
                    class
                );
                assert_eq!(LlmSseClassifier.classify(&sse(name, b"{}"), first), class);
            }
        }
        // Without a name, the JSON type decides before the first token.
        let unnamed = sse(b"", br#"{"type":"content_block_delta","delta":{}}"#);
        assert_eq!(AnthropicClassifier.classify(&unnamed, false), Class::Token);
        assert_eq!(
            AnthropicClassifier.classify(&sse(b"", b"{broken"), false),
            Class::Meta
        );
        assert_eq!(
            AnthropicClassifier.classify(&sse(b"something_new", b"{}"), false),
            Class::Meta
        );
    }

    #[test]
    fn llm_sse_falls_back_to_openai() {
        let data = br#"{"choices":[{"delta":{"content":"x"}}]}"#;
        assert_eq!(
            LlmSseClassifier.classify(&sse(b"", data), false),
            Class::Token
        );
        assert_eq!(
            LlmSseClassifier.classify(&sse(b"message", b"[DONE]"), true),
            Class::Done
        );
    }

    #[test]
    fn any_sse_any_byte_grpc() {
        assert_eq!(
            AnySseClassifier.classify(&sse(b"", b""), false),
            Class::Token
        );
        assert_eq!(
            AnyByteClassifier.classify(&Event::Bytes { len: 1 }, false),
            Class::Token
        );
        let msg = Event::Grpc {
            compressed: false,
            data: Captured { bytes: b"", len: 0 },
        };
        assert_eq!(GrpcClassifier.classify(&msg, false), Class::Token);
    }

    #[test]
    fn ndjson_lines() {
        let line = |s: &'static str| Event::Line {
            data: Captured {
                bytes: s.as_bytes(),
                len: s.len(),
            },
        };
        let c = NdjsonClassifier;
        assert_eq!(
            c.classify(&line(r#"{"response":"Hi","done":false}"#), false),
            Class::Token
        );
        assert_eq!(
            c.classify(&line(r#"{"response":"","done":true}"#), false),
            Class::Done
        );
        assert_eq!(
            c.classify(&line(r#"{"message":{"content":""},"done": true}"#), true),
            Class::Done
        );
        assert_eq!(
            c.classify(&line(r#"{"error":"boom"}"#), false),
            Class::Error
        );
        assert_eq!(c.classify(&line(r#"{"error":"boom"}"#), true), Class::Error);
        assert_eq!(c.classify(&line("garbage"), false), Class::Token);
        assert_eq!(c.capture_after_first_token(), usize::MAX);
    }

    #[test]
    fn closures_are_classifiers() {
        let c = |e: &Event<'_>, _first: bool| match e {
            Event::Line { .. } => Class::Token,
            _ => Class::Meta,
        };
        assert_eq!(c.classify(&sse(b"", b""), false), Class::Meta);
        assert_eq!(c.capture_after_first_token(), 16);
        let dialect = Dialect::custom(Framing::Ndjson, c);
        assert_eq!(dialect.framing(), Some(Framing::Ndjson));
        assert!(format!("{dialect:?}").contains("Ndjson"));
    }

    #[test]
    fn auto_resolves_from_content_type() {
        let resolve = |ct: Option<&str>| {
            let mut h = http::HeaderMap::new();
            if let Some(ct) = ct {
                h.insert(http::header::CONTENT_TYPE, ct.parse().unwrap());
            }
            format!("{:?}", Dialect::Auto.resolve(&h))
        };
        assert_eq!(resolve(Some("text/event-stream")), "LlmSse");
        assert_eq!(resolve(Some("Text/Event-Stream; charset=utf-8")), "LlmSse");
        assert_eq!(resolve(Some("application/grpc")), "Grpc");
        assert_eq!(resolve(Some("application/grpc+proto")), "Grpc");
        assert_eq!(resolve(Some("application/x-ndjson")), "Ndjson");
        assert_eq!(resolve(Some("application/jsonl")), "Ndjson");
        assert_eq!(resolve(Some("application/json")), "AnyByte");
        assert_eq!(resolve(None), "AnyByte");
        let h = http::HeaderMap::new();
        assert_eq!(format!("{:?}", Dialect::OpenAi.resolve(&h)), "OpenAi");
        assert_eq!(Dialect::Auto.framing(), None);
        assert_eq!(Dialect::Anthropic.framing(), Some(Framing::Sse));
    }
}
