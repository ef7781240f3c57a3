//! Tiny incremental readers for the load generator: split a byte stream into events and
//! classify each as token / meta / keepalive / done / error, for OpenAI and Anthropic SSE
//! ([`SseReader`]) and Ollama-style NDJSON ([`NdjsonReader`]).
//!
//! Independent of tailguard-core's scanner on purpose: the load generator measures the layers
//! built on that scanner, so it must not share its bugs.

/// What an event means to the load generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Carries output (content, reasoning, tool-call delta, refusal, completion text,
    /// Anthropic `content_block_delta`).
    Token,
    /// Bookkeeping: role-only delta, finish chunk, usage chunk, `message_start`, ...
    Meta,
    /// A comment or `event: ping`.
    Keepalive,
    /// `data: [DONE]` or `message_stop`.
    Done,
    /// An in-band error event.
    Error,
}

/// Lines longer than this are cut (the rest of the line is skipped): the reader never buffers
/// without bound.
pub const MAX_LINE: usize = 1 << 20;

/// Incremental SSE event reader.
#[derive(Debug, Default)]
pub struct SseReader {
    line: Vec<u8>,
    skipping: bool,
    last_cr: bool,
    event: Option<String>,
    data: Vec<u8>,
    has_data: bool,
    comment: bool,
}

impl SseReader {
    /// A reader at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; calls `on_event` for every complete event.
    pub fn feed(&mut self, bytes: &[u8], mut on_event: impl FnMut(EventKind)) {
        for &b in bytes {
            if self.last_cr {
                self.last_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' | b'\r' => {
                    self.last_cr = b == b'\r';
                    if let Some(kind) = self.end_line() {
                        on_event(kind);
                    }
                }
                _ if self.skipping => {}
                _ if self.line.len() >= MAX_LINE => self.skipping = true,
                _ => self.line.push(b),
            }
        }
    }

    fn end_line(&mut self) -> Option<EventKind> {
        self.skipping = false;
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            return self.dispatch();
        }
        if line[0] == b':' {
            self.comment = true;
            return None;
        }
        let (field, value) = match line.iter().position(|&c| c == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (&line[..], &[][..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => self.event = Some(String::from_utf8_lossy(value).into_owned()),
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<EventKind> {
        let event = self.event.take();
        let data = std::mem::take(&mut self.data);
        let has_data = std::mem::replace(&mut self.has_data, false);
        let comment = std::mem::replace(&mut self.comment, false);
        if !has_data {
            return comment.then_some(EventKind::Keepalive);
        }
        Some(classify(event.as_deref(), &data))
    }
}

/// Classifies one event from its name and data.
pub fn classify(event: Option<&str>, data: &[u8]) -> EventKind {
    match event {
        Some("ping") => return EventKind::Keepalive,
        Some("message_stop") => return EventKind::Done,
        Some("error") => return EventKind::Error,
        Some("content_block_delta") => return EventKind::Token,
        Some("message_start" | "content_block_start" | "content_block_stop" | "message_delta") => {
            return EventKind::Meta;
        }
        _ => {}
    }
    if data.trim_ascii() == b"[DONE]" {
        return EventKind::Done;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        // Not JSON (or cut short): not evidence of output.
        return EventKind::Meta;
    };
    if v.get("error").is_some() || v.get("type").and_then(|t| t.as_str()) == Some("error") {
        return EventKind::Error;
    }
    match v.get("type").and_then(|t| t.as_str()) {
        Some("content_block_delta") => return EventKind::Token,
        Some("message_stop") => return EventKind::Done,
        Some("ping") => return EventKind::Keepalive,
        _ => {}
    }
    let non_empty = |x: Option<&serde_json::Value>| match x {
        Some(serde_json::Value::String(s)) => !s.is_empty(),
        Some(serde_json::Value::Array(a)) => !a.is_empty(),
        Some(serde_json::Value::Object(o)) => !o.is_empty(),
        _ => false,
    };
    let choices = v.get("choices").and_then(|c| c.as_array());
    for c in choices.into_iter().flatten() {
        if non_empty(c.get("text")) {
            return EventKind::Token;
        }
        const OUTPUT: [&str; 5] = [
            "content",
            "reasoning_content",
            "reasoning",
            "tool_calls",
            "refusal",
        ];
        if let Some(d) = c.get("delta")
            && OUTPUT.iter().any(|k| non_empty(d.get(*k)))
        {
            return EventKind::Token;
        }
    }
    EventKind::Meta
}

/// Incremental NDJSON reader: one JSON object per line.
#[derive(Debug, Default)]
pub struct NdjsonReader {
    line: Vec<u8>,
    skipping: bool,
}

impl NdjsonReader {
    /// A reader at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds bytes; calls `on_event` for every complete non-empty line.
    pub fn feed(&mut self, bytes: &[u8], mut on_event: impl FnMut(EventKind)) {
        for &b in bytes {
            match b {
                b'\n' => {
                    self.skipping = false;
                    let line = std::mem::take(&mut self.line);
                    if !line.trim_ascii().is_empty() {
                        on_event(classify_ndjson(&line));
                    }
                }
                _ if self.skipping => {}
                _ if self.line.len() >= MAX_LINE => self.skipping = true,
                _ => self.line.push(b),
            }
        }
    }

    /// Ends the stream: a last line without a line end is an event too.
    pub fn finish(&mut self, mut on_event: impl FnMut(EventKind)) {
        let line = std::mem::take(&mut self.line);
        if !line.trim_ascii().is_empty() {
            on_event(classify_ndjson(&line));
        }
    }
}

/// Classifies one NDJSON line (Ollama `/api/generate` and `/api/chat` shapes).
pub fn classify_ndjson(line: &[u8]) -> EventKind {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
        return EventKind::Meta;
    };
    if v.get("error").is_some() {
        return EventKind::Error;
    }
    let text = v
        .get("response")
        .or_else(|| v.pointer("/message/content"))
        .and_then(|t| t.as_str())
        .unwrap_or("");
    if !text.is_empty() {
        EventKind::Token
    } else if v.get("done").and_then(|d| d.as_bool()) == Some(true) {
        EventKind::Done
    } else {
        EventKind::Meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(input: &[u8], step: usize) -> Vec<EventKind> {
        let mut r = SseReader::new();
        let mut out = Vec::new();
        for chunk in input.chunks(step.max(1)) {
            r.feed(chunk, |k| out.push(k));
        }
        out
    }

    #[test]
    fn openai_and_anthropic_shapes() {
        let s = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n: keepalive\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\r\n\r\n\
data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\n\
event: ping\ndata: {\"type\":\"ping\"}\n\nevent: content_block_delta\ndata: {}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        use EventKind::*;
        let want = vec![
            Meta, Keepalive, Token, Meta, Error, Done, Keepalive, Token, Done,
        ];
        for step in [1, 2, 3, 7, 1000] {
            assert_eq!(kinds(s, step), want, "step {step}");
        }
    }

    #[test]
    fn ndjson_lines() {
        let s = b"{\"response\":\"hi\",\"done\":false}\n\n{\"message\":{\"content\":\"x\"}}\n\
{\"response\":\"\",\"done\":true}\n{\"error\":\"boom\"}\nnot json\n{\"response\":\"tail\"}";
        use EventKind::*;
        for step in [1, 3, 1000] {
            let mut r = NdjsonReader::new();
            let mut out = Vec::new();
            for chunk in s.chunks(step) {
                r.feed(chunk, |k| out.push(k));
            }
            r.finish(|k| out.push(k));
            assert_eq!(
                out,
                vec![Token, Token, Done, Error, Meta, Token],
                "step {step}"
            );
        }
    }

    #[test]
    fn long_lines_are_capped() {
        let mut s = b"data: ".to_vec();
        s.extend(std::iter::repeat_n(b'x', MAX_LINE * 2));
        s.extend_from_slice(b"\n\ndata: [DONE]\n\n");
        assert_eq!(kinds(&s, 4096), vec![EventKind::Meta, EventKind::Done]);
    }
}
