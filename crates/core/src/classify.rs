//! Classification of scanned events into tokens, meta events, keepalives, ends and errors.

use std::fmt;
use std::sync::Arc;

use crate::scan::{Captured, Event};

mod json;
mod junk;

use junk::{junk, junk_by_syntax};

/// What one event means for latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
    /// Junk: an event its dialect cannot carry, a protocol error. For the OpenAI and Anthropic
    /// presets, data that is not a JSON object (`data: this is not json`, `data: {{{{`, an
    /// object cut short) and not `[DONE]`: a client SDK fails to decode it. Never a token: an
    /// attempt that sends it before its first token failed, and a stream that sends it later
    /// is ended with an in-band error (by [`SseIdleTimeout`]) instead of passing it on.
    ///
    /// [`SseIdleTimeout`]: https://docs.rs/tailguard-timeout
    Malformed,
}

/// Decides the [`Class`] of each event.
///
/// `first_token_seen` is true once the stream has produced a token. The presets parse JSON only
/// while it is false and decide from syntax alone afterwards; a classifier of your own should do
/// the same: after the first token it sees only
/// [`capture_after_first_token`](Classify::capture_after_first_token) bytes of each event (and
/// [`Captured::last`], the last byte of the data that is not whitespace).
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
    /// The OpenAI Responses API's SSE (`event: response.*` names, no `[DONE]`).
    OpenAiResponsesSse,
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
    /// `content-type` (see [`Dialect`]; a type that is not a stream reads as
    /// [`Dialect::AnyByte`]), any other dialect as it is.
    pub fn resolve(&self, headers: &http::HeaderMap) -> Dialect {
        self.resolve_stream(headers).unwrap_or(Dialect::AnyByte)
    }

    /// Whether a response with `headers` is a stream, and in which dialect: under
    /// [`Dialect::Auto`], `text/event-stream` is [`Dialect::LlmSse`], `application/grpc*` is
    /// [`Dialect::Grpc`], `application/x-ndjson`, `application/ndjson` and `application/jsonl`
    /// are [`Dialect::Ndjson`], and any other (or no) `content-type` is `None`: not a stream. Any
    /// other dialect is configured, and so always `Some` of itself.
    ///
    /// This is the one content-type decision in tailguard: every layer that needs the dialect of
    /// a response asks here.
    pub fn resolve_stream(&self, headers: &http::HeaderMap) -> Option<Dialect> {
        let Dialect::Auto = self else {
            return Some(self.clone());
        };
        let ct = headers.get(http::header::CONTENT_TYPE)?.as_bytes();
        let essence = ct.split(|&b| b == b';').next()?.trim_ascii();
        let is = |name: &str| essence.eq_ignore_ascii_case(name.as_bytes());
        if is("text/event-stream") {
            Some(Dialect::LlmSse)
        } else if essence.len() >= 16 && essence[..16].eq_ignore_ascii_case(b"application/grpc") {
            Some(Dialect::Grpc)
        } else if is("application/x-ndjson") || is("application/ndjson") || is("application/jsonl")
        {
            Some(Dialect::Ndjson)
        } else {
            None
        }
    }

    /// The classifier of this dialect ([`Dialect::Auto`] stands for its SSE choice,
    /// [`Dialect::LlmSse`]).
    pub(crate) fn classifier(&self) -> &dyn Classify {
        match self {
            Dialect::Auto | Dialect::LlmSse => &LlmSseClassifier,
            Dialect::OpenAi => &OpenAiClassifier,
            Dialect::Anthropic => &AnthropicClassifier,
            Dialect::AnySse => &AnySseClassifier,
            Dialect::AnyByte => &AnyByteClassifier,
            Dialect::Grpc => &GrpcClassifier,
            Dialect::Ndjson => &NdjsonClassifier,
            Dialect::Custom { classifier, .. } => classifier.as_ref(),
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
/// (`choices: []`) and a finish chunk with an empty delta are meta; data that is not a JSON
/// object (it does not parse, is not UTF-8, is cut short, or is another JSON value) is
/// [`Class::Malformed`]. After the first token only the syntax is looked at: `[DONE]` is done,
/// data starting with `{"error"` is an error, data that begins as an object does (`{`, optional
/// whitespace, `"` or `}`) and ends with `}` is a token, any other data is malformed. That
/// check costs a few bytes per event, no copy and no parse: it catches text, braces that open
/// no member, other JSON values, empty data and an object cut short, and lets an object broken
/// only in its middle through.
/// `data: [DONE]` is done, a JSON `error` member or `event: error` is an error, comments are
/// keepalives. The Responses API's named events (`/v1/responses` with `stream: true`) are
/// decided from their name: `response.*.delta` is a token (`response.output_text.delta`,
/// `response.function_call_arguments.delta`, ...), `response.completed` and
/// `response.incomplete` are done, `response.failed` is an error, other `response.*` events are
/// meta; any of them but an error whose data is not an object is malformed.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenAiClassifier;

/// The [`Dialect::Anthropic`] classifier: Anthropic messages SSE, decided from the event name.
///
/// `content_block_delta` is a token, `ping` a keepalive, `message_start`,
/// `content_block_start`, `content_block_stop` and `message_delta` meta, `message_stop` done and
/// `error` an error. An event without a name is looked up by its JSON `type` before the first
/// token; other unknown events are meta. Any event but `ping` and `error` whose data is not a
/// JSON object is [`Class::Malformed`]: checked by a parse before the first token and by its
/// first and last bytes after it, as under [`OpenAiClassifier`].
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
                Some(class) => anthropic_named(class, data, first_token_seen),
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

/// `{` then optional whitespace then `"error"`.
fn starts_with_error(data: &[u8]) -> bool {
    match data.trim_ascii_start().split_first() {
        Some((b'{', rest)) => rest.trim_ascii_start().starts_with(b"\"error\""),
        _ => false,
    }
}

/// Whether the name is one of the OpenAI Responses API's stream events (`response.*`), and
/// its class: a `*.delta` carries output (text, refusal, reasoning, tool-call arguments, audio),
/// `response.completed` and `response.incomplete` end the answer, `response.failed` is an
/// error, and every other `response.*` event (`created`, `in_progress`, `output_item.added`,
/// the `*.done` summaries, ...) is meta.
pub(crate) fn responses_event(name: &[u8]) -> Option<Class> {
    let rest = name.strip_prefix(b"response.")?;
    Some(match rest {
        b"completed" | b"incomplete" => Class::Done,
        b"failed" => Class::Error,
        _ if rest.ends_with(b".delta") => Class::Token,
        _ => Class::Meta,
    })
}

fn openai(name: &[u8], data: &Captured<'_>, first_token_seen: bool) -> Class {
    if name == b"error" {
        Class::Error
    } else if let Some(class) = responses_event(name) {
        match class {
            Class::Error => class,
            _ if junk(data, first_token_seen) => Class::Malformed,
            _ => class,
        }
    } else if is_done(data.bytes) {
        Class::Done
    } else if first_token_seen || !data.is_complete() {
        // From the syntax alone.
        if starts_with_error(data.bytes) {
            Class::Error
        } else if junk_by_syntax(data) {
            Class::Malformed
        } else {
            Class::Token
        }
    } else {
        // A whole event before the first token: its JSON decides; data that is no object (or
        // not JSON at all) is junk.
        json::openai(data.bytes).unwrap_or_else(|| {
            if json::is_object(data.bytes) {
                // An object the chunk type refuses (a member given twice): nothing to say.
                Class::Meta
            } else {
                Class::Malformed
            }
        })
    }
}

fn anthropic(name: &[u8], data: &Captured<'_>, first_token_seen: bool) -> Class {
    if let Some(class) = anthropic_event(name) {
        return anthropic_named(class, data, first_token_seen);
    }
    if junk(data, first_token_seen) {
        return Class::Malformed;
    }
    if name.is_empty() && !first_token_seen && data.is_complete() {
        // No `type` or an unknown one: meta, as an unknown event.
        if let Some(class) = json::anthropic_type(data.bytes) {
            return class;
        }
    }
    Class::Meta
}

/// An event with one of Anthropic's names, of `class`: malformed when its data is junk, except
/// a keepalive (whose data no client reads) and an error (the upstream's own words, whatever
/// their shape).
fn anthropic_named(class: Class, data: &Captured<'_>, first_token_seen: bool) -> Class {
    match class {
        Class::Keepalive | Class::Error => class,
        _ if junk(data, first_token_seen) => Class::Malformed,
        _ => class,
    }
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
    // Malformed, or not an object: a line of output all the same.
    json::ndjson(data.bytes).unwrap_or(Class::Token)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sse<'a>(name: &'a [u8], data: &'a [u8]) -> Event<'a> {
        Event::Sse {
            name,
            data: Captured::whole(data),
        }
    }

    fn line(data: &[u8]) -> Event<'_> {
        Event::Line {
            data: Captured::whole(data),
        }
    }

    fn openai(data: &str, first: bool) -> Class {
        OpenAiClassifier.classify(&sse(b"", data.as_bytes()), first)
    }

    /// The oracle for an OpenAI data event before the first token: the documented decision,
    /// over a `serde_json::Value`.
    fn openai_oracle(bytes: &[u8]) -> Class {
        if bytes.trim_ascii_start().starts_with(b"[DONE]") {
            return Class::Done;
        }
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
            return Class::Malformed;
        };
        let Some(object) = value.as_object() else {
            return Class::Malformed;
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

    /// The oracle for an unnamed Anthropic event before the first token: its JSON `type`.
    fn anthropic_oracle(bytes: &[u8]) -> Class {
        let Some(value) = serde_json::from_slice::<serde_json::Value>(bytes)
            .ok()
            .filter(serde_json::Value::is_object)
        else {
            return if bytes.trim_ascii_start().starts_with(b"[DONE]") {
                Class::Meta
            } else {
                Class::Malformed
            };
        };
        value
            .get("type")
            .and_then(|t| t.as_str())
            .and_then(|t| anthropic_event(t.as_bytes()))
            .unwrap_or(Class::Meta)
    }

    /// The oracle for an NDJSON line before the first token.
    fn ndjson_oracle(bytes: &[u8]) -> Class {
        // The syntax rule that holds in both phases.
        if starts_with_error(bytes) {
            return Class::Error;
        }
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
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

    /// The OpenAI presets decide `data`, a whole data event before the first token, as the
    /// oracle does; and so do the Anthropic and NDJSON presets.
    fn same_as_value(data: &[u8]) -> Class {
        let shown = String::from_utf8_lossy(data);
        let class = OpenAiClassifier.classify(&sse(b"", data), false);
        assert_eq!(class, openai_oracle(data), "openai {shown:?}");
        assert_eq!(
            LlmSseClassifier.classify(&sse(b"", data), false),
            class,
            "llm sse {shown:?}"
        );
        same_as_value_anthropic_ndjson(data);
        class
    }

    /// The Anthropic preset decides `data` as an unnamed event, and the NDJSON preset as a
    /// line, before the first token, as their oracles do.
    fn same_as_value_anthropic_ndjson(data: &[u8]) {
        let shown = String::from_utf8_lossy(data);
        assert_eq!(
            AnthropicClassifier.classify(&sse(b"", data), false),
            anthropic_oracle(data),
            "anthropic {shown:?}"
        );
        assert_eq!(
            NdjsonClassifier.classify(&line(data), false),
            ndjson_oracle(data),
            "ndjson {shown:?}"
        );
    }

    #[test]
    fn anthropic_and_ndjson_classifiers_match_value_on_edge_cases() {
        for data in [
            r#"{"type":"ping"}"#,
            r#"{"type":"\u0070ing"}"#,
            r#"{"type":"something_new"}"#,
            r#"{"type":["ping"]}"#,
            r#"[{"type":"ping"}]"#,
            r#""ping""#,
            r#"{"type":"ping""#,
            r#"{"type":"ping"} x"#,
            r#"{"response":"","done":true}"#,
            r#"{"response":"\n","done":true}"#,
            r#"{"done":1}"#,
            r#"{"done":"true"}"#,
            r#"{"message":{"content":""},"done":true}"#,
            r#"{"message":{"content":"\u00e9"},"done":true}"#,
            r#"{"message":{"tool_calls":[{}]},"done":true}"#,
            r#"{"message":{"tool_calls":[]},"done":true}"#,
            r#"{"message":"content","done":true}"#,
            r#"{"message":[{"content":"a"}],"done":true}"#,
            r#"{"error":null,"done":true}"#,
            r#"{"error":false}"#,
            r#"[1]"#,
            r#"true"#,
            r#"{"done":true,}"#,
            "",
        ] {
            same_as_value_anthropic_ndjson(data.as_bytes());
        }
        same_as_value_anthropic_ndjson(b"{\"x\":\"\xff\",\"type\":\"ping\"}");
        same_as_value_anthropic_ndjson(b"{\"x\":\"\xff\",\"done\":true}");
    }

    #[test]
    fn classifier_matches_value_on_grammar_edges() {
        let token = r#""choices":[{"text":"a"}]"#;
        let nested = |depth: usize| {
            // The top-level object is one level, `choices`' array and its object two more.
            format!(
                "{{{token},\"x\":{}{}}}",
                "[".repeat(depth - 1),
                "]".repeat(depth - 1)
            )
        };
        assert_eq!(same_as_value(nested(127).as_bytes()), Class::Token);
        let long_key = format!("{{\"{}\":1,{token}}}", "\\u0063".repeat(30));
        same_as_value(long_key.as_bytes());
        for value in [
            "0",
            "-0",
            "01",
            "-01",
            "-",
            "1.",
            ".5",
            "1.5",
            "1e",
            "1e+",
            "1E-5",
            "1e+5",
            "+1",
            "1.5e308",
            "1e-400",
            "123456789012345678",
            "1234567890123456789",
            "12345678901234567890",
            "123456789012345678901234567890",
            "-9223372036854775808",
            "-9223372036854775809",
            "18446744073709551616",
            "1-2",
            "1e5e5",
            "0x10",
            "null",
            "nul",
            "nulll",
            "True",
            "true",
            "false",
            "fals",
            r#""\ud83d\ude00""#,
            r#""\ud83d\""#,
            r#""\u12""#,
            r#""\u12g4""#,
            r#""\x""#,
            r#""\/\b\f\r\t""#,
            "\"a\tb\"",
            "\"a\u{7f}b\"",
            "\"\u{e9}\"",
            "\"a",
            "[1,]",
            "[,1]",
            "[1 2]",
            "{}",
            "[]",
            " [ ] ",
        ] {
            for doc in [
                format!("{{\"x\":{value},{token}}}"),
                format!("{{\"choices\":[{{\"text\":{value}}}]}}"),
                format!("{{\"choices\":[{{\"delta\":{{\"content\":{value}}}}}]}}"),
                format!("{{\"type\":{value},\"response\":{value},\"done\":true}}"),
                value.to_owned(),
            ] {
                same_as_value(doc.as_bytes());
            }
        }
        for doc in [
            "{1:2}",
            r#"{"a" 1}"#,
            r#"{"a":1 "b":2}"#,
            r#"{"a":1,}"#,
            r#"{,"a":1}"#,
            "{\"choices\":[{\"text\":\"a\"}]}\u{c}",
            "\t\r\n{\"choices\":[{\"text\":\"a\"}]}\t\r\n",
            r#"{"choices":[{"text":"a"}]}{}"#,
            r#"{"content\u0000":1}"#,
            r#"{"\u0063ontent":"x"}"#,
            r#"{"choices":[{"delta":{"\u0063ontent":"x"}}]}"#,
            r#"{"choices":[{"delta":{"content\u0000":"x"}}]}"#,
        ] {
            same_as_value(doc.as_bytes());
        }
    }

    #[test]
    fn escaped_strings_count_as_output() {
        for data in [
            r#"{"choices":[{"delta":{"content":"\n"}}]}"#,
            r#"{"choices":[{"delta":{"content":"\u00e9"}}]}"#,
            r#"{"choices":[{"delta":{"content":"\""}}]}"#,
            r#"{"choices":[{"text":"\ud83d\ude00"}]}"#,
        ] {
            assert_eq!(same_as_value(data.as_bytes()), Class::Token, "{data}");
        }
        let data = br#"{"message":{"content":"\t"},"done":true}"#;
        assert_eq!(NdjsonClassifier.classify(&line(data), false), Class::Token);
    }

    /// Where the classifier and a `serde_json::Value` part: serde_json checks a number's range,
    /// a string's surrogates and the nesting depth only in the values it builds, so a value the
    /// decision skips (or reads the raw text of) is read by JSON's grammar alone; and a derived
    /// type refuses a member it reads given twice, where a `Value` keeps the last, so the level
    /// that holds it says nothing.
    #[test]
    fn serde_types_skip_unread_values_by_grammar_and_refuse_read_duplicates() {
        let token = r#""choices":[{"text":"a"}]"#;
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let huge = "9".repeat(400);
        for x in [
            "1e400",
            "1.8e308",
            "-1.8e308",
            huge.as_str(),
            deep.as_str(),
            r#""\ud83d""#,
            r#""\ude00""#,
            r#""\ud83d\u0041""#,
        ] {
            let data = format!("{{\"x\":{x},{token}}}");
            assert_eq!(openai(&data, false), Class::Token, "{data}");
        }
        for data in [
            r#"{"choices":[{"delta":{"content":"\ud800"}}]}"#,
            r#"{"choices":[{"text":"\ud83d\ud83d\ude00"}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[1e400]}}]}"#,
        ] {
            assert_eq!(openai(data, false), Class::Token, "{data}");
        }
        let unnamed = |data: &str| AnthropicClassifier.classify(&sse(b"", data.as_bytes()), false);
        let ndjson = |data: &str| NdjsonClassifier.classify(&line(data.as_bytes()), false);
        assert_eq!(unnamed(r#"{"x":1e400,"type":"ping"}"#), Class::Keepalive);
        assert_eq!(ndjson(r#"{"response":1.8e308,"done":true}"#), Class::Done);

        for (data, want) in [
            (r#"{"error":null,"error":0}"#, Class::Meta),
            (
                r#"{"error":{"m":1},"error":null,"choices":[{"text":"a"}]}"#,
                Class::Meta,
            ),
            (r#"{"choices":[],"choices":[{"text":"a"}]}"#, Class::Meta),
            (r#"{"choices":[{"text":"","text":"a"}]}"#, Class::Meta),
            (
                r#"{"choices":[{"delta":{"content":"","content":"a"}}]}"#,
                Class::Meta,
            ),
            (
                r#"{"choices":[{"delta":{},"delta":{"content":"a"}}]}"#,
                Class::Meta,
            ),
            // Only the choice that holds the duplicate says nothing.
            (
                r#"{"choices":[{"text":"a","text":"a"},{"text":"b"}]}"#,
                Class::Token,
            ),
            // Members nobody reads may repeat.
            (
                r#"{"id":1,"id":2,"choices":[{"index":0,"index":0,"text":"a"}]}"#,
                Class::Token,
            ),
        ] {
            assert_eq!(openai(data, false), want, "{data}");
        }
        assert_eq!(
            unnamed(r#"{"type":"content_block_delta","type":"message_stop"}"#),
            Class::Meta
        );
        assert_eq!(unnamed(r#"{"type":5,"type":"ping"}"#), Class::Meta);
        for data in [
            r#"{"done":false,"done":true}"#,
            r#"{"response":"a","done":true,"response":""}"#,
            r#"{"message":{"content":"a"},"message":{},"done":true}"#,
        ] {
            assert_eq!(ndjson(data), Class::Token, "{data}");
        }
        assert_eq!(
            ndjson(r#"{"message":{"content":"a","content":""},"done":true}"#),
            Class::Done
        );
        // A line that starts with an `error` member is an error from its first bytes.
        assert_eq!(ndjson(r#"{"error":"boom","error":null}"#), Class::Error);
    }

    #[test]
    fn classifier_matches_value_on_edge_cases() {
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(200), "]".repeat(200));
        let deep_ok = format!("{{\"x\":{}{}}}", "[".repeat(100), "]".repeat(100));
        for (data, want) in [
            (
                r#"{"choices":[{"delta":{"content":"","refusal":"no"}}]}"#,
                Class::Token,
            ),
            (
                r#"{"choices":[{"delta":{"tool_calls":[{}]}}]}"#,
                Class::Token,
            ),
            (r#"{"choices":[{"delta":{"tool_calls":[]}}]}"#, Class::Meta),
            (
                r#"{"choices":[{"delta":{"function_call":{"a":1}}}]}"#,
                Class::Token,
            ),
            (r#"{"choices":[{"delta":{"content":7}}]}"#, Class::Meta),
            (r#"{"choices":[1,"a",null,[],{"text":"x"}]}"#, Class::Token),
            (r#"{"choices":{"0":{"text":"x"}}}"#, Class::Meta),
            (r#"{"choices":[{"delta":"content"}]}"#, Class::Meta),
            // Escaped names and values.
            (r#"{"\u0063hoices":[{"text":"\u0041"}]}"#, Class::Token),
            (r#"{"\u0065rror":"x"}"#, Class::Error),
            // Not an object, malformed, trailing bytes, bad escapes.
            (r#"[{"choices":[{"text":"a"}]}]"#, Class::Malformed),
            (r#""x""#, Class::Malformed),
            (r#"{"choices":[{"text":"a"}]} x"#, Class::Malformed),
            (r#"{"choices":[{"text":"a"}]}  "#, Class::Token),
            (r#"{"choices":[{"text":"a"}],}"#, Class::Malformed),
            (r#"{"choices":[{"text":"\q"}]}"#, Class::Malformed),
            (r#"{"x":-0.5e-3,"choices":[{"text":"a"}]}"#, Class::Token),
            (r#"{"choices":[{"text":"a"}]"#, Class::Malformed),
            ("", Class::Malformed),
            (deep_ok.as_str(), Class::Meta),
        ] {
            assert_eq!(same_as_value(data.as_bytes()), want, "{data}");
        }
        // Deeper than serde_json's `Value` goes (so no oracle): an object all the same (a
        // client's parser takes it), with nothing to say.
        assert_eq!(openai(&deep, false), Class::Meta);
        // Invalid UTF-8 in a string nobody reads is still malformed.
        assert_eq!(
            same_as_value(b"{\"x\":\"\xff\",\"choices\":[{\"text\":\"a\"}]}"),
            Class::Malformed
        );
    }

    fn json_value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null"),
            Just("true"),
            Just("0"),
            Just("-2.5e3"),
            Just("\"\""),
            Just("\"x\""),
            Just("\"\\u0041\""),
            Just("false"),
            Just("\"ping\""),
            Just("\"content_block_delta\""),
            Just("\"\\u0070ing\""),
            Just("[]"),
            Just("{}"),
        ]
        .prop_map(String::from);
        leaf.prop_recursive(5, 48, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec((json_key(), inner), 0..5).prop_map(|mut members| {
                    // Each name once (see the test of duplicates above for the rest).
                    let mut seen = Vec::new();
                    members.retain(|(k, _)| {
                        let name = k.replace("\\u0065", "e").replace("\\u0074", "t");
                        let new = !seen.contains(&name);
                        seen.push(name);
                        new
                    });
                    let members: Vec<String> = members
                        .iter()
                        .map(|(k, v)| format!("\"{k}\":{v}"))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    fn json_key() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "choices",
            "delta",
            "text",
            "content",
            "error",
            "tool_calls",
            "refusal",
            "reasoning",
            "reasoning_content",
            "function_call",
            "\\u0065rror",
            "type",
            "done",
            "response",
            "message",
            "\\u0074ype",
            "x",
        ])
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        #[test]
        fn classifier_matches_value_on_json_ish_bytes(
            bytes in prop::collection::vec(
                prop::sample::select(b"{}[]\",:\\u0123456789abcdefABCDEF.eE+- \t\nnulrsx\xc3\xa9".to_vec()),
                0..48,
            ),
        ) {
            same_as_value(&bytes);
        }

        #[test]
        fn classifier_matches_value(doc in json_value(), cut in 0usize..64, byte in 0u8..128) {
            same_as_value(doc.as_bytes());
            // And on damaged documents: a byte replaced, and the document cut short.
            let mut bytes = doc.clone().into_bytes();
            if !bytes.is_empty() {
                let at = cut % bytes.len();
                bytes[at] = byte;
                same_as_value(&bytes);
                same_as_value(&doc.as_bytes()[..at]);
            }
        }
    }

    /// Typical chunks of each dialect (vLLM / llama.cpp / hosted API / Anthropic / Ollama
    /// shapes) before the first token.
    #[test]
    fn typical_chunks_before_the_first_token() {
        let openai: [(&str, Class); 16] = [
            (
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1718000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
                Class::Meta,
            ),
            (
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1718000000,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}"#,
                Class::Token,
            ),
            (
                r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}"#,
                Class::Token,
            ),
            (
                r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"reasoning_content":"Let me think"}}]}"#,
                Class::Token,
            ),
            (
                r#"{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null}]}"#,
                Class::Token,
            ),
            (
                r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}"#,
                Class::Meta,
            ),
            (
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"total_tokens":40,"completion_tokens":28,"prompt_tokens_details":{"cached_tokens":0}}}"#,
                Class::Meta,
            ),
            (
                r#"{"error":{"message":"The server is overloaded","type":"server_error","param":null,"code":503}}"#,
                Class::Error,
            ),
            (
                r#"{"object":"error","message":"x","error":null,"choices":[{"delta":{"content":null}}]}"#,
                Class::Meta,
            ),
            ("[DONE]", Class::Done),
            // Escapes.
            (
                r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"\n"}}]}"#,
                Class::Token,
            ),
            (
                r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"\u00e9t\u00e9 \ud83d\ude00"}}]}"#,
                Class::Token,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": \"Paris\"}"}}]}}]}"#,
                Class::Token,
            ),
            (
                r#"{"\u0063hoices":[{"delta":{"\u0063ontent":"x"}}]}"#,
                Class::Token,
            ),
            // Numbers other than short integers.
            (
                r#"{"choices":[{"delta":{"role":"assistant"},"logprobs":{"content":[{"token":"a","logprob":-0.0123,"bytes":[97],"top_logprobs":[]}]}}],"x":12345678901234567890123,"y":1.5e300}"#,
                Class::Meta,
            ),
            (
                r#"{"id":"chatcmpl-1","choices":[{"delta""#,
                Class::Malformed,
            ),
        ];
        for (data, want) in openai {
            assert_eq!(same_as_value(data.as_bytes()), want, "{data}");
        }

        // Anthropic events, named (decided from the name) and unnamed (decided from `type`).
        let anthropic: [(&str, &str, Class); 7] = [
            (
                "message_start",
                r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude","stop_reason":null,"usage":{"input_tokens":25,"output_tokens":1}}}"#,
                Class::Meta,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
                Class::Meta,
            ),
            ("ping", r#"{"type": "ping"}"#, Class::Keepalive),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
                Class::Token,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#,
                Class::Meta,
            ),
            (
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                Class::Error,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_\u0064elta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Par"}}"#,
                Class::Token,
            ),
        ];
        for (name, data, want) in anthropic {
            for event in [
                sse(name.as_bytes(), data.as_bytes()),
                sse(b"", data.as_bytes()),
            ] {
                assert_eq!(
                    AnthropicClassifier.classify(&event, false),
                    want,
                    "{name} {data}"
                );
            }
            let named = sse(name.as_bytes(), data.as_bytes());
            assert_eq!(
                LlmSseClassifier.classify(&named, false),
                want,
                "{name} {data}"
            );
        }

        // NDJSON (Ollama) lines.
        let ndjson: [(&str, Class); 5] = [
            (
                r#"{"model":"m","created_at":"2024-06-10T00:00:00Z","response":"Hi","done":false}"#,
                Class::Token,
            ),
            (
                r#"{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":123,"eval_count":9}"#,
                Class::Done,
            ),
            (
                r#"{"model":"m","message":{"role":"assistant","content":"Hi"},"done":false}"#,
                Class::Token,
            ),
            (r#"{"model":"m","error":"model not found"}"#, Class::Error),
            ("not json", Class::Token),
        ];
        for (data, want) in ndjson {
            assert_eq!(
                NdjsonClassifier.classify(&line(data.as_bytes()), false),
                want,
                "{data}"
            );
        }
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
            r#"{"error":null,"choices":[]}"#,
        ] {
            assert_eq!(openai(data, false), Class::Meta, "{data}");
        }
        // Junk: an object cut short, text, another JSON value, nothing.
        for data in [
            r#"{"id":"x","object":"chat.completion.chunk","#,
            r#"not json"#,
            r#"{{{{"#,
            r#"[1,2]"#,
            r#""#,
        ] {
            assert_eq!(openai(data, false), Class::Malformed, "{data}");
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
                last: Some(b'}'),
            },
        };
        assert_eq!(OpenAiClassifier.classify(&prefix, true), Class::Token);
        // An incomplete capture before the first token is never parsed either.
        assert_eq!(OpenAiClassifier.classify(&prefix, false), Class::Token);
    }

    /// Data captured as the tracker does after the first token: a 16-byte prefix, the full
    /// length, the last byte.
    fn after_token(data: &[u8]) -> Event<'_> {
        Event::Sse {
            name: b"",
            data: Captured::whole(data).limited(16),
        }
    }

    #[test]
    fn junk_is_malformed_before_and_after_the_first_token() {
        let cut_short = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o","#;
        for data in [
            "this is not json at all",
            "{{{{",
            "{",
            "",
            "   ",
            "[1,2]",
            "\"text\"",
            "42",
            cut_short,
            r#"{"choices":[{"delta":{"content":"x"}}]} trailing"#,
        ] {
            let bytes = data.as_bytes();
            for classifier in [&OpenAiClassifier as &dyn Classify, &LlmSseClassifier] {
                assert_eq!(
                    classifier.classify(&sse(b"", bytes), false),
                    Class::Malformed,
                    "{data:?}"
                );
                assert_eq!(
                    classifier.classify(&after_token(bytes), true),
                    Class::Malformed,
                    "{data:?}"
                );
            }
            // Anthropic: unnamed events, and every named one but `ping` and `error`.
            assert_eq!(
                AnthropicClassifier.classify(&sse(b"", bytes), false),
                Class::Malformed,
                "{data:?}"
            );
            for name in [
                &b"content_block_delta"[..],
                b"message_start",
                b"message_stop",
                b"something_new",
            ] {
                for first in [false, true] {
                    let event = Event::Sse {
                        name,
                        data: Captured::whole(bytes).limited(if first { 16 } else { usize::MAX }),
                    };
                    assert_eq!(
                        AnthropicClassifier.classify(&event, first),
                        Class::Malformed,
                        "{data:?}"
                    );
                    if name != b"something_new" {
                        assert_eq!(
                            LlmSseClassifier.classify(&event, first),
                            Class::Malformed,
                            "{data:?}"
                        );
                    }
                }
            }
        }
        // Not junk: `[DONE]`, pings and errors whatever their data, the upstream's own error
        // object, a chunk seen by its prefix and last byte, whitespace around an object.
        let chunk = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"delta":{"content":"x"}}]}"#;
        assert_eq!(
            OpenAiClassifier.classify(&after_token(chunk.as_bytes()), true),
            Class::Token
        );
        assert_eq!(
            OpenAiClassifier.classify(&after_token(b" { \"a\":1 } "), true),
            Class::Token
        );
        assert_eq!(
            OpenAiClassifier.classify(&after_token(b"{}"), true),
            Class::Token
        );
        assert_eq!(
            OpenAiClassifier.classify(&after_token(b"[DONE]"), true),
            Class::Done
        );
        assert_eq!(
            OpenAiClassifier.classify(&after_token(br#"{"error":{"message":"x"}}"#), true),
            Class::Error
        );
        assert_eq!(
            OpenAiClassifier.classify(&sse(b"error", b"overloaded"), true),
            Class::Error
        );
        assert_eq!(
            AnthropicClassifier.classify(&sse(b"ping", b""), true),
            Class::Keepalive
        );
        assert_eq!(
            AnthropicClassifier.classify(&sse(b"error", b"overloaded"), false),
            Class::Error
        );
        assert_eq!(
            AnthropicClassifier.classify(&sse(b"", b"[DONE]"), false),
            Class::Meta
        );
        // The Responses API's events: junk but for `response.failed`.
        assert_eq!(
            OpenAiClassifier.classify(&sse(b"response.output_text.delta", b"{{"), true),
            Class::Malformed
        );
        assert_eq!(
            OpenAiClassifier.classify(&sse(b"response.failed", b"{{"), true),
            Class::Error
        );
        // An object broken only in its middle passes the cheap check after the first token
        // (the parse before it catches it).
        let middle = br#"{"choices":[{"delta":{"content":"x"}}],,"x":1}"#;
        assert_eq!(
            OpenAiClassifier.classify(&after_token(middle), true),
            Class::Token
        );
        assert_eq!(
            OpenAiClassifier.classify(&sse(b"", middle), false),
            Class::Malformed
        );
        // A prefix of whitespace only says nothing.
        let spaces = format!("{}{{\"a\":1}}", " ".repeat(20));
        assert_eq!(
            OpenAiClassifier.classify(&after_token(spaces.as_bytes()), true),
            Class::Token
        );
        // Other presets carry anything.
        assert_eq!(
            AnySseClassifier.classify(&sse(b"", b"{{{{"), false),
            Class::Token
        );
        assert_eq!(
            NdjsonClassifier.classify(&line(b"{{{{"), false),
            Class::Token
        );
    }

    #[test]
    fn comments_are_keepalives_everywhere() {
        let comment = Event::Comment {
            text: Captured::whole(b" keepalive"),
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
            Class::Malformed
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
            data: Captured::whole(b""),
        };
        assert_eq!(GrpcClassifier.classify(&msg, false), Class::Token);
    }

    #[test]
    fn ndjson_lines() {
        let line = |s: &'static str| Event::Line {
            data: Captured::whole(s.as_bytes()),
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

    /// The first `content-type` value decides, in a small head (names compared) as in a large
    /// one (the map's lookup).
    #[test]
    fn auto_resolves_from_the_first_content_type_of_small_and_large_heads() {
        for others in [0, 3, 20] {
            let mut h = http::HeaderMap::new();
            for i in 0..others {
                h.insert(
                    http::HeaderName::from_bytes(format!("x-h{i}").as_bytes()).unwrap(),
                    http::HeaderValue::from_static("v"),
                );
            }
            h.append(
                http::header::CONTENT_TYPE,
                "text/event-stream".parse().unwrap(),
            );
            h.append(
                http::header::CONTENT_TYPE,
                "application/grpc".parse().unwrap(),
            );
            assert_eq!(
                format!("{:?}", Dialect::Auto.resolve(&h)),
                "LlmSse",
                "{others}"
            );
        }
    }
}
