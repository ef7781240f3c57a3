//! Whether a request can be resumed mid-stream, and the body of its continuation request.
//!
//! A continuation asks another replica to go on from where the broken stream stopped: the text
//! the client already got is sent back as a *prefill*, the prompt's own continuation for the
//! legacy completions API, a trailing assistant message for chat and Anthropic messages. The
//! model then generates the rest, so the client sees one answer with a pause, never a repeat.
//!
//! Only requests whose continuation is well defined are resumed. [`Plan::new`] decides that once,
//! at request time, from the path and the whole JSON body; [`Plan::continuation`] builds each
//! continuation body from what was [`Sent`]. Everything a continuation cannot reproduce faithfully
//! is refused up front ([`NotResumable`]): several choices, constrained decoding (a grammar or a
//! schema restarts at the prefill boundary), log probabilities (the client would get them for
//! part of its answer only), echoed prompts, suffixes, tools and thinking blocks.

use std::fmt;

use bytes::Bytes;
use serde_json::{Map, Value};

use super::read::Sent;

/// The API of a resumable request.
///
/// The OpenAI Responses API (`/v1/responses`) is not one of them: it has no defined way to
/// continue an output item (no prefill of a partial output, and its items carry ids and states a
/// second server would not know), so such requests are never resumed. Neither are Ollama's
/// native API, gRPC model services or anything that is not a streamed generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    /// OpenAI chat completions (`…/chat/completions`).
    Chat,
    /// OpenAI legacy completions (`…/completions`).
    Completions,
    /// Anthropic messages (`…/messages`).
    Anthropic,
}

impl Api {
    /// The API of a request path (its query string ignored), matched on the path's last
    /// segments so that prefixes (`/openai/v1/chat/completions`) and versions do not matter.
    pub(crate) fn of_path(path: &str) -> Option<Api> {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let path = path.trim_end_matches('/');
        if ends_with_segments(path, "chat/completions") {
            Some(Api::Chat)
        } else if ends_with_segments(path, "completions") {
            Some(Api::Completions)
        } else if ends_with_segments(path, "messages") {
            Some(Api::Anthropic)
        } else {
            None
        }
    }
}

/// Whether `path` ends with the whole segments `suffix` (so `…/xcompletions` does not match).
fn ends_with_segments(path: &str, suffix: &str) -> bool {
    match path.strip_suffix(suffix) {
        Some(rest) => rest.is_empty() || rest.ends_with('/'),
        None => false,
    }
}

/// Why a request (or a stream) is not resumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotResumable {
    /// The path is not one of a resumable API (OpenAI chat completions or completions,
    /// Anthropic messages).
    Path,
    /// The body is not a JSON object.
    NotJson,
    /// The request does not ask for a stream (`stream` is not `true`).
    NotStreaming,
    /// More than one choice is generated (`n` or `best_of` above 1).
    ManyChoices,
    /// Constrained decoding (`response_format` other than text, a JSON schema, a grammar, guided
    /// decoding): a constraint would restart at the prefill boundary.
    StructuredOutput,
    /// Log probabilities are requested: the continuation's would not match what the client got.
    Logprobs,
    /// The prompt is echoed (`echo`): a continuation would echo the prefill too.
    Echo,
    /// Tools are offered and may be called: a tool call's arguments cannot be continued
    /// reliably, and a continuation could start one where the first stream would not have.
    Tools,
    /// A completions prompt that is not one string (several prompts, or token ids).
    Prompt,
    /// A completions `suffix`: the prefill would sit between the prompt and the suffix.
    Suffix,
    /// A chat or Anthropic request without a `messages` array.
    Messages,
    /// Anthropic extended thinking: thinking blocks cannot be prefilled.
    Thinking,
    /// The stream had started a tool call when it broke.
    ToolCallInProgress,
    /// The output limit is used up by what the client already got.
    NoTokensLeft,
}

impl NotResumable {
    /// A bounded snake_case label, for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            NotResumable::Path => "path",
            NotResumable::NotJson => "not_json",
            NotResumable::NotStreaming => "not_streaming",
            NotResumable::ManyChoices => "many_choices",
            NotResumable::StructuredOutput => "structured_output",
            NotResumable::Logprobs => "logprobs",
            NotResumable::Echo => "echo",
            NotResumable::Tools => "tools",
            NotResumable::Prompt => "prompt",
            NotResumable::Suffix => "suffix",
            NotResumable::Messages => "messages",
            NotResumable::Thinking => "thinking",
            NotResumable::ToolCallInProgress => "tool_call_in_progress",
            NotResumable::NoTokensLeft => "no_tokens_left",
        }
    }
}

impl fmt::Display for NotResumable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self {
            NotResumable::Path => "the path is not a resumable api",
            NotResumable::NotJson => "the request body is not a json object",
            NotResumable::NotStreaming => "the request is not streamed",
            NotResumable::ManyChoices => "the request asks for several choices",
            NotResumable::StructuredOutput => "the request constrains its output",
            NotResumable::Logprobs => "the request asks for log probabilities",
            NotResumable::Echo => "the request echoes its prompt",
            NotResumable::Tools => "the request offers tools",
            NotResumable::Prompt => "the prompt is not a single string",
            NotResumable::Suffix => "the request has a suffix",
            NotResumable::Messages => "the request has no messages array",
            NotResumable::Thinking => "the request enables thinking",
            NotResumable::ToolCallInProgress => "a tool call was in progress",
            NotResumable::NoTokensLeft => "the output limit is used up",
        };
        write!(f, "not resumable: {why}")
    }
}

impl std::error::Error for NotResumable {}

/// Fields that constrain decoding, beside `response_format`: vLLM's guided decoding and
/// structured outputs, llama.cpp's `json_schema` and `grammar`, Anthropic's `output_format`.
const CONSTRAINTS: [&str; 8] = [
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "json_schema",
    "structured_outputs",
    "grammar",
    "output_format",
];

/// A resumable request: its API and its parsed JSON body, from which continuations are built.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    api: Api,
    body: Map<String, Value>,
}

impl Plan {
    /// At request time, from the request path and its whole JSON body.
    ///
    /// Refuses (in this order) a path of no resumable API, a body that is not a JSON object,
    /// a request that is not streamed, then whatever a continuation could not reproduce (see
    /// [`NotResumable`]). Fields that are `null` count as absent.
    ///
    /// Tools: a request that offers tools (a non-empty `tools` or `functions` list) is refused
    /// unless it forbids calling them (`tool_choice` `"none"`, or `{"type": "none"}` for
    /// Anthropic; `function_call: "none"` for the legacy `functions`). A tool call's arguments
    /// cannot be continued reliably, and the layer only learns that a call started once it did.
    pub(crate) fn new(path: &str, body: &[u8]) -> Result<Plan, NotResumable> {
        let api = Api::of_path(path).ok_or(NotResumable::Path)?;
        let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(body) else {
            return Err(NotResumable::NotJson);
        };
        let get = |key: &str| body.get(key).filter(|v| !v.is_null());
        if get("stream") != Some(&Value::Bool(true)) {
            return Err(NotResumable::NotStreaming);
        }
        let above_one = |key: &str| get(key).and_then(Value::as_f64).is_some_and(|n| n > 1.0);
        if above_one("n") || (api == Api::Completions && above_one("best_of")) {
            return Err(NotResumable::ManyChoices);
        }
        let text_format = |f: &Value| f.get("type").and_then(Value::as_str) == Some("text");
        if get("response_format").is_some_and(|f| !text_format(f))
            || CONSTRAINTS.iter().any(|&key| get(key).is_some())
        {
            return Err(NotResumable::StructuredOutput);
        }
        if get("logprobs").is_some_and(|v| *v != Value::Bool(false))
            || get("top_logprobs").is_some()
        {
            return Err(NotResumable::Logprobs);
        }
        if get("echo").is_some_and(|v| *v == Value::Bool(true)) {
            return Err(NotResumable::Echo);
        }
        let offered = |key: &str| {
            get(key)
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
        };
        let forbidden = |key: &str| {
            get(key).is_some_and(|c| {
                c.as_str() == Some("none") || c.get("type").and_then(Value::as_str) == Some("none")
            })
        };
        if (offered("tools") && !forbidden("tool_choice"))
            || (offered("functions") && !forbidden("function_call"))
        {
            return Err(NotResumable::Tools);
        }
        match api {
            Api::Completions => {
                if get("suffix").is_some() {
                    return Err(NotResumable::Suffix);
                }
                match get("prompt") {
                    Some(Value::String(_)) => {}
                    Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {}
                    _ => return Err(NotResumable::Prompt),
                }
            }
            Api::Chat | Api::Anthropic => {
                if !get("messages").is_some_and(Value::is_array) {
                    return Err(NotResumable::Messages);
                }
                let thinking = get("thinking").map(|t| t.get("type").and_then(Value::as_str));
                if api == Api::Anthropic && thinking.is_some_and(|t| t != Some("disabled")) {
                    return Err(NotResumable::Thinking);
                }
            }
        }
        Ok(Plan { api, body })
    }

    /// The API of the request.
    pub(crate) fn api(&self) -> Api {
        self.api
    }

    /// The body of the continuation request after `sent` (what the client already got).
    ///
    /// A clone of the original body with:
    ///
    /// * the prefill: completions get `sent.text` appended to the prompt; chat and Anthropic a
    ///   trailing `{"role": "assistant", "content": sent.text}` message, or, when the request
    ///   already ends with an assistant message (the client prefilled), `sent.text` appended to
    ///   it (to its string content, or to its last text block);
    /// * chat also gets `"continue_final_message": true, "add_generation_prompt": false`, which
    ///   vLLM and SGLang need to continue the trailing message instead of starting a new one;
    ///   servers that take a trailing assistant message as a prefill anyway (llama.cpp) ignore
    ///   them. (OpenAI itself has no prefill: resuming targets self-hosted replicas.)
    /// * the output limits (`max_tokens`; `max_completion_tokens` for chat) reduced by
    ///   `sent.output_tokens`, [`NotResumable::NoTokensLeft`] when nothing would be left; an
    ///   absent limit stays absent. `sent.output_tokens` counts content events, which is one
    ///   token per event on the servers we know; a server that batches tokens makes the total
    ///   limit looser, never tighter.
    ///
    /// Everything else (`stream_options`, `n`, `seed`, `temperature`, ...) is kept as it is.
    ///
    /// When nothing was sent yet (`sent.text` is empty), the continuation is the original body:
    /// no empty assistant message (Anthropic rejects one), limits unchanged.
    ///
    /// Anthropic rejects a final assistant message that ends with whitespace, so the prefill is
    /// sent with its trailing whitespace trimmed. The model may then generate that whitespace
    /// again, and the client gets it twice: the reader splicing the continuation cannot tell
    /// regenerated whitespace from new. (A prefill that is whitespace only is not sent at all.)
    pub(crate) fn continuation(&self, sent: &Sent) -> Result<Bytes, NotResumable> {
        if sent.tool_call {
            return Err(NotResumable::ToolCallInProgress);
        }
        let mut body = self.body.clone();
        if sent.text.is_empty() {
            return Ok(serialize(&body));
        }
        reduce_limit(&mut body, "max_tokens", sent.output_tokens)?;
        if self.api == Api::Chat {
            reduce_limit(&mut body, "max_completion_tokens", sent.output_tokens)?;
        }
        match self.api {
            Api::Completions => {
                if let Some(prompt) = body.get_mut("prompt") {
                    let prompt = match prompt {
                        Value::Array(a) => a.first_mut(),
                        other => Some(other),
                    };
                    if let Some(Value::String(p)) = prompt {
                        p.push_str(&sent.text);
                    }
                }
            }
            Api::Chat => {
                prefill(&mut body, &sent.text, false);
                body.insert("continue_final_message".into(), Value::Bool(true));
                body.insert("add_generation_prompt".into(), Value::Bool(false));
            }
            Api::Anthropic => prefill(&mut body, &sent.text, true),
        }
        Ok(serialize(&body))
    }
}

fn serialize(body: &Map<String, Value>) -> Bytes {
    // A map of JSON values always serializes.
    Bytes::from(serde_json::to_vec(body).unwrap_or_default())
}

/// Reduces the limit `key` by `used`: absent (or not a count) stays as it is, nothing left is
/// [`NotResumable::NoTokensLeft`].
fn reduce_limit(body: &mut Map<String, Value>, key: &str, used: u64) -> Result<(), NotResumable> {
    let Some(limit) = body.get(key).and_then(Value::as_u64) else {
        return Ok(());
    };
    match limit.checked_sub(used) {
        Some(left) if left >= 1 => {
            body.insert(key.into(), Value::from(left));
            Ok(())
        }
        _ => Err(NotResumable::NoTokensLeft),
    }
}

/// Adds `text` as the assistant prefill of `messages`: appended to a trailing assistant message,
/// else as a new one. `trim`: trailing whitespace removed from the resulting prefill (Anthropic).
fn prefill(body: &mut Map<String, Value>, text: &str, trim: bool) {
    let Some(Value::Array(messages)) = body.get_mut("messages") else {
        return;
    };
    let trailing = messages
        .last_mut()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
    if let Some(Value::Object(message)) = trailing {
        match message.get_mut("content") {
            Some(Value::String(s)) => extend(s, text, trim),
            Some(Value::Array(blocks)) => {
                let last_text = blocks
                    .last_mut()
                    .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                    .and_then(|b| b.get_mut("text"));
                match last_text {
                    Some(Value::String(s)) => extend(s, text, trim),
                    _ => {
                        let text = if trim { text.trim_end() } else { text };
                        if !text.is_empty() {
                            blocks.push(serde_json::json!({"type": "text", "text": text}));
                        }
                    }
                }
            }
            _ => {
                let text = if trim { text.trim_end() } else { text };
                message.insert("content".into(), Value::from(text));
            }
        }
        return;
    }
    let text = if trim { text.trim_end() } else { text };
    if !text.is_empty() {
        messages.push(serde_json::json!({"role": "assistant", "content": text}));
    }
}

fn extend(s: &mut String, text: &str, trim: bool) {
    s.push_str(text);
    if trim {
        s.truncate(s.trim_end().len());
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const CHAT: &str = "/v1/chat/completions";
    const COMPLETIONS: &str = "/v1/completions";
    const MESSAGES: &str = "/v1/messages";

    fn plan(path: &str, body: Value) -> Result<Plan, NotResumable> {
        Plan::new(path, body.to_string().as_bytes())
    }

    fn chat(extra: Value) -> Value {
        let mut body = json!({
            "model": "m", "stream": true,
            "messages": [{"role": "user", "content": "Hi"}],
        });
        merge(&mut body, extra);
        body
    }

    fn completions(extra: Value) -> Value {
        let mut body = json!({"model": "m", "stream": true, "prompt": "Once"});
        merge(&mut body, extra);
        body
    }

    fn anthropic(extra: Value) -> Value {
        let mut body = json!({
            "model": "claude", "stream": true, "max_tokens": 100,
            "messages": [{"role": "user", "content": "Hi"}],
        });
        merge(&mut body, extra);
        body
    }

    fn merge(body: &mut Value, extra: Value) {
        let (Value::Object(b), Value::Object(e)) = (body, extra) else {
            panic!("objects");
        };
        b.extend(e);
    }

    fn sent(text: &str, output_tokens: u64) -> Sent {
        Sent {
            text: text.into(),
            output_tokens,
            ..Sent::default()
        }
    }

    fn continuation(path: &str, body: Value, sent: &Sent) -> Result<Value, NotResumable> {
        let plan = plan(path, body).expect("resumable");
        let bytes = plan.continuation(sent)?;
        Ok(serde_json::from_slice(&bytes).expect("json"))
    }

    #[test]
    fn path_matching() {
        let cases = [
            ("/v1/chat/completions", Some(Api::Chat)),
            ("/openai/v1/chat/completions", Some(Api::Chat)),
            ("/v1/chat/completions?api-version=1", Some(Api::Chat)),
            ("/v1/chat/completions/", Some(Api::Chat)),
            ("chat/completions", Some(Api::Chat)),
            ("/v1/completions", Some(Api::Completions)),
            ("/v1/completions?x=chat/completions", Some(Api::Completions)),
            ("/v1/messages", Some(Api::Anthropic)),
            ("/anthropic/v1/messages", Some(Api::Anthropic)),
            ("/v1/responses", None),
            ("/v1/embeddings", None),
            ("/api/chat", None),
            ("/api/generate", None),
            ("/v1/xcompletions", None),
            ("/v1/chat/completions/extra", None),
            ("/generate.Generator/Stream", None),
            ("", None),
        ];
        for (path, api) in cases {
            assert_eq!(Api::of_path(path), api, "{path}");
        }
        assert_eq!(
            plan("/v1/responses", json!({"stream": true, "input": "x"})).unwrap_err(),
            NotResumable::Path
        );
        assert_eq!(plan(CHAT, chat(json!({}))).unwrap().api(), Api::Chat);
        let p = plan(COMPLETIONS, completions(json!({}))).unwrap();
        assert_eq!(p.api(), Api::Completions);
        assert_eq!(
            plan(MESSAGES, anthropic(json!({}))).unwrap().api(),
            Api::Anthropic
        );
    }

    #[test]
    fn refuses_what_is_not_a_json_object() {
        for body in [
            &b"not json"[..],
            b"[1,2]",
            b"\"s\"",
            b"",
            b"{\"stream\":true",
        ] {
            assert_eq!(Plan::new(CHAT, body).unwrap_err(), NotResumable::NotJson);
        }
    }

    #[test]
    fn refuses_requests_not_streamed() {
        for stream in [json!(false), json!(null), json!("true"), json!(1)] {
            let body = chat(json!({"stream": stream}));
            assert_eq!(plan(CHAT, body).unwrap_err(), NotResumable::NotStreaming);
        }
        let mut body = chat(json!({}));
        body.as_object_mut().unwrap().remove("stream");
        assert_eq!(plan(CHAT, body).unwrap_err(), NotResumable::NotStreaming);
    }

    #[test]
    fn refuses_many_choices() {
        let e = NotResumable::ManyChoices;
        assert_eq!(plan(CHAT, chat(json!({"n": 2}))).unwrap_err(), e);
        assert!(plan(CHAT, chat(json!({"n": 1}))).is_ok());
        assert!(plan(CHAT, chat(json!({"n": null}))).is_ok());
        let best_of = completions(json!({"best_of": 3}));
        assert_eq!(plan(COMPLETIONS, best_of).unwrap_err(), e);
        assert!(plan(COMPLETIONS, completions(json!({"best_of": 1}))).is_ok());
    }

    #[test]
    fn refuses_structured_output() {
        let e = NotResumable::StructuredOutput;
        let refused = [
            json!({"response_format": {"type": "json_object"}}),
            json!({"response_format": {"type": "json_schema", "json_schema": {}}}),
            json!({"response_format": {}}),
            json!({"guided_json": {"type": "object"}}),
            json!({"guided_regex": "a+"}),
            json!({"guided_choice": ["a", "b"]}),
            json!({"guided_grammar": "root ::= x"}),
            json!({"json_schema": {"type": "object"}}),
            json!({"structured_outputs": {"regex": "a"}}),
            json!({"grammar": "root ::= x"}),
        ];
        for extra in refused {
            assert_eq!(plan(CHAT, chat(extra.clone())).unwrap_err(), e, "{extra}");
        }
        assert!(plan(CHAT, chat(json!({"response_format": {"type": "text"}}))).is_ok());
        assert!(plan(CHAT, chat(json!({"response_format": null}))).is_ok());
        let body = anthropic(json!({"output_format": {"type": "json_schema"}}));
        assert_eq!(plan(MESSAGES, body).unwrap_err(), e);
    }

    #[test]
    fn refuses_logprobs() {
        let e = NotResumable::Logprobs;
        assert_eq!(plan(CHAT, chat(json!({"logprobs": true}))).unwrap_err(), e);
        let top = chat(json!({"logprobs": true, "top_logprobs": 2}));
        assert_eq!(plan(CHAT, top).unwrap_err(), e);
        assert_eq!(plan(CHAT, chat(json!({"top_logprobs": 0}))).unwrap_err(), e);
        assert!(plan(CHAT, chat(json!({"logprobs": false}))).is_ok());
        let body = completions(json!({"logprobs": 0}));
        assert_eq!(plan(COMPLETIONS, body).unwrap_err(), e);
        assert!(plan(COMPLETIONS, completions(json!({"logprobs": null}))).is_ok());
    }

    #[test]
    fn refuses_echo() {
        let body = completions(json!({"echo": true}));
        assert_eq!(plan(COMPLETIONS, body).unwrap_err(), NotResumable::Echo);
        assert!(plan(COMPLETIONS, completions(json!({"echo": false}))).is_ok());
    }

    #[test]
    fn refuses_tools_unless_forbidden() {
        let e = NotResumable::Tools;
        let tool = json!([{"type": "function", "function": {"name": "f"}}]);
        assert_eq!(plan(CHAT, chat(json!({"tools": tool}))).unwrap_err(), e);
        let auto = chat(json!({"tools": tool, "tool_choice": "auto"}));
        assert_eq!(plan(CHAT, auto).unwrap_err(), e);
        assert!(plan(CHAT, chat(json!({"tools": tool, "tool_choice": "none"}))).is_ok());
        assert!(plan(CHAT, chat(json!({"tools": []}))).is_ok());
        let functions = chat(json!({"functions": [{"name": "f"}]}));
        assert_eq!(plan(CHAT, functions).unwrap_err(), e);
        let none = chat(json!({"functions": [{"name": "f"}], "function_call": "none"}));
        assert!(plan(CHAT, none).is_ok());
        let tool = json!([{"name": "f", "input_schema": {}}]);
        assert_eq!(
            plan(MESSAGES, anthropic(json!({"tools": tool}))).unwrap_err(),
            e
        );
        let none = anthropic(json!({"tools": tool, "tool_choice": {"type": "none"}}));
        assert!(plan(MESSAGES, none).is_ok());
    }

    #[test]
    fn completions_prompt_must_be_one_string() {
        let e = NotResumable::Prompt;
        for prompt in [
            json!(["a", "b"]),
            json!([1, 2, 3]),
            json!([]),
            json!(null),
            json!(7),
        ] {
            let body = completions(json!({"prompt": prompt}));
            assert_eq!(plan(COMPLETIONS, body).unwrap_err(), e, "{prompt}");
        }
        assert!(plan(COMPLETIONS, completions(json!({"prompt": ["a"]}))).is_ok());
        let suffix = completions(json!({"suffix": "end"}));
        assert_eq!(plan(COMPLETIONS, suffix).unwrap_err(), NotResumable::Suffix);
    }

    #[test]
    fn chat_and_anthropic_need_messages() {
        let e = NotResumable::Messages;
        assert_eq!(plan(CHAT, json!({"stream": true})).unwrap_err(), e);
        let body = json!({"stream": true, "messages": "Hi"});
        assert_eq!(plan(CHAT, body).unwrap_err(), e);
        let body = json!({"stream": true, "max_tokens": 5});
        assert_eq!(plan(MESSAGES, body).unwrap_err(), e);
    }

    #[test]
    fn refuses_anthropic_thinking() {
        let enabled = json!({"thinking": {"type": "enabled", "budget_tokens": 1024}});
        let body = anthropic(enabled);
        assert_eq!(plan(MESSAGES, body).unwrap_err(), NotResumable::Thinking);
        let disabled = anthropic(json!({"thinking": {"type": "disabled"}}));
        assert!(plan(MESSAGES, disabled).is_ok());
    }

    #[test]
    fn chat_continuation_appends_an_assistant_message() {
        let body = chat(json!({
            "max_tokens": 50, "stream_options": {"include_usage": true},
            "n": 1, "seed": 7, "temperature": 0.5,
        }));
        let got = continuation(CHAT, body, &sent("1. Red\n2.", 4)).unwrap();
        let want = json!({
            "model": "m", "stream": true, "max_tokens": 46,
            "stream_options": {"include_usage": true}, "n": 1, "seed": 7, "temperature": 0.5,
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "1. Red\n2."},
            ],
            "continue_final_message": true, "add_generation_prompt": false,
        });
        assert_eq!(got, want);
    }

    #[test]
    fn chat_continuation_extends_a_client_prefill() {
        let body = chat(json!({"messages": [
            {"role": "user", "content": "Count"},
            {"role": "assistant", "content": "1, 2"},
        ]}));
        let got = continuation(CHAT, body, &sent(", 3", 2)).unwrap();
        assert_eq!(
            got["messages"],
            json!([
                {"role": "user", "content": "Count"},
                {"role": "assistant", "content": "1, 2, 3"},
            ])
        );
        assert_eq!(got["continue_final_message"], json!(true));
        // No limit in the request: none in the continuation.
        assert!(got.get("max_tokens").is_none());
        assert!(got.get("max_completion_tokens").is_none());
    }

    #[test]
    fn completions_continuation_extends_the_prompt() {
        let body = completions(json!({"max_tokens": 16, "stop": ["\n"]}));
        let got = continuation(COMPLETIONS, body, &sent(", the city", 3)).unwrap();
        let want = json!({
            "model": "m", "stream": true, "prompt": "Once, the city", "max_tokens": 13,
            "stop": ["\n"],
        });
        assert_eq!(got, want);
        let body = completions(json!({"prompt": ["Once"]}));
        let got = continuation(COMPLETIONS, body, &sent(" upon", 1)).unwrap();
        assert_eq!(got["prompt"], json!(["Once upon"]));
        assert!(got.get("continue_final_message").is_none());
    }

    #[test]
    fn anthropic_continuation_trims_trailing_whitespace() {
        let body = anthropic(json!({"system": "Be brief."}));
        let got = continuation(MESSAGES, body, &sent("I saw 'Tell ", 6)).unwrap();
        let want = json!({
            "model": "claude", "stream": true, "max_tokens": 94, "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "I saw 'Tell"},
            ],
        });
        assert_eq!(got, want);
        // Whitespace only: no prefill at all, but the limit still counts what was sent.
        let got = continuation(MESSAGES, anthropic(json!({})), &sent(" \n", 2)).unwrap();
        assert_eq!(got["messages"], json!([{"role": "user", "content": "Hi"}]));
        assert_eq!(got["max_tokens"], json!(98));
    }

    #[test]
    fn anthropic_continuation_extends_a_client_prefill() {
        let body = anthropic(json!({"messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Here is"},
            ]},
        ]}));
        let got = continuation(MESSAGES, body, &sent(" the answer: ", 3)).unwrap();
        assert_eq!(
            got["messages"][1],
            json!({"role": "assistant", "content": [
                {"type": "text", "text": "Here is the answer:"},
            ]})
        );
        let body = anthropic(json!({"messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "{"},
        ]}));
        let got = continuation(MESSAGES, body, &sent("\"a\"", 1)).unwrap();
        assert_eq!(got["messages"][1]["content"], json!("{\"a\""));
        assert!(got.get("continue_final_message").is_none());
    }

    #[test]
    fn limits_are_reduced_for_both_fields() {
        let body = chat(json!({"max_tokens": 10, "max_completion_tokens": 20}));
        let got = continuation(CHAT, body, &sent("abc", 3)).unwrap();
        assert_eq!(got["max_tokens"], json!(7));
        assert_eq!(got["max_completion_tokens"], json!(17));
        let body = chat(json!({"max_completion_tokens": 5}));
        let got = continuation(CHAT, body, &sent("abcd", 4)).unwrap();
        assert_eq!(got["max_completion_tokens"], json!(1));
        assert!(got.get("max_tokens").is_none());
    }

    #[test]
    fn no_tokens_left() {
        let e = NotResumable::NoTokensLeft;
        let body = chat(json!({"max_completion_tokens": 4}));
        assert_eq!(continuation(CHAT, body, &sent("abcd", 4)).unwrap_err(), e);
        let body = chat(json!({"max_tokens": 3}));
        assert_eq!(continuation(CHAT, body, &sent("abcd", 4)).unwrap_err(), e);
        let body = completions(json!({"max_tokens": 2}));
        assert_eq!(
            continuation(COMPLETIONS, body, &sent("ab", 2)).unwrap_err(),
            e
        );
        assert_eq!(
            continuation(MESSAGES, anthropic(json!({})), &sent("a", 100)).unwrap_err(),
            e
        );
    }

    #[test]
    fn nothing_sent_keeps_the_original_body() {
        for (path, body) in [
            (CHAT, chat(json!({"max_tokens": 3}))),
            (COMPLETIONS, completions(json!({"max_tokens": 3}))),
            (MESSAGES, anthropic(json!({}))),
        ] {
            let got = continuation(path, body.clone(), &Sent::default()).unwrap();
            assert_eq!(got, body, "{path}");
        }
    }

    #[test]
    fn tool_call_in_progress_is_not_continued() {
        let sent = Sent {
            tool_call: true,
            ..sent("x", 1)
        };
        let got = continuation(CHAT, chat(json!({})), &sent).unwrap_err();
        assert_eq!(got, NotResumable::ToolCallInProgress);
    }

    #[test]
    fn labels_and_messages() {
        assert_eq!(NotResumable::NoTokensLeft.as_str(), "no_tokens_left");
        assert_eq!(
            NotResumable::ToolCallInProgress.as_str(),
            "tool_call_in_progress"
        );
        assert_eq!(
            NotResumable::Path.to_string(),
            "not resumable: the path is not a resumable api"
        );
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(NotResumable::Tools);
        assert_eq!(
            boxed.downcast_ref::<NotResumable>(),
            Some(&NotResumable::Tools)
        );
    }
}
