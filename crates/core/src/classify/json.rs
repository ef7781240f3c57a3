//! The JSON the presets read before the first token, parsed by serde_json into types that hold
//! only the members a decision needs, borrowed from the event.
//!
//! Each level is parsed on its own from the raw text of the level above (`&RawValue`) and only
//! when it is a JSON object, as a `serde_json::Value` would be looked into: a member of an
//! unexpected type says nothing, it does not make the whole document undecidable. A document
//! that serde_json does not parse at all (not UTF-8, malformed, cut short) decides nothing, and
//! neither does an object in which a member its type reads is given twice (serde's derived
//! types refuse it).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{Class, anthropic_event};

/// What an OpenAI chunk is, from its JSON: `None` when it does not parse or is not an object.
///
/// A (non-`null`) `error` member makes it an error; a choice with output a token; anything
/// else meta.
pub(super) fn openai(bytes: &[u8]) -> Option<Class> {
    let chunk: OpenAiChunk<'_> = object(std::str::from_utf8(bytes).ok()?)?;
    if chunk.error.is_some() {
        return Some(Class::Error);
    }
    let choices: Vec<&RawValue> = chunk
        .choices
        .and_then(|choices| serde_json::from_str(choices.get()).ok())
        .unwrap_or_default();
    let token = choices
        .into_iter()
        .any(|choice| member::<Choice<'_>>(Some(choice)).is_some_and(|c| c.has_output()));
    Some(if token { Class::Token } else { Class::Meta })
}

/// Whether `bytes` is one whole JSON object (UTF-8, syntax checked, nothing after it): what
/// the OpenAI and Anthropic dialects carry in an event's data. Members are not looked at.
pub(super) fn is_object(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_ok_and(|text| object::<serde::de::IgnoredAny>(text).is_some())
}

/// The class the JSON `type` of an Anthropic event names: `None` when the document does not
/// parse, is not an object, or its `type` is not a string naming an Anthropic event.
pub(super) fn anthropic_type(bytes: &[u8]) -> Option<Class> {
    let event: AnthropicEvent<'_> = object(std::str::from_utf8(bytes).ok()?)?;
    anthropic_event(event.kind.as_bytes())
}

/// What an NDJSON line (Ollama's `/api/generate` and `/api/chat`) is, from its JSON: `None`
/// when it does not parse or is not an object.
///
/// A (non-`null`) `error` member makes it an error; `"done": true` without output (a non-empty
/// `response`, or a `message` with a non-empty `content` or `tool_calls`) done; anything else a
/// token.
pub(super) fn ndjson(bytes: &[u8]) -> Option<Class> {
    let line: NdjsonLine<'_> = object(std::str::from_utf8(bytes).ok()?)?;
    if line.error.is_some() {
        return Some(Class::Error);
    }
    let done = line.done.is_some_and(|done| done.get() == "true");
    let output = non_empty(line.response)
        || member::<Message<'_>>(line.message).is_some_and(|m| m.has_output());
    Some(if done && !output {
        Class::Done
    } else {
        Class::Token
    })
}

/// An OpenAI chat or completions chunk.
#[derive(Deserialize)]
struct OpenAiChunk<'a> {
    #[serde(borrow)]
    error: Option<&'a RawValue>,
    #[serde(borrow)]
    choices: Option<&'a RawValue>,
}

/// One of a chunk's `choices`.
#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow)]
    text: Option<&'a RawValue>,
    #[serde(borrow)]
    delta: Option<&'a RawValue>,
}

impl Choice<'_> {
    /// A non-empty `text`, or a `delta` with a non-empty member that carries output.
    fn has_output(&self) -> bool {
        non_empty(self.text) || member::<Delta<'_>>(self.delta).is_some_and(|d| d.has_output())
    }
}

/// The members of a choice's `delta` that carry output.
#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(borrow)]
    reasoning: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_calls: Option<&'a RawValue>,
    #[serde(borrow)]
    refusal: Option<&'a RawValue>,
    #[serde(borrow)]
    function_call: Option<&'a RawValue>,
}

impl Delta<'_> {
    fn has_output(&self) -> bool {
        [
            self.content,
            self.reasoning_content,
            self.reasoning,
            self.tool_calls,
            self.refusal,
            self.function_call,
        ]
        .into_iter()
        .any(non_empty)
    }
}

/// An Anthropic event's data.
#[derive(Deserialize)]
struct AnthropicEvent<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
}

/// An NDJSON line.
#[derive(Deserialize)]
struct NdjsonLine<'a> {
    #[serde(borrow)]
    error: Option<&'a RawValue>,
    #[serde(borrow)]
    done: Option<&'a RawValue>,
    #[serde(borrow)]
    response: Option<&'a RawValue>,
    #[serde(borrow)]
    message: Option<&'a RawValue>,
}

/// An NDJSON line's `message` (Ollama's `/api/chat`).
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    content: Option<&'a RawValue>,
    #[serde(borrow)]
    tool_calls: Option<&'a RawValue>,
}

impl Message<'_> {
    fn has_output(&self) -> bool {
        non_empty(self.content) || non_empty(self.tool_calls)
    }
}

/// `text` as a `T`, when it is a JSON object that parses as one. (serde would also read a
/// struct from a JSON array, by position: that is not what a chunk means.)
fn object<'a, T: Deserialize<'a>>(text: &'a str) -> Option<T> {
    if !text.trim_ascii_start().starts_with('{') {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// A member's value as a `T`: `None` when the member is absent or `null`, or its value is not
/// an object that parses as a `T`.
fn member<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
    object(raw?.get())
}

/// A member that is a non-empty string, array or object (a `RawValue` is exactly the value's
/// JSON text: an escape in a string is at least one character).
fn non_empty(raw: Option<&RawValue>) -> bool {
    match raw.map(|raw| raw.get().as_bytes()) {
        Some([b'"', inner @ .., b'"']) => !inner.is_empty(),
        Some([b'[' | b'{', inner @ .., _]) => !inner.trim_ascii().is_empty(),
        _ => false,
    }
}
