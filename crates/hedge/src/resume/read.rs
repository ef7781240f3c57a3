//! Reading a stream event by event, and splicing a continuation onto it.
//!
//! A [`Reader`] sits between an upstream body and the client. It finds event boundaries with
//! core's [`SseScanner`] and hands on complete events only: the bytes of an event still
//! incomplete are held back, so when the stream breaks the client never holds half an event and
//! a continuation can be spliced on cleanly. Meanwhile it records what the client got
//! ([`Sent`]), which is what a continuation request is built from
//! ([`Plan::continuation`](super::plan::Plan::continuation)).
//!
//! The first stream's events are forwarded byte for byte. A continuation's are rewritten to look
//! like the rest of the first stream: its preamble (role chunk, `message_start`, the start of the
//! text block in progress, pings) dropped, the first stream's `id`, `created` and `model`, usage
//! that adds up over both streams, Anthropic block indices that go on from the first stream's.
//! Those events are re-serialized (`event: <name>\n` when named, then `data: <json>\n\n`), so
//! key order and spacing may differ from the upstream's; comments (keepalives) are dropped.
//!
//! A stream is finished only once a finish reason reached the client: a terminal event before
//! one (`data: [DONE]`, an Anthropic `message_stop`) is held back, with anything after it, so
//! that a stream to be resumed does not tell the client it is over. [`Reader::end`] then says
//! [`Break::DoneWithoutFinish`]; a layer that resumes drops the held bytes, one that does not
//! forwards them ([`Reader::take_held`]).

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value};
use tailguard_core::ScanError;
use tailguard_core::scan::{Event, SseScanner};

use super::plan::Api;

/// What the client has been sent so far (cumulative over resumes).
#[derive(Clone, Debug, Default)]
pub(crate) struct Sent {
    /// The content text delivered to the client, concatenated.
    pub(crate) text: String,
    /// Content events delivered: one per chunk (or Anthropic `text_delta`) with non-empty
    /// content. Usage blocks are not used: they come at the end, after the point a broken stream
    /// needs the count. One event is one token on every server we know; one that batches tokens
    /// makes this an undercount.
    pub(crate) output_tokens: u64,
    /// The first stream's `id` (chat/completions), or its Anthropic message id: the first one
    /// seen, so a continuation's is taken only when the first stream had none.
    pub(crate) id: Option<String>,
    /// The first stream's `created` (chat/completions).
    pub(crate) created: Option<Value>,
    /// The first stream's `model`.
    pub(crate) model: Option<String>,
    /// The first stream's prompt (input) tokens, if it reported them. A continuation's are
    /// never taken: its prompt includes the prefill.
    pub(crate) prompt_tokens: Option<u64>,
    /// A finish reason was delivered (chat/completions: a non-null `finish_reason`; Anthropic:
    /// a `message_delta` with a non-null `delta.stop_reason`).
    pub(crate) finished: bool,
    /// A tool call was seen (a `tool_calls` or `function_call` delta; an Anthropic `tool_use`
    /// block or `input_json_delta`): then the stream is not resumable.
    pub(crate) tool_call: bool,
    /// The index of the Anthropic content block in progress (started, not stopped).
    pub(crate) anthropic_block: Option<u64>,
    /// How many Anthropic content blocks were started: the index of the next one.
    pub(crate) anthropic_blocks: u64,
}

/// Why a stream should be resumed (core's [`BreakReason`]: the recorder reports it).
pub(crate) use tailguard_core::BreakReason as Break;

/// What to do with one complete event.
#[derive(Debug)]
enum Step {
    /// Forward it: as it came (`None`), or, in a continuation, re-serialized from `Some`.
    Pass(Option<Map<String, Value>>),
    /// Drop it (a continuation's preamble and pings).
    Drop,
    /// A terminal event before any finish reason: held back, with everything after it (see
    /// [`Reader::take_held`]).
    Hold,
    /// An in-band error: the stream broke here.
    Error,
}

/// A continuation's own state.
#[derive(Debug)]
struct Splice {
    /// The output tokens the client had when this continuation started.
    base_tokens: u64,
    /// Added to this stream's Anthropic block indices; set at its first block event.
    block_offset: Option<i64>,
}

/// Reads one stream (the original or a continuation), see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Reader {
    api: Api,
    scanner: SseScanner,
    sent: Sent,
    /// `Some` when reading a continuation.
    splice: Option<Splice>,
    /// Bytes fed since the last event boundary (an event not complete yet).
    raw: BytesMut,
    /// Complete events held back behind a terminal event that came before a finish reason.
    held: BytesMut,
    holding: bool,
    /// Set by an error event or by [`Reader::end`]: later frames are ignored.
    over: Option<Option<Break>>,
}

impl Reader {
    /// Reads the original stream: complete events are forwarded as they are (raw bytes).
    pub(crate) fn first(api: Api) -> Self {
        Reader::new(api, Sent::default(), None)
    }

    /// Reads a continuation stream, spliced onto what was `sent`: its preamble is dropped, its
    /// ids, created and model are the first stream's, usage is rewritten (prompt tokens = the
    /// first stream's when known, completion/output tokens = `sent.output_tokens` + this
    /// stream's, total recomputed), events re-serialized. Its [`sent`](Reader::sent) goes on
    /// from `sent`, so a continuation of this continuation can be built from it.
    pub(crate) fn continuing(api: Api, sent: Sent) -> Self {
        let splice = Splice {
            base_tokens: sent.output_tokens,
            block_offset: None,
        };
        Reader::new(api, sent, Some(splice))
    }

    fn new(api: Api, sent: Sent, splice: Option<Splice>) -> Self {
        Reader {
            api,
            scanner: SseScanner::new(),
            sent,
            splice,
            raw: BytesMut::new(),
            held: BytesMut::new(),
            holding: false,
            over: None,
        }
    }

    /// What the client has been sent so far (the events this reader returned included).
    pub(crate) fn sent(&self) -> &Sent {
        &self.sent
    }

    /// Feeds one data frame; returns the bytes to hand to the client now and a [`Break`] if an
    /// in-band error event arrived.
    ///
    /// Only complete events are returned: the bytes of an event still incomplete are held back
    /// until it completes. An error event is not forwarded, nor anything after it (events
    /// before it in the same frame are; the rest is kept, see [`take_held`](Reader::take_held));
    /// the reader then ignores later frames (empty bytes, no break). A [`ScanError`] (an event
    /// over core's cap) spends the reader: the layer passes the rest on as it is.
    pub(crate) fn frame(&mut self, data: &[u8]) -> Result<(Bytes, Option<Break>), ScanError> {
        let mut out = BytesMut::new();
        if self.over.is_some() {
            return Ok((out.freeze(), None));
        }
        let mut rest = data;
        while !rest.is_empty() {
            // One line end per piece, so the scanner completes at most one event per piece and
            // each event's bytes are known exactly (the scanner does not say where in a frame
            // an event ends, only how many bytes are pending after it).
            let cut = rest
                .iter()
                .position(|&b| b == b'\n' || b == b'\r')
                .map_or(rest.len(), |i| i + 1);
            let (piece, tail) = rest.split_at(cut);
            rest = tail;
            self.raw.extend_from_slice(piece);
            let mut event = None;
            let fed = self.scanner.feed(piece, |e| {
                if let Event::Sse { name, data } = e {
                    event = Some((name.to_vec(), data.bytes.to_vec()));
                }
            });
            if let Err(e) = fed {
                // Past what the reader can follow: what it did not forward is kept for a layer
                // that passes the rest on as it is (`take_held`).
                self.over = Some(None);
                let raw = std::mem::take(&mut self.raw);
                self.held.extend_from_slice(&raw);
                self.held.extend_from_slice(rest);
                return Err(e);
            }
            let complete = self.raw.len().saturating_sub(self.scanner.pending_bytes());
            if complete == 0 {
                continue;
            }
            let raw = self.raw.split_to(complete).freeze();
            let step = match &event {
                // Comments and blank lines.
                None if self.splice.is_some() => Step::Drop,
                None => Step::Pass(None),
                // After an early terminal event nothing is read: a client stops there.
                Some(_) if self.holding => Step::Hold,
                Some((name, data)) => self.event(name, data),
            };
            let rewritten = match step {
                Step::Error => {
                    // Not forwarded: kept, with what followed it, for a layer that does not
                    // resume (`take_held`), so the client then gets the upstream's own words.
                    self.over = Some(Some(Break::ErrorEvent));
                    self.held.clear();
                    self.held.extend_from_slice(&raw);
                    self.held.extend_from_slice(&self.raw);
                    self.held.extend_from_slice(rest);
                    self.raw.clear();
                    return Ok((out.freeze(), Some(Break::ErrorEvent)));
                }
                Step::Drop => continue,
                Step::Hold => {
                    self.holding = true;
                    None
                }
                Step::Pass(rewritten) => rewritten,
            };
            let bytes = match (&self.splice, &event) {
                (Some(_), Some((name, data))) => match rewritten {
                    Some(json) => framed(name, &serde_json::to_vec(&json).unwrap_or_default()),
                    None => framed(name, data),
                },
                _ => raw,
            };
            if self.holding {
                self.held.extend_from_slice(&bytes);
            } else {
                out.extend_from_slice(&bytes);
            }
        }
        Ok((out.freeze(), None))
    }

    /// The body ended: `None` when the stream finished properly (a finish reason was delivered),
    /// else why it broke: [`Break::Truncated`] (no finish reason, no terminal event) or
    /// [`Break::DoneWithoutFinish`] (a terminal event without a finish reason, whether content
    /// came before it or not: whether there is anything to resume is the layer's call, from
    /// [`sent`](Reader::sent)). After an error event: [`Break::ErrorEvent`].
    ///
    /// The bytes are what is still to be forwarded: when the stream finished, in the first
    /// stream, an incomplete last event as the upstream sent it (a transparent proxy would);
    /// else nothing. Events held back stay held (see [`take_held`](Reader::take_held)); an
    /// incomplete event is dropped. (A held event never precedes a finish: after an early
    /// terminal event the reader reads nothing more, not even a finish reason, as a client
    /// stops reading there.) On a transport error the layer need not call this.
    pub(crate) fn end(&mut self) -> (Bytes, Option<Break>) {
        if let Some(over) = self.over {
            return (Bytes::new(), over);
        }
        // An incomplete SSE event is discarded by the scanner: nothing to report.
        let _ = self.scanner.finish(|_| {});
        let verdict = if self.sent.finished {
            None
        } else if self.holding {
            Some(Break::DoneWithoutFinish)
        } else {
            Some(Break::Truncated)
        };
        let mut out = BytesMut::new();
        if verdict.is_none() {
            out = std::mem::take(&mut self.held);
            if self.splice.is_none() {
                out.extend_from_slice(&self.raw);
            }
        }
        self.raw.clear();
        self.over = Some(verdict);
        (out.freeze(), verdict)
    }

    /// Whether a terminal event came before any finish reason and is held back (the stream
    /// was interrupted, whatever ends its body next).
    pub(crate) fn holding(&self) -> bool {
        self.holding
    }

    /// What was read and not forwarded: the events held back behind an early terminal event
    /// (`data: [DONE]` or `message_stop` before a finish reason) and whatever followed them;
    /// an error event and the rest of its frame; after a [`ScanError`], everything not
    /// forwarded. Empty when there is none. For a layer that decides not to resume: forwarding
    /// them (and, when the body goes on, the rest of it as it is) ends the client's stream as
    /// the upstream ended it.
    pub(crate) fn take_held(&mut self) -> Bytes {
        self.held.split().freeze()
    }

    fn event(&mut self, name: &[u8], data: &[u8]) -> Step {
        match self.api {
            Api::Chat | Api::Completions => self.openai(data),
            Api::Anthropic => self.anthropic(name, data),
        }
    }

    /// A chat or completions chunk.
    fn openai(&mut self, data: &[u8]) -> Step {
        if data.trim_ascii() == b"[DONE]" {
            return if self.sent.finished {
                Step::Pass(None)
            } else {
                Step::Hold
            };
        }
        let Ok(Value::Object(mut chunk)) = serde_json::from_slice::<Value>(data) else {
            // Not a JSON object: not this reader's to judge (the classifier's); passed on.
            return Step::Pass(None);
        };
        if chunk.get("error").is_some_and(|e| !e.is_null()) {
            return Step::Error;
        }
        let rewrite = self.splice.is_some();
        let sent = &mut self.sent;
        pin_str(&mut chunk, "id", &mut sent.id, rewrite);
        pin_str(&mut chunk, "model", &mut sent.model, rewrite);
        match &sent.created {
            Some(created) if rewrite && chunk.contains_key("created") => {
                chunk.insert("created".into(), created.clone());
            }
            Some(_) => {}
            None => sent.created = chunk.get("created").filter(|v| !v.is_null()).cloned(),
        }
        let choice = chunk.get("choices").and_then(|c| c.get(0));
        let delta = choice.and_then(|c| c.get("delta"));
        let content = match self.api {
            Api::Chat => delta.and_then(|d| d.get("content")),
            _ => choice.and_then(|c| c.get("text")),
        };
        let content = content.and_then(Value::as_str).unwrap_or_default();
        let present =
            |v: Option<&Value>, key: &str| v.and_then(|v| v.get(key)).is_some_and(|v| !v.is_null());
        let tool = present(delta, "tool_calls") || present(delta, "function_call");
        let finish = present(choice, "finish_reason");
        let role = present(delta, "role");
        let usage = chunk.get("usage").is_some_and(Value::is_object);
        if rewrite && role && content.is_empty() && !tool && !finish && !usage {
            return Step::Drop;
        }
        if !content.is_empty() {
            sent.text.push_str(content);
            sent.output_tokens += 1;
        }
        sent.tool_call |= tool;
        sent.finished |= finish;
        if let Some(Value::Object(usage)) = chunk.get_mut("usage") {
            match &self.splice {
                Some(splice) => rewrite_usage(
                    usage,
                    ["prompt_tokens", "completion_tokens"],
                    sent.prompt_tokens,
                    splice.base_tokens,
                ),
                None => {
                    let prompt = usage.get("prompt_tokens").and_then(Value::as_u64);
                    sent.prompt_tokens = sent.prompt_tokens.or(prompt);
                }
            }
        }
        Step::Pass(rewrite.then_some(chunk))
    }

    /// An Anthropic messages event.
    fn anthropic(&mut self, name: &[u8], data: &[u8]) -> Step {
        let parsed = serde_json::from_slice::<Value>(data).ok();
        let kind = match std::str::from_utf8(name) {
            Ok(name) if !name.is_empty() => name.to_owned(),
            _ => parsed
                .as_ref()
                .and_then(|v| v.get("type"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        };
        let is_error = parsed
            .as_ref()
            .is_some_and(|v| v.get("type").and_then(Value::as_str) == Some("error"));
        if kind == "error" || is_error {
            return Step::Error;
        }
        let Some(Value::Object(mut ev)) = parsed else {
            return Step::Pass(None);
        };
        let continuing = self.splice.is_some();
        let sent = &mut self.sent;
        match kind.as_str() {
            "ping" if continuing => return Step::Drop,
            "message_start" => {
                let message = ev.get("message");
                let field = |key: &str| message.and_then(|m| m.get(key)).and_then(Value::as_str);
                sent.id = sent.id.take().or_else(|| field("id").map(str::to_owned));
                sent.model = sent
                    .model
                    .take()
                    .or_else(|| field("model").map(str::to_owned));
                if continuing {
                    return Step::Drop;
                }
                let usage = message.and_then(|m| m.get("usage"));
                let input = usage
                    .and_then(|u| u.get("input_tokens"))
                    .and_then(Value::as_u64);
                sent.prompt_tokens = sent.prompt_tokens.or(input);
            }
            "content_block_start" => {
                let block = ev.get("content_block").and_then(|b| b.get("type"));
                let block = block.and_then(Value::as_str).unwrap_or_default();
                sent.tool_call |= matches!(block, "tool_use" | "server_tool_use");
                let index = ev.get("index").and_then(Value::as_u64);
                if let Some(splice) = &mut self.splice
                    && splice.block_offset.is_none()
                    && let (Some(open), "text", Some(index)) = (sent.anthropic_block, block, index)
                {
                    // The continuation's text block goes on with the first stream's.
                    splice.block_offset = Some(signed(open) - signed(index));
                    return Step::Drop;
                }
                if let Some(index) = self.remap(&mut ev, true) {
                    self.sent.anthropic_block = Some(index);
                    self.sent.anthropic_blocks = self.sent.anthropic_blocks.max(index + 1);
                }
            }
            "content_block_delta" => {
                self.remap(&mut ev, false);
                let delta = ev.get("delta");
                let field = |key: &str| delta.and_then(|d| d.get(key)).and_then(Value::as_str);
                match field("type") {
                    Some("text_delta") => {
                        let text = field("text").unwrap_or_default();
                        if !text.is_empty() {
                            self.sent.text.push_str(text);
                            self.sent.output_tokens += 1;
                        }
                    }
                    Some("input_json_delta") => self.sent.tool_call = true,
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = self.remap(&mut ev, false);
                if index.is_some() && index == self.sent.anthropic_block {
                    self.sent.anthropic_block = None;
                }
            }
            "message_delta" => {
                let stop = ev.get("delta").and_then(|d| d.get("stop_reason"));
                sent.finished |= stop.is_some_and(|s| !s.is_null());
                if let Some(splice) = &self.splice
                    && let Some(Value::Object(usage)) = ev.get_mut("usage")
                {
                    let keys = ["input_tokens", "output_tokens"];
                    rewrite_usage(usage, keys, sent.prompt_tokens, splice.base_tokens);
                }
            }
            "message_stop" if !sent.finished => return Step::Hold,
            _ => {
                self.remap(&mut ev, false);
            }
        }
        Step::Pass(continuing.then_some(ev))
    }

    /// In a continuation, rewrites the event's block `index` to go on from the first stream's
    /// blocks; returns the (rewritten) index. The offset is fixed at the first block event: a
    /// new block (`start`) takes the next index, anything else the block in progress.
    fn remap(&mut self, ev: &mut Map<String, Value>, start: bool) -> Option<u64> {
        let index = ev.get("index").and_then(Value::as_u64)?;
        let Some(splice) = &mut self.splice else {
            return Some(index);
        };
        let sent = &self.sent;
        let offset = *splice.block_offset.get_or_insert_with(|| {
            let target = match sent.anthropic_block {
                Some(open) if !start => open,
                _ => sent.anthropic_blocks,
            };
            signed(target) - signed(index)
        });
        let mapped = u64::try_from(signed(index) + offset).unwrap_or(0);
        ev.insert("index".into(), Value::from(mapped));
        Some(mapped)
    }
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Records the first `key` seen in `slot`; with `rewrite`, replaces a present `key` by it.
fn pin_str(chunk: &mut Map<String, Value>, key: &str, slot: &mut Option<String>, rewrite: bool) {
    match slot {
        Some(first) if rewrite && chunk.contains_key(key) => {
            chunk.insert(key.into(), Value::from(first.as_str()));
        }
        Some(_) => {}
        None => *slot = chunk.get(key).and_then(Value::as_str).map(str::to_owned),
    }
}

/// A continuation's usage block: `[prompt, output]` keys; prompt tokens are the first stream's
/// (when known), output tokens count what was sent before too, `total_tokens` (when present) is
/// recomputed.
fn rewrite_usage(usage: &mut Map<String, Value>, keys: [&str; 2], prompt: Option<u64>, base: u64) {
    let [prompt_key, output_key] = keys;
    if let Some(prompt) = prompt
        && usage.contains_key(prompt_key)
    {
        usage.insert(prompt_key.into(), Value::from(prompt));
    }
    if let Some(output) = usage.get(output_key).and_then(Value::as_u64) {
        usage.insert(output_key.into(), Value::from(output + base));
    }
    let count = |key: &str| usage.get(key).and_then(Value::as_u64);
    if usage.contains_key("total_tokens")
        && let (Some(p), Some(o)) = (count(prompt_key), count(output_key))
    {
        usage.insert("total_tokens".into(), Value::from(p + o));
    }
}

/// One event, serialized: `event: <name>\n` when named, a `data:` line per line of data, a
/// blank line.
pub(super) fn framed(name: &[u8], data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(name.len() + data.len() + 16);
    if !name.is_empty() {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name);
        out.extend_from_slice(b"\n");
    }
    for line in data.split(|&b| b == b'\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line);
        out.extend_from_slice(b"\n");
    }
    out.extend_from_slice(b"\n");
    out.freeze()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const CHAT: &str = include_str!("testdata/llamacpp-chat-stream.sse");
    const CHAT_LENGTH: &str = include_str!("testdata/llamacpp-chat-stream-usage.sse");
    const COMPLETIONS: &str = include_str!("testdata/llamacpp-completions-stream.sse");
    const INTERRUPTED: &[u8] = include_bytes!("testdata/llamacpp-chat-stream-interrupted.http");
    const ANTHROPIC: &str = include_str!("testdata/llmock-anthropic-messages-stream.sse");
    const TRUNCATED: &str = include_str!("testdata/llmock-openai-chat-stream-truncated.sse");
    const TOOL_CALL: &str = include_str!("testdata/llmock-openai-tool-call-stream.sse");
    const USAGE: &str = include_str!("testdata/llmock-openai-chat-stream-usage.sse");

    /// Feeds `input` in frames of `size` bytes, then ends the body: everything forwarded (the
    /// end's bytes included), the breaks the frames reported, and the end's verdict. Checks on
    /// the way that the client only ever holds whole events.
    fn run(reader: &mut Reader, input: &[u8], size: usize) -> (Vec<u8>, Vec<Break>, Option<Break>) {
        let mut out = Vec::new();
        let mut breaks = Vec::new();
        let mut client = SseScanner::new();
        for chunk in input.chunks(size.max(1)) {
            let (bytes, brk) = reader.frame(chunk).expect("no scan error");
            out.extend_from_slice(&bytes);
            breaks.extend(brk);
            client.feed(&bytes, |_| {}).unwrap();
            assert_eq!(client.pending_bytes(), 0, "the client holds half an event");
        }
        let (bytes, end) = reader.end();
        out.extend_from_slice(&bytes);
        (out, breaks, end)
    }

    /// Feeds `input` whole and returns what was forwarded (no end).
    fn feed(reader: &mut Reader, input: &str) -> Vec<u8> {
        let (bytes, brk) = reader.frame(input.as_bytes()).expect("no scan error");
        assert_eq!(brk, None);
        bytes.to_vec()
    }

    /// The events of a body, read with a scanner of their own: (name, data); comments as
    /// `("comment", "")`.
    fn scan(body: &[u8]) -> Vec<(String, String)> {
        let mut scanner = SseScanner::new();
        let mut events = Vec::new();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        scanner
            .feed(body, |e| match e {
                Event::Sse { name, data } => events.push((text(name), text(data.bytes))),
                Event::Comment { .. } => events.push(("comment".into(), String::new())),
                _ => {}
            })
            .unwrap();
        events
    }

    fn json_events(body: &[u8]) -> Vec<Value> {
        let events = scan(body).into_iter();
        events
            .filter_map(|(_, data)| serde_json::from_str(&data).ok())
            .collect()
    }

    /// The content text of a stream, read independently of the reader.
    fn content(api: Api, body: &[u8]) -> String {
        let piece = |v: &Value| match api {
            Api::Chat => v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned),
            Api::Completions => v["choices"][0]["text"].as_str().map(str::to_owned),
            Api::Anthropic => v["delta"]["text"].as_str().map(str::to_owned),
        };
        json_events(body).iter().filter_map(piece).collect()
    }

    /// The raw events of a fixture with LF line ends, each with its blank line.
    fn split(body: &str) -> Vec<&str> {
        body.split_inclusive("\n\n").collect()
    }

    /// One `data:` event of a fixture, its JSON changed by `f`, re-serialized (event name kept).
    fn alter(event: &str, f: impl FnOnce(&mut Value)) -> String {
        let (name, data) = scan(event.as_bytes()).remove(0);
        let mut json: Value = serde_json::from_str(&data).expect("json event");
        f(&mut json);
        let name = if name.is_empty() {
            String::new()
        } else {
            format!("event: {name}\n")
        };
        format!("{name}data: {json}\n\n")
    }

    /// A chat/completions chunk of another replica.
    fn other_replica(event: &str) -> String {
        if event.contains("[DONE]") {
            return event.to_owned();
        }
        alter(event, |v| {
            v["id"] = json!("chatcmpl-other");
            v["created"] = json!(1);
            v["model"] = json!("other-model");
        })
    }

    /// Removes the HTTP/1.1 head and chunked framing of a raw capture (which may lack the last
    /// chunk).
    fn dechunk(http: &[u8]) -> Vec<u8> {
        fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
            hay.windows(needle.len()).position(|w| w == needle)
        }
        let mut rest = &http[find(http, b"\r\n\r\n").unwrap() + 4..];
        let mut body = Vec::new();
        while let Some(eol) = find(rest, b"\r\n") {
            let size = std::str::from_utf8(&rest[..eol]).unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            if size == 0 {
                break;
            }
            rest = &rest[eol + 2..];
            body.extend_from_slice(&rest[..size]);
            rest = rest[size..].strip_prefix(b"\r\n").unwrap_or(&rest[size..]);
        }
        body
    }

    #[test]
    fn first_stream_is_forwarded_as_it_is() {
        let fixtures = [
            (Api::Chat, CHAT),
            (Api::Chat, CHAT_LENGTH),
            (Api::Chat, USAGE),
            (Api::Chat, TOOL_CALL),
            (Api::Completions, COMPLETIONS),
            (Api::Anthropic, ANTHROPIC),
        ];
        for (api, fixture) in fixtures {
            let input = fixture.as_bytes();
            for size in [usize::MAX, 1, 2, 7, 64] {
                let mut reader = Reader::first(api);
                let (out, breaks, end) = run(&mut reader, input, size);
                assert_eq!(out, input, "{api:?} in frames of {size}");
                assert_eq!((breaks, end), (vec![], None));
                let sent = reader.sent();
                assert_eq!(sent.text, content(api, input));
                assert!(sent.finished);
            }
        }
    }

    #[test]
    fn sent_records_the_first_stream() {
        let mut reader = Reader::first(Api::Chat);
        run(&mut reader, USAGE.as_bytes(), 1);
        let sent = reader.sent();
        assert_eq!(
            sent.text,
            "Hi there. This is a simulated reply from gpt-4o."
        );
        // The role chunk's empty content is not a content event.
        assert_eq!(sent.output_tokens, 9);
        assert_eq!(
            sent.id.as_deref(),
            Some("chatcmpl-21ecc9dad7984739b46b4a83")
        );
        assert_eq!(sent.created, Some(json!(1796053661)));
        assert_eq!(sent.model.as_deref(), Some("gpt-4o"));
        assert_eq!(sent.prompt_tokens, Some(5));
        assert!(!sent.tool_call);

        let mut reader = Reader::first(Api::Anthropic);
        run(&mut reader, ANTHROPIC.as_bytes(), usize::MAX);
        let sent = reader.sent();
        assert_eq!(sent.id.as_deref(), Some("msg_6771257e463240f88c0c5e52"));
        assert_eq!(sent.model.as_deref(), Some("claude-sonnet-4-5"));
        assert_eq!(sent.prompt_tokens, Some(5));
        assert_eq!(sent.output_tokens, 10);
        assert_eq!((sent.anthropic_block, sent.anthropic_blocks), (None, 1));

        let mut reader = Reader::first(Api::Completions);
        run(&mut reader, COMPLETIONS.as_bytes(), 3);
        assert_eq!(reader.sent().text, ", the city of Nova Haven was a");
        assert_eq!(reader.sent().output_tokens, 8);
    }

    #[test]
    fn crlf_streams_are_forwarded_as_they_are() {
        let crlf = CHAT.replace('\n', "\r\n");
        for size in [usize::MAX, 1, 5] {
            let mut reader = Reader::first(Api::Chat);
            let (out, _, end) = run(&mut reader, crlf.as_bytes(), size);
            assert_eq!(out, crlf.as_bytes());
            assert_eq!(end, None);
            assert_eq!(reader.sent().text, content(Api::Chat, CHAT.as_bytes()));
        }
    }

    #[test]
    fn comments_are_forwarded_in_the_first_stream() {
        let events = split(USAGE);
        let with_comments = format!(
            ": keepalive\n\n{}{}: keepalive\n\n{}",
            events[0],
            events[1],
            events[2..].concat()
        );
        let mut reader = Reader::first(Api::Chat);
        let (out, _, end) = run(&mut reader, with_comments.as_bytes(), 1);
        assert_eq!(out, with_comments.as_bytes());
        assert_eq!(end, None);
    }

    #[test]
    fn an_incomplete_event_is_held_back() {
        let events = split(USAGE);
        let two = events[..2].concat();
        let cut = two.len() + events[2].len() / 2;
        let mut reader = Reader::first(Api::Chat);
        assert_eq!(feed(&mut reader, &USAGE[..cut]), two.as_bytes());
        assert_eq!(reader.sent().text, "Hi ");
        // The rest completes it.
        let rest = feed(&mut reader, &USAGE[cut..]);
        assert_eq!([two.as_bytes(), rest.as_slice()].concat(), USAGE.as_bytes());

        // Or the body ends there: the half event is never forwarded.
        let mut reader = Reader::first(Api::Chat);
        let (out, breaks, end) = run(&mut reader, &USAGE.as_bytes()[..cut], 1);
        assert_eq!(out, two.as_bytes());
        assert_eq!((breaks, end), (vec![], Some(Break::Truncated)));
    }

    #[test]
    fn an_incomplete_tail_after_the_finish_is_forwarded_at_the_end() {
        let input = &USAGE.as_bytes()[..USAGE.len() - 1];
        let mut reader = Reader::first(Api::Chat);
        let (out, _, end) = run(&mut reader, input, 1);
        assert_eq!((out.as_slice(), end), (input, None));
    }

    #[test]
    fn a_truncated_stream_breaks_at_the_end() {
        for size in [usize::MAX, 1] {
            let mut reader = Reader::first(Api::Chat);
            let (out, breaks, end) = run(&mut reader, TRUNCATED.as_bytes(), size);
            assert_eq!(out, TRUNCATED.as_bytes());
            assert_eq!((breaks, end), (vec![], Some(Break::Truncated)));
            assert_eq!(reader.sent().text, "Hi there. This is ");
            assert!(!reader.sent().finished);
        }
    }

    #[test]
    fn llamacpp_interrupted_done_is_held_back() {
        let body = dechunk(INTERRUPTED);
        let body_text = std::str::from_utf8(&body).unwrap();
        let role_chunk = split(body_text)[0];
        assert!(body.ends_with(b"data: [DONE]\n\n"));
        for size in [usize::MAX, 1, 3] {
            let mut reader = Reader::first(Api::Chat);
            let (out, breaks, end) = run(&mut reader, &body, size);
            assert_eq!(out, role_chunk.as_bytes(), "no [DONE] forwarded");
            assert_eq!((breaks, end), (vec![], Some(Break::DoneWithoutFinish)));
            assert_eq!(reader.sent().text, "");
            // A layer that does not resume forwards the held [DONE].
            assert_eq!(reader.take_held(), "data: [DONE]\n\n");
            assert!(reader.take_held().is_empty());
        }
        // The same after content.
        let events = split(TRUNCATED);
        let input = format!("{}data: [DONE]\n\n", events.concat());
        let mut reader = Reader::first(Api::Chat);
        let (out, _, end) = run(&mut reader, input.as_bytes(), usize::MAX);
        assert_eq!(
            (out, end),
            (
                TRUNCATED.as_bytes().to_vec(),
                Some(Break::DoneWithoutFinish)
            )
        );
    }

    #[test]
    fn nothing_after_an_early_done_is_read() {
        let events = split(USAGE);
        let late = [events[10], events[11]].concat();
        let input = format!(
            "{}data: [DONE]\n\n: keepalive\n\n{late}",
            events[..3].concat()
        );
        let mut reader = Reader::first(Api::Chat);
        let (out, breaks, end) = run(&mut reader, input.as_bytes(), 4);
        assert_eq!(out, events[..3].concat().as_bytes());
        // The finish reason after [DONE] does not count: a client stops reading at [DONE].
        assert_eq!((breaks, end), (vec![], Some(Break::DoneWithoutFinish)));
        assert!(!reader.sent().finished);
        let held = format!("data: [DONE]\n\n: keepalive\n\n{late}");
        assert_eq!(reader.take_held(), held.as_bytes());
    }

    #[test]
    fn an_error_event_breaks_the_stream_mid_frame() {
        let events = split(USAGE);
        let error = "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n";
        let input = format!("{}{}{error}{}", events[0], events[1], events[2]);
        let mut reader = Reader::first(Api::Chat);
        let (out, brk) = reader.frame(input.as_bytes()).unwrap();
        assert_eq!(out, [events[0], events[1]].concat().as_bytes());
        assert_eq!(brk, Some(Break::ErrorEvent));
        assert_eq!(reader.sent().text, "Hi ");
        // Anything later is ignored; the end says the same.
        let (out, brk) = reader.frame(events[3].as_bytes()).unwrap();
        assert_eq!((out.len(), brk), (0, None));
        assert_eq!(reader.end(), (Bytes::new(), Some(Break::ErrorEvent)));

        // Byte by byte: the same bytes, one break.
        let mut reader = Reader::first(Api::Chat);
        let (out, breaks, end) = run(&mut reader, input.as_bytes(), 1);
        assert_eq!(out, [events[0], events[1]].concat().as_bytes());
        assert_eq!(
            (breaks, end),
            (vec![Break::ErrorEvent], Some(Break::ErrorEvent))
        );
    }

    #[test]
    fn an_anthropic_error_event_breaks_the_stream() {
        let events = split(ANTHROPIC);
        let error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
        let input = format!("{}{error}{}", events[..5].concat(), events[5]);
        let mut reader = Reader::first(Api::Anthropic);
        let (out, brk) = reader.frame(input.as_bytes()).unwrap();
        assert_eq!(out, events[..5].concat().as_bytes());
        assert_eq!(brk, Some(Break::ErrorEvent));
        assert_eq!(reader.sent().text, "claude-sonnet-4-5 mock ");
    }

    #[test]
    fn anthropic_message_stop_without_a_stop_reason_is_held_back() {
        let events = split(ANTHROPIC);
        let (stop, delta) = (events[events.len() - 1], events[events.len() - 2]);
        assert!(delta.contains("message_delta") && stop.contains("message_stop"));
        let before = events[..events.len() - 2].concat();
        let input = format!("{before}{stop}");
        let mut reader = Reader::first(Api::Anthropic);
        let (out, _, end) = run(&mut reader, input.as_bytes(), 1);
        assert_eq!(out, before.as_bytes());
        assert_eq!(end, Some(Break::DoneWithoutFinish));
    }

    #[test]
    fn a_tool_call_is_recorded() {
        let mut reader = Reader::first(Api::Chat);
        run(&mut reader, TOOL_CALL.as_bytes(), 1);
        assert!(reader.sent().tool_call);
        assert_eq!(reader.sent().text, "");

        let tool = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\"}}\n\n";
        let mut reader = Reader::first(Api::Anthropic);
        feed(&mut reader, tool);
        assert!(reader.sent().tool_call);
        assert_eq!(reader.sent().anthropic_block, Some(1));
    }

    #[test]
    fn chat_continuation_is_spliced_into_one_stream() {
        let events = split(USAGE);
        // The first stream: role chunk and three content chunks, then the connection drops.
        let mut first = Reader::first(Api::Chat);
        let mut out = feed(&mut first, &events[..4].concat());
        let sent = first.sent().clone();
        assert_eq!(
            (sent.text.as_str(), sent.output_tokens),
            ("Hi there. This ", 3)
        );
        // Another replica goes on: its own role preamble and ids, a keepalive, the rest, and
        // usage of its own (its prompt holds the prefill).
        let mut second = other_replica(events[0]);
        second.push_str(": keepalive\n\n");
        for event in &events[4..events.len() - 2] {
            second.push_str(&other_replica(event));
        }
        second.push_str(&alter(&other_replica(events[events.len() - 2]), |v| {
            v["usage"] = json!({"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15});
        }));
        second.push_str(events[events.len() - 1]);
        let mut cont = Reader::continuing(Api::Chat, sent);
        let (rest, breaks, end) = run(&mut cont, second.as_bytes(), 5);
        assert_eq!((breaks, end), (vec![], None));
        out.extend_from_slice(&rest);

        let chunks = json_events(&out);
        assert_eq!(chunks.len(), events.len() - 1);
        for chunk in &chunks {
            assert_eq!(chunk["id"], "chatcmpl-21ecc9dad7984739b46b4a83");
            assert_eq!(chunk["created"], 1796053661);
            assert_eq!(chunk["model"], "gpt-4o");
        }
        let roles = chunks
            .iter()
            .filter(|c| !c["choices"][0]["delta"]["role"].is_null());
        assert_eq!(roles.count(), 1);
        assert_eq!(
            content(Api::Chat, &out),
            content(Api::Chat, USAGE.as_bytes())
        );
        let usage = &chunks.last().unwrap()["usage"];
        assert_eq!(
            *usage,
            json!({"prompt_tokens": 9, "completion_tokens": 9, "total_tokens": 18})
        );
        let all = scan(&out);
        assert!(all.iter().all(|(name, _)| name != "comment"));
        assert_eq!(all.last().unwrap().1, "[DONE]");
        assert_eq!(cont.sent().text, content(Api::Chat, USAGE.as_bytes()));
        assert_eq!(cont.sent().output_tokens, 9);
    }

    #[test]
    fn continuation_usage_takes_the_first_prompt_tokens() {
        let sent = Sent {
            text: "Hi".into(),
            output_tokens: 3,
            id: Some("first".into()),
            prompt_tokens: Some(5),
            ..Sent::default()
        };
        let usage = "data: {\"id\":\"second\",\"choices\":[],\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":6,\"total_tokens\":14}}\n\n";
        let mut cont = Reader::continuing(Api::Chat, sent);
        let out = feed(&mut cont, usage);
        let chunk = &json_events(&out)[0];
        assert_eq!(chunk["id"], "first");
        assert_eq!(
            chunk["usage"],
            json!({"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14})
        );
    }

    #[test]
    fn completions_continuation_is_spliced_into_one_stream() {
        let events = split(COMPLETIONS);
        let mut first = Reader::first(Api::Completions);
        let mut out = feed(&mut first, &events[..4].concat());
        let second: String = events[4..].iter().copied().map(other_replica).collect();
        let mut cont = Reader::continuing(Api::Completions, first.sent().clone());
        let (rest, _, end) = run(&mut cont, second.as_bytes(), 1);
        assert_eq!(end, None);
        out.extend_from_slice(&rest);
        let chunks = json_events(&out);
        assert_eq!(chunks.len(), events.len() - 1);
        assert!(
            chunks
                .iter()
                .all(|c| c["id"] == "cmpl-9222d959-de1a-4bb1-adb1-483e7ae172a9")
        );
        assert!(
            chunks
                .iter()
                .all(|c| c["model"] == "default" && c["created"] == 1796053654)
        );
        assert_eq!(
            content(Api::Completions, &out),
            content(Api::Completions, COMPLETIONS.as_bytes())
        );
        assert!(out.ends_with(b"data: [DONE]\n\n"));
    }

    #[test]
    fn anthropic_continuation_is_spliced_into_one_stream() {
        let events = split(ANTHROPIC);
        // message_start, content_block_start, ping, three text deltas; then the stream breaks.
        let mut first = Reader::first(Api::Anthropic);
        let mut out = feed(&mut first, &events[..6].concat());
        let sent = first.sent().clone();
        assert_eq!((sent.output_tokens, sent.anthropic_block), (3, Some(0)));
        let mut second = alter(events[0], |v| {
            v["message"]["id"] = json!("msg_other");
            v["message"]["model"] = json!("other-model");
            v["message"]["usage"]["input_tokens"] = json!(12);
        });
        second.push_str(&events[1..3].concat());
        second.push_str(": keepalive\n\n");
        second.push_str(&events[6..events.len() - 2].concat());
        second.push_str(&alter(events[events.len() - 2], |v| {
            v["usage"]["output_tokens"] = json!(7);
        }));
        second.push_str(events[events.len() - 1]);
        let mut cont = Reader::continuing(Api::Anthropic, sent);
        let (rest, breaks, end) = run(&mut cont, second.as_bytes(), 3);
        assert_eq!((breaks, end), (vec![], None));
        out.extend_from_slice(&rest);

        let all = scan(&out);
        let names: Vec<&str> = all.iter().map(|(name, _)| name.as_str()).collect();
        let count = |n: &str| names.iter().filter(|&&name| name == n).count();
        assert_eq!(count("message_start"), 1);
        assert_eq!(count("content_block_start"), 1);
        assert_eq!(count("ping"), 1);
        assert_eq!(count("comment"), 0);
        assert_eq!(names.last(), Some(&"message_stop"));
        let json = json_events(&out);
        for (event, (name, _)) in json.iter().zip(&all) {
            assert_eq!(event["type"], name.as_str(), "named as its type");
            if let Some(index) = event.get("index") {
                assert_eq!(*index, 0);
            }
        }
        assert_eq!(json[0]["message"]["id"], "msg_6771257e463240f88c0c5e52");
        assert_eq!(
            content(Api::Anthropic, &out),
            content(Api::Anthropic, ANTHROPIC.as_bytes())
        );
        let delta = json.iter().find(|e| e["type"] == "message_delta").unwrap();
        assert_eq!(delta["usage"]["output_tokens"], 10);
        assert_eq!(cont.sent().output_tokens, 10);
        assert_eq!(cont.sent().anthropic_block, None);
    }

    #[test]
    fn anthropic_continuation_after_a_closed_block_starts_the_next_one() {
        let events = split(ANTHROPIC);
        let mut first = Reader::first(Api::Anthropic);
        let mut out = feed(&mut first, &events[..events.len() - 2].concat());
        assert_eq!(first.sent().anthropic_block, None);
        let second = [
            events[0],
            events[1],
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"More.\"}}\n\n",
            events[events.len() - 3],
            events[events.len() - 2],
            events[events.len() - 1],
        ]
        .concat();
        let mut cont = Reader::continuing(Api::Anthropic, first.sent().clone());
        let (rest, _, end) = run(&mut cont, second.as_bytes(), usize::MAX);
        assert_eq!(end, None);
        out.extend_from_slice(&rest);
        let json = json_events(&out);
        let tail: Vec<(&str, u64)> = json
            .iter()
            .filter_map(|e| Some((e["type"].as_str()?, e.get("index")?.as_u64()?)))
            .skip_while(|(_, index)| *index == 0)
            .collect();
        let want: [(&str, u64); 3] = [
            ("content_block_start", 1),
            ("content_block_delta", 1),
            ("content_block_stop", 1),
        ];
        assert_eq!(tail, want);
        assert_eq!(cont.sent().anthropic_blocks, 2);
    }

    #[test]
    fn a_continuation_of_a_continuation_goes_on_from_both() {
        let events = split(USAGE);
        let mut first = Reader::first(Api::Chat);
        let mut out = feed(&mut first, &events[..3].concat());
        // The first continuation: preamble and three content chunks, then the body ends.
        let second: String = events[..1]
            .iter()
            .chain(&events[3..6])
            .copied()
            .map(other_replica)
            .collect();
        let mut cont = Reader::continuing(Api::Chat, first.sent().clone());
        let (rest, _, end) = run(&mut cont, second.as_bytes(), usize::MAX);
        assert_eq!(end, Some(Break::Truncated));
        out.extend_from_slice(&rest);
        let sent = cont.sent().clone();
        assert_eq!(
            (sent.text.as_str(), sent.output_tokens),
            ("Hi there. This is a ", 5)
        );
        // The second continuation, from the cumulative record.
        let mut third: String = events[..1]
            .iter()
            .chain(&events[6..events.len() - 2])
            .copied()
            .map(other_replica)
            .collect();
        third.push_str(&alter(&other_replica(events[events.len() - 2]), |v| {
            v["usage"] = json!({"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34});
        }));
        third.push_str(events[events.len() - 1]);
        let mut cont = Reader::continuing(Api::Chat, sent);
        let (rest, _, end) = run(&mut cont, third.as_bytes(), 2);
        assert_eq!(end, None);
        out.extend_from_slice(&rest);
        let chunks = json_events(&out);
        assert!(
            chunks
                .iter()
                .all(|c| c["id"] == "chatcmpl-21ecc9dad7984739b46b4a83")
        );
        let roles = chunks
            .iter()
            .filter(|c| !c["choices"][0]["delta"]["role"].is_null());
        assert_eq!(roles.count(), 1);
        assert_eq!(
            content(Api::Chat, &out),
            content(Api::Chat, USAGE.as_bytes())
        );
        let usage = &chunks.last().unwrap()["usage"];
        assert_eq!(
            *usage,
            json!({"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39})
        );
    }
}
