//! [`RequestFacts`] from the request JSON of the OpenAI and Anthropic APIs, and
//! [`RequestFactsLayer`], which reads them once per request for the whole stack.
//!
//! One reader serves every LLM request shape tailguard knows: OpenAI chat completions
//! (`messages`), legacy completions (`prompt`), the Responses API (`input`, `instructions`,
//! `max_output_tokens`) and Anthropic messages (`messages`, `system`). Fields a request does not
//! have are left unset; members the reader does not know are skipped without being kept.

mod service;

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::ext::RequestFacts;

pub use service::{RequestFactsFuture, RequestFactsLayer, RequestFactsService};

/// The members of a request body the facts come from.
#[derive(Deserialize)]
struct Fields<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    messages: Option<TextLen>,
    #[serde(default)]
    prompt: Option<TextLen>,
    #[serde(default)]
    input: Option<TextLen>,
    #[serde(default)]
    system: Option<TextLen>,
    #[serde(default)]
    instructions: Option<TextLen>,
}

/// The member of a request body that carries the prompt, which each LLM route needs one of
/// (see [`RequestFactsLayer::with_required`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PromptMember {
    /// `messages`: OpenAI chat completions, Anthropic messages.
    Messages,
    /// `prompt`: OpenAI (legacy) completions.
    Prompt,
    /// `input`: the OpenAI Responses API.
    Input,
}

impl PromptMember {
    /// The member's name in the JSON body.
    pub fn as_str(self) -> &'static str {
        match self {
            PromptMember::Messages => "messages",
            PromptMember::Prompt => "prompt",
            PromptMember::Input => "input",
        }
    }
}

/// Which prompt members a body has (what [`RequestFacts::from_json`] saw besides the facts).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Present {
    messages: bool,
    prompt: bool,
    input: bool,
}

impl Present {
    pub(crate) fn has(self, m: PromptMember) -> bool {
        match m {
            PromptMember::Messages => self.messages,
            PromptMember::Prompt => self.prompt,
            PromptMember::Input => self.input,
        }
    }
}

/// Bytes of text in a prompt member: strings count their length, arrays the sum of their
/// elements, objects the sum of their `content` and `text` members (message objects and content
/// parts of every API); numbers (token ids), booleans and nulls count nothing.
struct TextLen(u64);

impl<'de> Deserialize<'de> for TextLen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextLenVisitor).map(TextLen)
    }
}

struct TextLenVisitor;

/// The keys of a message or content part that hold text.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Key {
    Content,
    Text,
    #[serde(other)]
    Other,
}

impl<'de> Visitor<'de> for TextLenVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("prompt text")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
        Ok(s.len() as u64)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
        Ok(0)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
        let mut n = 0u64;
        while let Some(TextLen(len)) = seq.next_element()? {
            n = n.saturating_add(len);
        }
        Ok(n)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let mut n = 0u64;
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Content | Key::Text => n = n.saturating_add(map.next_value::<TextLen>()?.0),
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(n)
    }
}

/// Whether a `content-type` says JSON: `application/json` (with parameters, such as
/// `; charset=utf-8`) or any `application/*+json` type, in any case. The one decision
/// [`RequestFactsLayer`] reads a body by.
pub fn is_json(content_type: &http::HeaderValue) -> bool {
    let essence = content_type
        .as_bytes()
        .split(|&b| b == b';')
        .next()
        .unwrap_or(b"");
    let essence = essence.trim_ascii().to_ascii_lowercase();
    essence == b"application/json"
        || (essence.starts_with(b"application/") && essence.ends_with(b"+json"))
}

/// Why a request body gave no facts.
#[derive(Debug)]
pub struct FactsError {
    message: String,
}

impl fmt::Display for FactsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FactsError {}

impl RequestFacts {
    /// Reads the facts from a request body of the OpenAI (chat, completions, responses) or
    /// Anthropic (messages) API: `model`; `stream` (`false` when absent, as these APIs
    /// default); the largest of `max_completion_tokens`, `max_tokens` and `max_output_tokens`
    /// (saturated to `u32`: servers differ on which wins when several are set); and as prompt bytes the text of
    /// `messages`, `prompt`, `input`, `system` and `instructions` together, or the body's length
    /// when it has none of them.
    ///
    /// Fails on a body that is not a JSON object, or whose known members have the wrong type.
    ///
    /// ```
    /// use tailguard_core::RequestFacts;
    ///
    /// let body = br#"{"model":"claude-sonnet-4-5","max_tokens":256,"stream":true,
    ///     "system":"Be brief.","messages":[{"role":"user","content":[{"type":"text","text":"Hi"}]}]}"#;
    /// let facts = RequestFacts::from_json(body).unwrap();
    /// assert_eq!(facts.model.as_deref(), Some("claude-sonnet-4-5"));
    /// assert_eq!((facts.max_tokens, facts.stream, facts.prompt_bytes), (Some(256), Some(true), Some(11)));
    /// assert!(RequestFacts::from_json(b"[1,2]").is_err());
    /// ```
    pub fn from_json(body: &[u8]) -> Result<RequestFacts, FactsError> {
        Self::from_json_members(body).map(|(facts, _)| facts)
    }

    /// [`from_json`](Self::from_json), and which prompt members the body has.
    pub(crate) fn from_json_members(body: &[u8]) -> Result<(RequestFacts, Present), FactsError> {
        if body.trim_ascii_start().first() != Some(&b'{') {
            return Err(FactsError {
                message: "the request body must be a JSON object".to_owned(),
            });
        }
        let f: Fields<'_> = serde_json::from_slice(body).map_err(|e| FactsError {
            message: match e.classify() {
                serde_json::error::Category::Data => format!("invalid request body: {e}"),
                _ => format!("the request body is not valid JSON: {e}"),
            },
        })?;
        let mut facts = RequestFacts::new();
        facts.model = f.model.map(Cow::into_owned);
        // Every one of these APIs streams only when asked to.
        facts.stream = Some(f.stream.unwrap_or(false));
        // The largest of the fields that set it: servers differ on which one wins when a body
        // has several, and a limit read from one of them must hold whichever the server reads.
        facts.max_tokens = [f.max_completion_tokens, f.max_tokens, f.max_output_tokens]
            .into_iter()
            .flatten()
            .max()
            .map(|m| u32::try_from(m).unwrap_or(u32::MAX));
        let present = Present {
            messages: f.messages.is_some(),
            prompt: f.prompt.is_some(),
            input: f.input.is_some(),
        };
        let texts = [f.messages, f.prompt, f.input, f.system, f.instructions];
        let prompt = texts
            .into_iter()
            .flatten()
            .fold(None, |sum: Option<u64>, t| {
                Some(sum.unwrap_or(0).saturating_add(t.0))
            });
        facts.prompt_bytes = Some(prompt.unwrap_or(body.len() as u64));
        Ok((facts, present))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(body: &str) -> RequestFacts {
        RequestFacts::from_json(body.as_bytes()).unwrap()
    }

    #[test]
    fn openai_chat_completions_and_responses() {
        let conflicting = facts(r#"{"max_tokens":738,"max_completion_tokens":60}"#);
        assert_eq!(conflicting.max_tokens, Some(738));
        let chat = facts(
            r#"{"model":"gpt-4o","stream":true,"max_tokens":10,"max_completion_tokens":20,
            "messages":[{"role":"system","content":"abc"},{"role":"user","content":[
            {"type":"text","text":"de"},{"type":"image_url","image_url":{"url":"xxxx"}}]}]}"#,
        );
        assert_eq!(chat.model.as_deref(), Some("gpt-4o"));
        assert_eq!(chat.stream, Some(true));
        assert_eq!(chat.max_tokens, Some(20));
        assert_eq!(chat.prompt_bytes, Some(5));

        let completions = facts(r#"{"model":"m","prompt":["ab","cd"],"max_tokens":99999999999}"#);
        assert_eq!(completions.max_tokens, Some(u32::MAX));
        assert_eq!(completions.stream, Some(false));
        assert_eq!(completions.prompt_bytes, Some(4));

        let responses = facts(
            r#"{"model":"gpt-4.1","stream":false,"max_output_tokens":64,"instructions":"x",
            "input":[{"role":"user","content":[{"type":"input_text","text":"hello"}]}]}"#,
        );
        assert_eq!(responses.max_tokens, Some(64));
        assert_eq!(responses.stream, Some(false));
        assert_eq!(responses.prompt_bytes, Some(6));
        assert_eq!(facts(r#"{"input":"four"}"#).prompt_bytes, Some(4));
    }

    #[test]
    fn token_id_prompts_count_nothing_and_no_prompt_counts_the_body() {
        assert_eq!(facts(r#"{"prompt":[1,2,3]}"#).prompt_bytes, Some(0));
        let body = r#"{"model":"m", "unknown":{"deep":[1,{"content":"no"}]}}"#;
        assert_eq!(facts(body).prompt_bytes, Some(body.len() as u64));
        assert_eq!(facts(r#"{"model":null}"#).model, None);
    }

    #[test]
    fn json_content_types() {
        for (ct, json) in [
            ("application/json", true),
            ("Application/JSON; charset=utf-8", true),
            ("application/vnd.api+json", true),
            ("text/plain", false),
            ("multipart/form-data; boundary=x", false),
            ("application/jsonl", false),
        ] {
            assert_eq!(is_json(&http::HeaderValue::from_static(ct)), json, "{ct}");
        }
    }

    #[test]
    fn malformed_bodies_are_errors() {
        for body in [
            "",
            "[1]",
            "\"s\"",
            "{not json",
            r#"{"stream":"yes"}"#,
            r#"{"max_tokens":-1}"#,
        ] {
            assert!(RequestFacts::from_json(body.as_bytes()).is_err(), "{body}");
        }
        let e = RequestFacts::from_json(b"{\"a\":").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the request body is not valid JSON"),
            "{e}"
        );
        let e = RequestFacts::from_json(br#"{"stream":1}"#).unwrap_err();
        assert!(e.to_string().starts_with("invalid request body"), "{e}");
    }
}
