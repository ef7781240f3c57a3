//! Continuation requests: a request that carries the start of the mock's answer gets the rest
//! of it, so a test can check that an answer resumed on another replica equals the
//! uninterrupted one byte for byte.
//!
//! Which requests continue, and from where (the *offset* `k`, in tokens):
//!
//! * OpenAI chat: the last message has role `assistant` (a prefill; vLLM and SGLang also send
//!   `"continue_final_message": true, "add_generation_prompt": false`, optional here, but an
//!   explicit `"continue_final_message": false` asks for a new turn: an ordinary request).
//! * Anthropic messages: the last message has role `assistant`.
//!
//!   Its text (string content, or the `text` of its content blocks of type `text`,
//!   concatenated; no content is the empty text) must be exactly the text of the first `k`
//!   tokens of the mock's answer (`k` may be 0); otherwise the request gets a 400 in the API's
//!   error shape, [`NOT_A_PREFIX`].
//! * OpenAI completions: the prompt (a string, or an array of one string) ends with the text
//!   already generated. `k` is the largest `k >= 1` (up to the script's token count) such that
//!   the prompt ends with the text of the first `k` tokens; none: `k = 0`, an ordinary
//!   request. A prompt that itself ends with the mock's words (`"Hello"`, `"Hello there"`, ...)
//!   is read as a continuation.
//!
//! The count rule is [`token_count`]. Other routes (Responses API, Ollama, gRPC) never
//! continue.

use std::borrow::Cow;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::wire::{Api, Ctx, token_text};

/// The message of the 400 a chat or Anthropic prefill gets when it is not the text of a
/// whole number of the mock's tokens.
pub(crate) const NOT_A_PREFIX: &str =
    "mock: assistant prefill is not a prefix of the mock's answer";

/// A prefill that is not a prefix of the mock's answer (on a token boundary).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NotAPrefix;

/// The continuation offset of a request (`None`: not a continuation request) following a
/// script of `script_tokens` tokens.
pub(crate) fn offset(api: Api, v: &Value, script_tokens: u32) -> Result<Option<u32>, NotAPrefix> {
    match api {
        Api::Chat | Api::Anthropic => match assistant_prefill(api, v) {
            Some(text) => exact_offset(&text).map(Some).ok_or(NotAPrefix),
            None => Ok(None),
        },
        Api::Completions => Ok(prompt(v).and_then(|p| prompt_offset(p, script_tokens))),
        Api::Responses | Api::Grpc | Api::OllamaGenerate | Api::OllamaChat => Ok(None),
    }
}

/// How many tokens a response continuing after `offset` tokens sends (offset 0: any request).
///
/// The script's count is the length of the whole answer, prefix included; `max_tokens` (as in
/// the real APIs) counts the tokens of this response. So a request that uninterrupted gets
/// `N = min(tokens, max_tokens)` tokens, resumed after `k < N` tokens with `max_tokens`
/// lowered by `k` (if it was given), gets `N - k`: tokens `k..N`, with the same finish reason.
pub(crate) fn token_count(script_tokens: u32, max_tokens: Option<u32>, offset: u32) -> u32 {
    let left = script_tokens.saturating_sub(offset);
    max_tokens.map_or(left, |m| m.min(left))
}

/// The body of the 400 that [`NotAPrefix`] gets, in the API's error shape.
pub(crate) fn error_body(api: Api) -> Bytes {
    let v = match api {
        Api::Anthropic => json!({"type": "error",
            "error": {"type": "invalid_request_error", "message": NOT_A_PREFIX}}),
        _ => json!({"error": {"message": NOT_A_PREFIX, "type": "invalid_request_error",
            "param": null, "code": null}}),
    };
    Bytes::from(v.to_string())
}

impl Ctx {
    /// Text of token `i` of this response (token `offset + i` of the whole answer).
    pub(crate) fn text(&self, i: u32) -> &'static str {
        token_text(self.offset.saturating_add(i))
    }

    /// Text of the first `n` tokens of this response.
    pub(crate) fn text_of(&self, n: u32) -> String {
        (0..n).map(|i| self.text(i)).collect()
    }
}

/// The text of the trailing assistant message of a chat or Anthropic request, if any.
fn assistant_prefill(api: Api, v: &Value) -> Option<Cow<'_, str>> {
    if api == Api::Chat && v.get("continue_final_message").and_then(Value::as_bool) == Some(false) {
        return None;
    }
    let last = v.get("messages")?.as_array()?.last()?;
    if last.get("role").and_then(Value::as_str) != Some("assistant") {
        return None;
    }
    Some(match last.get("content") {
        Some(Value::String(s)) => Cow::Borrowed(s.as_str()),
        Some(Value::Array(blocks)) => Cow::Owned(
            blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect(),
        ),
        _ => Cow::Borrowed(""),
    })
}

/// `k` such that `prefill` is the text of tokens `0..k`, if there is one.
fn exact_offset(prefill: &str) -> Option<u32> {
    let mut rest = prefill;
    let mut k = 0u32;
    while !rest.is_empty() {
        rest = rest.strip_prefix(token_text(k))?;
        k = k.checked_add(1)?;
    }
    Some(k)
}

/// A completions prompt: a string, or an array of one string.
fn prompt(v: &Value) -> Option<&str> {
    match v.get("prompt")? {
        Value::String(s) => Some(s),
        Value::Array(a) if a.len() == 1 => a[0].as_str(),
        _ => None,
    }
}

/// The largest `k` in `1..=script_tokens` such that `prompt` ends with the text of tokens
/// `0..k`.
fn prompt_offset(prompt: &str, script_tokens: u32) -> Option<u32> {
    // The answer's text as far as it fits in the prompt, and where each token ends in it.
    let mut text = String::new();
    let mut ends = Vec::new();
    for k in 0..script_tokens {
        let t = token_text(k);
        if text.len() + t.len() > prompt.len() {
            break;
        }
        text.push_str(t);
        ends.push(text.len());
    }
    // From the longest down: the first match is the largest k.
    (1..=ends.len())
        .rev()
        .find(|&k| prompt.ends_with(&text[..ends[k - 1]]))
        .map(|k| u32::try_from(k).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::full_text;

    fn chat(messages: Value) -> Value {
        json!({"stream": true, "messages": messages})
    }

    #[test]
    fn a_chat_prefill_is_read_on_token_boundaries() {
        for k in [0, 1, 5, 12, 13, 30] {
            let v = chat(json!([{"role": "user", "content": "hi"},
                {"role": "assistant", "content": full_text(k)}]));
            assert_eq!(offset(Api::Chat, &v, 20), Ok(Some(k)), "k = {k}");
        }
        // With vLLM's flags too.
        let mut v = chat(json!([{"role": "assistant", "content": "Hello there"}]));
        v["continue_final_message"] = json!(true);
        v["add_generation_prompt"] = json!(false);
        assert_eq!(offset(Api::Chat, &v, 20), Ok(Some(2)));
        // Content parts, concatenated.
        let v = chat(json!([{"role": "assistant", "content": [
            {"type": "text", "text": "Hello"}, {"type": "text", "text": " there,"}]}]));
        assert_eq!(offset(Api::Chat, &v, 20), Ok(Some(3)));
    }

    #[test]
    fn no_trailing_assistant_or_a_new_turn_is_an_ordinary_request() {
        let v = chat(json!([{"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "more"}]));
        assert_eq!(offset(Api::Chat, &v, 8), Ok(None));
        assert_eq!(offset(Api::Chat, &json!({}), 8), Ok(None));
        let mut v = chat(json!([{"role": "assistant", "content": "Hello"}]));
        v["continue_final_message"] = json!(false);
        assert_eq!(offset(Api::Chat, &v, 8), Ok(None));
        // Routes that never continue.
        let v = chat(json!([{"role": "assistant", "content": "nonsense"}]));
        assert_eq!(offset(Api::OllamaChat, &v, 8), Ok(None));
        assert_eq!(offset(Api::Responses, &v, 8), Ok(None));
    }

    #[test]
    fn a_prefill_off_the_answer_or_off_a_token_boundary_is_refused() {
        for bad in ["Hel", "Hello there, that", "Goodbye", "Hello  there"] {
            let v = chat(json!([{"role": "assistant", "content": bad}]));
            assert_eq!(offset(Api::Chat, &v, 8), Err(NotAPrefix), "{bad:?}");
            assert_eq!(offset(Api::Anthropic, &v, 8), Err(NotAPrefix), "{bad:?}");
        }
        let body: Value = serde_json::from_slice(&error_body(Api::Anthropic)).unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["message"], NOT_A_PREFIX);
        let body: Value = serde_json::from_slice(&error_body(Api::Chat)).unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn anthropic_text_blocks_are_concatenated() {
        let v = json!({"messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello there"},
                {"type": "thinking", "thinking": "ignored"}, {"type": "text", "text": ", this"}]}]});
        assert_eq!(offset(Api::Anthropic, &v, 8), Ok(Some(4)));
    }

    #[test]
    fn a_completions_prompt_ending_with_the_answer_continues_it() {
        let p = |s: String| json!({"prompt": s});
        assert_eq!(
            offset(Api::Completions, &p("Once upon a time".into()), 20),
            Ok(None)
        );
        for k in [1, 7, 12, 19] {
            let v = p(format!("Once upon a time{}", full_text(k)));
            assert_eq!(offset(Api::Completions, &v, 20), Ok(Some(k)), "k = {k}");
        }
        // Only up to the script's count: the text of 15 tokens ends with that of 3.
        let v = p(format!("Once{}", full_text(15)));
        assert_eq!(offset(Api::Completions, &v, 14), Ok(Some(3)));
        // 24 tokens end with the text of 12 as well: the largest wins.
        let v = p(full_text(24));
        assert_eq!(offset(Api::Completions, &v, 30), Ok(Some(24)));
        assert_eq!(offset(Api::Completions, &v, 23), Ok(Some(12)));
        // An array of one prompt.
        let v = json!({"prompt": [format!("x{}", full_text(3))]});
        assert_eq!(offset(Api::Completions, &v, 8), Ok(Some(3)));
        // A prompt that ends with the mock's words is read as a continuation.
        let v = p("Say Hello".into());
        assert_eq!(offset(Api::Completions, &v, 8), Ok(Some(1)));
    }

    #[test]
    fn the_continuation_is_the_rest_of_the_uninterrupted_answer() {
        for (script, max) in [(20, None), (20, Some(15)), (20, Some(30)), (5, Some(3))] {
            let n = token_count(script, max, 0);
            for k in 0..n {
                let max = max.map(|m| m - k);
                assert_eq!(token_count(script, max, k), n - k, "{script} {max:?} {k}");
            }
        }
        // A prefix longer than the script's answer: nothing left.
        assert_eq!(token_count(8, None, 10), 0);
    }
}
