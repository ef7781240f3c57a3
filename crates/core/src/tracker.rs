//! Per-response token tracking: a scanner and a classifier driven frame by frame.

use bytes::Buf;
use http::HeaderMap;

use crate::classify::{Class, Dialect, Framing, Wire, anthropic_event, responses_event};
use crate::error::ScanError;
use crate::scan::{Captured, Event, Framer, Grpc, Limits, Ndjson, Scanner, Sse};

mod keys;

use keys::{Reasons, may_carry_usage};

/// Token usage reported by the stream itself (`include_usage` chunks, Anthropic `usage`), or by
/// a whole answer ([`Usage::from_json`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt (input) tokens.
    pub prompt_tokens: Option<u64>,
    /// Completion (output) tokens.
    pub completion_tokens: Option<u64>,
}

impl Usage {
    /// The usage a whole JSON document reports: the answer of a request that did not stream
    /// (an OpenAI chat completion, an Anthropic message, an OpenAI Responses API response).
    ///
    /// Read as [`StreamTracker::with_usage`] reads each event of a stream, by the same code:
    /// the top-level `usage` object's `prompt_tokens` and `completion_tokens` (OpenAI chat and
    /// completions) or `input_tokens` and `output_tokens` (Anthropic's message, the Responses
    /// API's response); for an Anthropic `message_start` event, the input tokens of
    /// `message.usage`. `None` when `bytes` is not JSON, has no `usage` object, or that object
    /// holds none of these counts; a count that is missing (or not an unsigned integer) is
    /// `None` in the result.
    ///
    /// ```
    /// use tailguard_core::Usage;
    ///
    /// let completion = br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[],
    ///     "usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#;
    /// let usage = Usage::from_json(completion).unwrap();
    /// assert_eq!((usage.prompt_tokens, usage.completion_tokens), (Some(9), Some(12)));
    /// assert_eq!(Usage::from_json(br#"{"choices":[]}"#), None);
    /// ```
    pub fn from_json(bytes: &[u8]) -> Option<Usage> {
        let mut usage = Usage::default();
        usage.update_from_json(bytes).then_some(usage)
    }

    /// Overwrites the counts that `bytes`, one JSON value, reports (see
    /// [`from_json`](Self::from_json)); whether it reported any. Values whose bytes hold no
    /// `"usage"` member with an object are not parsed.
    fn update_from_json(&mut self, bytes: &[u8]) -> bool {
        if !may_carry_usage(bytes) {
            return false;
        }
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
            return false;
        };
        let field = |v: Option<&serde_json::Value>, key: &str| {
            v.and_then(|u| u.get(key)).and_then(|n| n.as_u64())
        };
        let mut seen = false;
        let mut set = |slot: &mut Option<u64>, n: Option<u64>| {
            if let Some(n) = n {
                *slot = Some(n);
                seen = true;
            }
        };
        let top = value.get("usage").filter(|u| u.is_object());
        // OpenAI: `usage.prompt_tokens` / `usage.completion_tokens`.
        set(&mut self.prompt_tokens, field(top, "prompt_tokens"));
        set(&mut self.completion_tokens, field(top, "completion_tokens"));
        let typ = value.get("type").and_then(|t| t.as_str());
        // Anthropic: input tokens in `message_start.message.usage`, output tokens in
        // `message_delta.usage` (the count in `message_start` is a placeholder). A whole
        // Anthropic message (`"type":"message"`) and a Responses API response (no `type`) have
        // both at the top.
        // A streamed Responses API answer reports it in its terminal event's response
        // (`response.completed`, `.incomplete`, `.failed`: `response.usage`).
        if typ == Some("message_start") {
            let inner = value.get("message").and_then(|m| m.get("usage"));
            set(&mut self.prompt_tokens, field(inner, "input_tokens"));
        } else if typ.is_some_and(|t| t.starts_with("response.")) {
            let inner = value.get("response").and_then(|r| r.get("usage"));
            set(&mut self.prompt_tokens, field(inner, "input_tokens"));
            set(&mut self.completion_tokens, field(inner, "output_tokens"));
        } else {
            set(&mut self.prompt_tokens, field(top, "input_tokens"));
            set(&mut self.completion_tokens, field(top, "output_tokens"));
        }
        seen
    }
}

/// What one frame (or the end of the body) contained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Observation {
    /// Complete events in this frame (all classes).
    pub events: u32,
    /// Token events.
    pub tokens: u32,
    /// Meta events.
    pub meta: u32,
    /// Keepalive events (comments, pings).
    pub keepalives: u32,
    /// The frame completed a `done` event.
    pub done: bool,
    /// The frame completed an in-band error event.
    pub error: bool,
    /// The frame completed a [`Class::Malformed`] event: junk the dialect cannot carry (for the
    /// OpenAI and Anthropic dialects, data that is not a JSON object), a protocol error. It
    /// counts as an event, never as a token; a layer that sees it ends the stream (or, before
    /// the first token, fails the attempt) instead of passing the junk on.
    pub malformed: bool,
    /// This frame carried the stream's first token.
    pub first_token: bool,
    /// The frame completed an event that ends the answer before any token: a finish reason
    /// (OpenAI `finish_reason`, Anthropic `stop_reason`) with no output. A terminal event after
    /// it ends an answer that is empty, not one cut short (an interrupting server's bare
    /// `[DONE]` comes with no finish reason).
    pub finished: bool,
    /// The scanner met an item over its cap; the tracker scans nothing more after this.
    pub scan_error: Option<ScanError>,
}

impl Observation {
    /// Whether the frame carried progress: any event that is not a keepalive.
    pub fn progress(&self) -> bool {
        self.events > self.keepalives
    }
}

/// Tracks tokens through one response body.
///
/// Built from the response headers (which choose the framing under [`Dialect::Auto`]), then fed
/// every data frame with [`observe`](StreamTracker::observe), the trailers with
/// [`observe_trailers`](StreamTracker::observe_trailers), and the end of the body with
/// [`finish`](StreamTracker::finish).
///
/// Before the first token the classifier sees each event's whole data (and the presets parse
/// its JSON); from the first token on it sees only
/// [`Classify::capture_after_first_token`](crate::Classify::capture_after_first_token) bytes of
/// each event, and the scanner copies no more than that out of the stream (unless usage
/// extraction is on, see [`with_usage`](StreamTracker::with_usage)). After a [`ScanError`] the
/// tracker reports it once and scans nothing more.
#[derive(Debug)]
pub struct StreamTracker {
    /// `None` for an opaque body, whose every non-empty frame is one [`Event::Bytes`].
    scanner: Option<Scanner<AnyFraming>>,
    state: State,
}

/// The framing of a tracked body, chosen per response.
#[derive(Debug)]
enum AnyFraming {
    Sse(Sse),
    Grpc(Grpc),
    Ndjson(Ndjson),
}

impl Framer for AnyFraming {
    fn limits(&self) -> &Limits {
        match self {
            AnyFraming::Sse(f) => f.limits(),
            AnyFraming::Grpc(f) => f.limits(),
            AnyFraming::Ndjson(f) => f.limits(),
        }
    }

    fn limits_mut(&mut self) -> &mut Limits {
        match self {
            AnyFraming::Sse(f) => f.limits_mut(),
            AnyFraming::Grpc(f) => f.limits_mut(),
            AnyFraming::Ndjson(f) => f.limits_mut(),
        }
    }

    fn feed(
        &mut self,
        chunk: &[u8],
        on_event: &mut impl FnMut(Event<'_>),
    ) -> Result<(), ScanError> {
        match self {
            AnyFraming::Sse(f) => f.feed(chunk, on_event),
            AnyFraming::Grpc(f) => f.feed(chunk, on_event),
            AnyFraming::Ndjson(f) => f.feed(chunk, on_event),
        }
    }

    fn finish(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
        match self {
            AnyFraming::Sse(f) => f.finish(on_event),
            AnyFraming::Grpc(f) => f.finish(on_event),
            AnyFraming::Ndjson(f) => f.finish(on_event),
        }
    }
}

#[derive(Debug)]
struct State {
    /// The resolved dialect: its classifier decides every event.
    dialect: Dialect,
    /// Whether the wire turns Anthropic when an Anthropic event name appears.
    detect_anthropic: bool,
    wire: Wire,
    first_token_seen: bool,
    /// A finish reason came before any token (see [`Observation::finished`]).
    finished_empty: bool,
    /// Whole events are captured after the first token so that a finish reason is found (see
    /// [`StreamTracker::with_finish`]).
    want_finish: bool,
    /// A finish reason came, before or after the first token (see
    /// [`StreamTracker::finish_seen`]).
    finish_seen: bool,
    events: u64,
    tokens: u64,
    failed: bool,
    usage: Option<UsageState>,
    /// How many bytes of an event's data the classifier sees (see
    /// [`StreamTracker::set_capture`]).
    class_limit: usize,
}

#[derive(Debug, Default)]
struct UsageState {
    usage: Usage,
    seen: bool,
}

impl StreamTracker {
    /// A tracker for a response with `headers`, finding tokens as `dialect` says.
    pub fn new(dialect: &Dialect, headers: &HeaderMap) -> Self {
        let dialect = dialect.resolve(headers);
        let framing = dialect.framing().unwrap_or(Framing::Sse);
        let wire = match (&dialect, framing) {
            (Dialect::Anthropic, _) => Wire::AnthropicSse,
            (Dialect::Auto | Dialect::LlmSse | Dialect::OpenAi, _) => Wire::OpenAiSse,
            (_, Framing::Sse) => Wire::Sse,
            (_, Framing::Grpc) => Wire::Grpc,
            (_, Framing::Ndjson) => Wire::Ndjson,
            (_, Framing::Bytes) => Wire::Opaque,
        };
        StreamTracker {
            scanner: match framing {
                Framing::Sse => Some(AnyFraming::Sse(Sse::default())),
                Framing::Grpc => Some(AnyFraming::Grpc(Grpc::default())),
                Framing::Ndjson => Some(AnyFraming::Ndjson(Ndjson::default())),
                Framing::Bytes => None,
            }
            .map(Scanner::with_framing),
            state: State {
                detect_anthropic: matches!(dialect, Dialect::Auto | Dialect::LlmSse),
                dialect,
                wire,
                first_token_seen: false,
                finished_empty: false,
                want_finish: false,
                finish_seen: false,
                events: 0,
                tokens: 0,
                failed: false,
                usage: None,
                class_limit: usize::MAX,
            },
        }
    }

    /// Sets the cap on one line/event/message (default
    /// [`DEFAULT_MAX_EVENT_BYTES`](crate::scan::DEFAULT_MAX_EVENT_BYTES)).
    pub fn with_max_event_bytes(mut self, max: usize) -> Self {
        self.scanner = self.scanner.map(|s| s.with_max_event_bytes(max));
        self
    }

    /// Also extracts [`Usage`] from the stream (off by default: it captures the data of events
    /// that may carry usage after the first token), and counts output exactly: after the first
    /// token an event with a `"finish_reason"` string is classified whole, by the rules used
    /// before the first token, so a chunk that carries only the finish reason (OpenAI's last
    /// chunk, `"delta":{}`) is meta, not a token. This is the recorder's mode; the other layers
    /// only need to know that output goes on, which a finish chunk tells them too.
    pub fn with_usage(mut self, usage: bool) -> Self {
        self.state.usage = usage.then(UsageState::default);
        self.set_capture();
        self
    }

    /// Also finds a finish reason after the first token (off by default: it captures whole
    /// events, which [`with_usage`](StreamTracker::with_usage) does too): see
    /// [`finish_seen`](StreamTracker::finish_seen).
    pub fn with_finish(mut self, finish: bool) -> Self {
        self.state.want_finish = finish;
        self.set_capture();
        self
    }

    /// Scans one data frame.
    pub fn observe<D: Buf + ?Sized>(&mut self, data: &D) -> Observation {
        self.scan(|scanner, on_event| match scanner {
            Some(s) => s.feed_buf(data, on_event),
            None => {
                let len = data.remaining();
                if len > 0 {
                    on_event(Event::Bytes { len });
                }
                Ok(())
            }
        })
    }

    /// Looks at the trailers (a gRPC `grpc-status` other than 0 is an error).
    pub fn observe_trailers(&mut self, trailers: &HeaderMap) -> Observation {
        let mut obs = Observation::default();
        if crate::headers::grpc_status(trailers).is_some_and(|code| code != 0) {
            obs.error = true;
        }
        obs
    }

    /// Ends the body: flushes what the framing allows (an NDJSON last line with no line end).
    pub fn finish(&mut self) -> Observation {
        self.scan(|scanner, on_event| scanner.as_mut().map_or(Ok(()), |s| s.finish(on_event)))
    }

    /// Runs `scan` on the scanner, classifying and counting every event it reports.
    fn scan(
        &mut self,
        scan: impl FnOnce(
            &mut Option<Scanner<AnyFraming>>,
            &mut dyn FnMut(Event<'_>),
        ) -> Result<(), ScanError>,
    ) -> Observation {
        let mut obs = Observation::default();
        if self.state.failed {
            return obs;
        }
        let had_token = self.state.first_token_seen;
        let state = &mut self.state;
        if let Err(e) = scan(&mut self.scanner, &mut |event| {
            state.on_event(&event, &mut obs)
        }) {
            self.state.failed = true;
            obs.scan_error = Some(e);
        }
        if !had_token && self.state.first_token_seen {
            self.set_capture();
        }
        obs
    }

    /// Sets what the scanner captures and the classifier sees for the current phase: whole
    /// events before the first token, [`capture_after_first_token`] bytes after it. With usage
    /// extraction on the scanner keeps capturing whole events (the usage search reads them), and
    /// the classifier still sees only that prefix, except for the one event of a choice that
    /// reports a finish reason (see [`with_usage`](StreamTracker::with_usage)).
    ///
    /// [`capture_after_first_token`]: crate::Classify::capture_after_first_token
    fn set_capture(&mut self) {
        let state = &mut self.state;
        state.class_limit = if state.first_token_seen {
            state.dialect.classifier().capture_after_first_token()
        } else {
            usize::MAX
        };
        // A finish reason is looked for only where the wire has one (not gRPC, NDJSON or the
        // Responses API), so only there does wanting it capture whole events.
        let finish =
            state.want_finish && matches!(state.wire, Wire::OpenAiSse | Wire::AnthropicSse);
        let capture = if state.usage.is_some() || finish {
            usize::MAX
        } else {
            state.class_limit
        };
        if let Some(s) = &mut self.scanner {
            s.set_capture(capture);
        }
    }

    /// Whether a token was seen.
    pub fn first_token_seen(&self) -> bool {
        self.state.first_token_seen
    }

    /// Whether a finish reason came before any token: the answer ended empty (see
    /// [`Observation::finished`]).
    pub fn finished_empty(&self) -> bool {
        self.state.finished_empty
    }

    /// Whether an event of the stream carried a finish reason (OpenAI `finish_reason`,
    /// Anthropic `stop_reason`, a string either way). After the first token it is found only
    /// with [`with_finish`](StreamTracker::with_finish) or
    /// [`with_usage`](StreamTracker::with_usage) on. A terminal event (`[DONE]`,
    /// `message_stop`) without one ends an answer that was cut short: an interrupting server
    /// ends the running stream that way.
    pub fn finish_seen(&self) -> bool {
        self.state.finish_seen
    }

    /// Events seen so far (all classes).
    pub fn events(&self) -> u64 {
        self.state.events
    }

    /// Token events seen so far.
    pub fn tokens(&self) -> u64 {
        self.state.tokens
    }

    /// Bytes fed since the last event boundary: the tail of the stream that is part of an event
    /// not complete yet. A layer that ends a stream early holds these back so that the client
    /// never sees half an event.
    pub fn pending_bytes(&self) -> usize {
        self.scanner.as_ref().map_or(0, Scanner::pending_bytes)
    }

    /// The wire dialect of the stream as far as seen: under an OpenAI-shaped dialect, Anthropic
    /// once an Anthropic event name appeared (not under [`Dialect::OpenAi`]), the Responses API's
    /// once a `response.*` one did.
    pub fn wire(&self) -> Wire {
        self.state.wire
    }

    /// Usage reported by the stream, when [`with_usage`](StreamTracker::with_usage) is on and
    /// the stream reported any (`None` otherwise).
    pub fn usage(&self) -> Option<Usage> {
        self.state
            .usage
            .as_ref()
            .and_then(|u| u.seen.then_some(u.usage))
    }
}

impl State {
    fn on_event(&mut self, event: &Event<'_>, obs: &mut Observation) {
        let classifier = self.dialect.classifier();
        let mut class =
            classifier.classify(&event.limited(self.class_limit), self.first_token_seen);
        // A whole event's data, and the reasons it may carry, searched for at most once.
        let data = match event {
            Event::Sse { data, .. } | Event::Line { data } if data.is_complete() => {
                Some(data.bytes)
            }
            _ => None,
        };
        let mut searched = None;
        let mut reasons = || *searched.get_or_insert_with(|| data.map(Reasons::in_event));
        if class == Class::Token
            && self.first_token_seen
            && self.usage.is_some()
            && reasons().is_some_and(|r| r.finish)
            && classifier.classify(event, false) == Class::Meta
        {
            class = Class::Meta;
        }
        // An OpenAI-shaped wire turns Anthropic or Responses at the first event name of either.
        if self.wire == Wire::OpenAiSse
            && let Event::Sse { name, .. } = event
        {
            if self.detect_anthropic && *name != b"error" && anthropic_event(name).is_some() {
                self.wire = Wire::AnthropicSse;
            } else if responses_event(name).is_some() {
                self.wire = Wire::OpenAiResponsesSse;
            }
        }
        if let Some(usage) = &mut self.usage
            && let Event::Sse { data, .. } | Event::Line { data } = event
        {
            usage.scan(data);
        }
        if !self.finish_seen
            && matches!(self.wire, Wire::OpenAiSse | Wire::AnthropicSse)
            && matches!(class, Class::Token | Class::Meta)
            && reasons().is_some_and(Reasons::any)
        {
            self.finish_seen = true;
        }
        obs.events += 1;
        self.events += 1;
        match class {
            Class::Token => {
                obs.tokens += 1;
                self.tokens += 1;
                if !self.first_token_seen {
                    self.first_token_seen = true;
                    obs.first_token = true;
                }
            }
            Class::Meta => {
                obs.meta += 1;
                if !self.first_token_seen && reasons().is_some_and(Reasons::any) {
                    obs.finished = true;
                    self.finished_empty = true;
                }
            }
            Class::Keepalive => obs.keepalives += 1,
            Class::Done => obs.done = true,
            Class::Error => obs.error = true,
            Class::Malformed => obs.malformed = true,
        }
    }
}

impl UsageState {
    /// Extracts usage from a whole event (see [`Usage::from_json`]).
    fn scan(&mut self, data: &Captured<'_>) {
        if data.is_complete() && self.usage.update_from_json(data.bytes) {
            self.seen = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;

    use super::*;

    fn headers(ct: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_TYPE, ct.parse().unwrap());
        h
    }

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    const ROLE: &str = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    const TOKEN: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n";

    #[test]
    fn every_event_after_the_first_token_is_classified() {
        let sse = headers("text/event-stream");
        let mut t = StreamTracker::new(&Dialect::Auto, &sse);
        t.observe(&b(TOKEN));
        let long_token = "data: {\"choices\":[{\"delta\":{\"content\":\"xy\"}}]}\n\n";
        let three = Bytes::from(format!("{long_token}{long_token}data: [DONE]\n\n"));
        let obs = t.observe(&three);
        assert_eq!((obs.events, obs.tokens, obs.done), (3, 2, true));
        let obs = t.observe(&b("data: {\"error\":{\"code\":1}}\n\n"));
        assert!(obs.error && obs.tokens == 0);
        let obs = t.observe(&b(long_token));
        assert_eq!(obs.tokens, 1);
        // A frame that ends inside an event.
        let obs = t.observe(&Bytes::from(format!("{long_token}: ping\n\ndata: {{\"cho")));
        assert_eq!((obs.events, obs.tokens, obs.keepalives), (2, 1, 1));
        assert_eq!(t.pending_bytes(), 11);
        let obs = t.observe(&b("ices\":[]}\n\n"));
        assert_eq!((obs.events, obs.tokens), (1, 1));
        assert_eq!((t.events(), t.tokens()), (9, 6));
        // A custom classifier is asked every time.
        let asked = Arc::new(Mutex::new(0));
        let n = asked.clone();
        let dialect = Dialect::custom(Framing::Sse, move |_: &Event<'_>, _: bool| {
            *n.lock().unwrap() += 1;
            Class::Token
        });
        let mut t = StreamTracker::new(&dialect, &sse);
        for _ in 0..3 {
            t.observe(&b(long_token));
        }
        assert_eq!(*asked.lock().unwrap(), 3);
    }

    #[test]
    fn junk_is_reported_before_and_after_the_first_token() {
        let mut t = StreamTracker::new(&Dialect::Auto, &headers("text/event-stream"));
        let obs = t.observe(&b("data: this is not json at all\n\ndata: {{{{\n\n"));
        assert!(obs.malformed && !obs.first_token);
        assert_eq!((obs.events, obs.tokens, obs.meta), (2, 0, 0));
        let obs = t.observe(&b(TOKEN));
        assert!(obs.first_token && !obs.malformed);
        // After it, an event cut short, split across frames (only its prefix is captured).
        let cut = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"";
        assert!(!t.observe(&b(cut)).malformed);
        let obs = t.observe(&b("\n\n"));
        assert!(obs.malformed && obs.tokens == 0);
        let obs = t.observe(&b(TOKEN));
        assert!(!obs.malformed && obs.tokens == 1);
        assert_eq!((t.events(), t.tokens()), (5, 2));
    }

    #[test]
    fn counts_and_first_token_once() {
        let mut t = StreamTracker::new(&Dialect::Auto, &headers("text/event-stream"));
        let obs = t.observe(&b(": keepalive\n\n"));
        assert_eq!((obs.events, obs.keepalives), (1, 1));
        assert!(!obs.progress());
        let obs = t.observe(&b(ROLE));
        assert_eq!((obs.events, obs.meta, obs.tokens), (1, 1, 0));
        assert!(obs.progress() && !obs.first_token);
        let two = Bytes::from(format!("{TOKEN}{TOKEN}"));
        let obs = t.observe(&two);
        assert_eq!((obs.events, obs.tokens, obs.first_token), (2, 2, true));
        let obs = t.observe(&b(TOKEN));
        assert_eq!((obs.tokens, obs.first_token), (1, false));
        assert_eq!((t.events(), t.tokens()), (5, 3));
        assert!(t.first_token_seen());
        assert_eq!(t.wire(), Wire::OpenAiSse);
        let obs = t.observe(&b("data: [DONE]\n\n"));
        assert!(obs.done && !obs.error);
        assert_eq!(t.finish(), Observation::default());
    }

    #[test]
    fn capture_is_lowered_after_the_first_token() {
        let seen: Arc<Mutex<Vec<(usize, usize, bool)>>> = Arc::default();
        let log = seen.clone();
        let dialect = Dialect::custom(Framing::Sse, move |e: &Event<'_>, first: bool| {
            if let Event::Sse { data, .. } = e {
                log.lock()
                    .unwrap()
                    .push((data.bytes.len(), data.len, first));
            }
            Class::Token
        });
        let mut t = StreamTracker::new(&dialect, &HeaderMap::new());
        assert_eq!(t.wire(), Wire::Sse);
        let long = "data: 0123456789012345678901234567890123456789\n\n";
        t.observe(&b(long));
        t.observe(&b(long));
        assert_eq!(*seen.lock().unwrap(), [(40, 40, false), (16, 40, true)]);

        // With usage on, the scanner keeps whole events (for the usage search), but the
        // classifier sees the same prefix as without: extracting usage never changes a class.
        seen.lock().unwrap().clear();
        let mut t = StreamTracker::new(&dialect, &HeaderMap::new()).with_usage(true);
        t.observe(&b(long));
        t.observe(&b(long));
        assert_eq!(*seen.lock().unwrap(), [(40, 40, false), (16, 40, true)]);
    }

    #[test]
    fn with_usage_a_finish_only_chunk_is_not_output() {
        let finish =
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
        let last = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"finish_reason\":\"length\"}]}\n\n";
        let running = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n";
        let stream = [TOKEN, running, last, finish, "data: [DONE]\n\n"];
        let count = |usage: bool| {
            let mut t = StreamTracker::new(&Dialect::OpenAi, &HeaderMap::new()).with_usage(usage);
            let tokens: u32 = stream.iter().map(|e| t.observe(&b(e)).tokens).sum();
            (tokens, t.tokens())
        };
        // The recorder's mode counts the three chunks with content; the others see four events
        // of progress (they only need to know output goes on).
        assert_eq!(count(true), (3, 3));
        assert_eq!(count(false), (4, 4));
    }

    #[test]
    fn scan_error_is_reported_once_then_nothing_is_scanned() {
        let mut t =
            StreamTracker::new(&Dialect::OpenAi, &HeaderMap::new()).with_max_event_bytes(64);
        let obs = t.observe(&b(TOKEN));
        assert_eq!(obs.tokens, 1);
        let big = Bytes::from(format!("data: {}\n\n", "x".repeat(100)));
        let obs = t.observe(&big);
        let err = obs.scan_error.expect("scan error");
        assert_eq!((err.what(), err.limit()), ("sse line", 64));
        assert_eq!(t.observe(&b(TOKEN)), Observation::default());
        assert_eq!(t.finish(), Observation::default());
        assert_eq!(t.tokens(), 1);
    }

    #[test]
    fn events_before_a_scan_error_in_the_same_frame_count() {
        let mut t =
            StreamTracker::new(&Dialect::OpenAi, &HeaderMap::new()).with_max_event_bytes(64);
        let frame = Bytes::from(format!("{TOKEN}data: {}", "x".repeat(100)));
        let obs = t.observe(&frame);
        assert_eq!(obs.tokens, 1);
        assert!(obs.first_token && obs.scan_error.is_some());
    }

    #[test]
    fn pending_bytes_follow_the_scanner() {
        let mut t = StreamTracker::new(&Dialect::Auto, &headers("text/event-stream"));
        t.observe(&b("data: {\"cho"));
        assert_eq!(t.pending_bytes(), 11);
        t.observe(&b("ices\":[]}\n\n"));
        assert_eq!(t.pending_bytes(), 0);
        let mut t = StreamTracker::new(&Dialect::Auto, &HeaderMap::new());
        t.observe(&b("{\"cho"));
        assert_eq!(t.pending_bytes(), 0, "opaque bodies have no events to cut");
    }

    #[test]
    fn grpc_messages_and_trailers() {
        let mut t = StreamTracker::new(&Dialect::Auto, &headers("application/grpc"));
        assert_eq!(t.wire(), Wire::Grpc);
        let obs = t.observe(&Bytes::from_static(&[0, 0, 0, 0, 2, 8, 1, 0, 0]));
        assert_eq!((obs.tokens, obs.first_token), (1, true));
        assert_eq!(t.pending_bytes(), 2);
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        assert!(!t.observe_trailers(&trailers).error);
        trailers.insert("grpc-status", "14".parse().unwrap());
        assert!(t.observe_trailers(&trailers).error);
    }

    #[test]
    fn ndjson_last_line_is_flushed_by_finish() {
        let mut t = StreamTracker::new(&Dialect::Auto, &headers("application/x-ndjson"));
        assert_eq!(t.wire(), Wire::Ndjson);
        assert!(
            t.observe(&b("{\"response\":\"Hi\",\"done\":false}\n"))
                .first_token
        );
        assert_eq!(t.observe(&b("{\"response\":\"\",\"done\":true}")).events, 0);
        assert!(t.finish().done);
    }

    #[test]
    fn wire_follows_the_dialect_and_anthropic_names() {
        let sse = headers("text/event-stream");
        let mut t = StreamTracker::new(&Dialect::Auto, &sse);
        assert_eq!(t.wire(), Wire::OpenAiSse);
        t.observe(&b("event: error\ndata: {}\n\n"));
        assert_eq!(t.wire(), Wire::OpenAiSse, "`error` is not only Anthropic's");
        let obs = t.observe(&b("event: ping\ndata: {\"type\":\"ping\"}\n\n"));
        assert_eq!(obs.keepalives, 1);
        assert_eq!(t.wire(), Wire::AnthropicSse);
        let mut t = StreamTracker::new(&Dialect::OpenAi, &sse);
        t.observe(&b("event: ping\ndata: {}\n\n"));
        assert_eq!(t.wire(), Wire::OpenAiSse);
        assert_eq!(
            StreamTracker::new(&Dialect::Anthropic, &sse).wire(),
            Wire::AnthropicSse
        );
        assert_eq!(StreamTracker::new(&Dialect::AnySse, &sse).wire(), Wire::Sse);
        assert_eq!(
            StreamTracker::new(&Dialect::AnyByte, &sse).wire(),
            Wire::Opaque
        );
        // A fixed dialect ignores the content-type.
        let mut t = StreamTracker::new(&Dialect::OpenAi, &headers("application/json"));
        assert!(t.observe(&b(TOKEN)).first_token);
        // The Responses API's event names, under the auto and the OpenAI dialects.
        for dialect in [Dialect::Auto, Dialect::OpenAi] {
            let mut t = StreamTracker::new(&dialect, &sse);
            t.observe(&b(
                "event: response.created\ndata: {\"type\":\"response.created\"}\n\n",
            ));
            assert_eq!(t.wire(), Wire::OpenAiResponsesSse);
            // It stays so: a later `ping` does not make it Anthropic.
            t.observe(&b("event: ping\ndata: {}\n\n"));
            assert_eq!(t.wire(), Wire::OpenAiResponsesSse);
        }
    }

    #[test]
    fn usage_from_openai_and_anthropic() {
        let sse = headers("text/event-stream");
        let mut t = StreamTracker::new(&Dialect::Auto, &sse).with_usage(true);
        t.observe(&b(TOKEN));
        t.observe(&b("data: {\"choices\":[],\"usage\":null}\n\n"));
        assert_eq!(t.usage(), None);
        t.observe(&b(
            "data: {\"choices\":[],\"usage\": {\"prompt_tokens\":5,\"completion_tokens\":12}}\n\n",
        ));
        assert_eq!(
            t.usage(),
            Some(Usage {
                prompt_tokens: Some(5),
                completion_tokens: Some(12)
            })
        );
        let mut t = StreamTracker::new(&Dialect::Auto, &sse).with_usage(true);
        t.observe(&b("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n"));
        assert_eq!(
            t.usage(),
            Some(Usage {
                prompt_tokens: Some(7),
                completion_tokens: None
            })
        );
        t.observe(&b("event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n"));
        assert_eq!(t.usage().unwrap().completion_tokens, Some(15));
        // The Responses API: in the terminal event's response.
        let mut t = StreamTracker::new(&Dialect::Auto, &sse).with_usage(true);
        t.observe(&b("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":9,\"output_tokens\":21,\"total_tokens\":30}}}\n\n"));
        assert_eq!(
            t.usage(),
            Some(Usage {
                prompt_tokens: Some(9),
                completion_tokens: Some(21)
            })
        );
        // Off by default.
        let mut t = StreamTracker::new(&Dialect::Auto, &sse);
        t.observe(&b(
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5}}\n\n",
        ));
        assert_eq!(t.usage(), None);
    }

    #[test]
    fn usage_from_whole_documents() {
        let usage = |prompt, completion| {
            Some(Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
            })
        };
        // An OpenAI chat completion (no `stream`), pretty-printed as the API sends it.
        let chat = br#"{
  "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
  "object": "chat.completion",
  "created": 1741569952,
  "model": "gpt-4.1-2025-04-14",
  "choices": [
    {
      "index": 0,
      "message": {"role": "assistant", "content": "Hello! How can I assist you today?", "refusal": null, "annotations": []},
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 19,
    "completion_tokens": 10,
    "total_tokens": 29,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
  },
  "service_tier": "default"
}"#;
        assert_eq!(Usage::from_json(chat), usage(Some(19), Some(10)));
        let captured = tailguard_test_support::fixture("llamacpp-chat-nostream.json");
        assert_eq!(Usage::from_json(captured), usage(Some(33), Some(8)));
        // An Anthropic message (`/v1/messages` without `stream`).
        let message = br#"{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[{"type":"text","text":"Hi! My name is Claude."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":503}}"#;
        assert_eq!(Usage::from_json(message), usage(Some(2095), Some(503)));
        // An OpenAI Responses API response (`/v1/responses` without `stream`).
        let response = br#"{"id":"resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b","object":"response","created_at":1741476542,"status":"completed","error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,"model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_67ccd2bf17f0819081ff3bb2cf6508e60bb6a6b452d3795b","status":"completed","role":"assistant","content":[{"type":"output_text","text":"In a peaceful grove beneath a silver moon...","annotations":[]}]}],"parallel_tool_calls":true,"previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,"temperature":1.0,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],"top_p":1.0,"truncation":"disabled","usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123},"user":null,"metadata":{}}"#;
        assert_eq!(Usage::from_json(response), usage(Some(36), Some(87)));
        // One count only; an Anthropic `message_start` event's input tokens.
        assert_eq!(
            Usage::from_json(br#"{"usage":{"completion_tokens":3}}"#),
            usage(None, Some(3))
        );
        assert_eq!(
            Usage::from_json(
                br#"{"type":"message_start","message":{"usage":{"input_tokens":7,"output_tokens":1}}}"#
            ),
            usage(Some(7), None)
        );
        // No usage: none at all, `null`, an empty object, counts that are not numbers.
        for document in [
            &br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[]}"#[..],
            br#"{"choices":[],"usage":null}"#,
            br#"{"usage":{}}"#,
            br#"{"usage":{"prompt_tokens":"9","completion_tokens":-1}}"#,
            br#"[{"usage":{"prompt_tokens":9}}]"#,
        ] {
            assert_eq!(Usage::from_json(document), None);
        }
        // Not JSON: cut short, junk, nothing.
        assert_eq!(Usage::from_json(&chat[..chat.len() - 2]), None);
        assert_eq!(Usage::from_json(b"<html>\"usage\": {</html>"), None);
        assert_eq!(Usage::from_json(b""), None);
    }

    #[test]
    fn a_finish_reason_before_any_token_is_an_empty_answer() {
        let sse = headers("text/event-stream");
        let cases = [
            (
                "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
                true,
            ),
            (
                "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
                true,
            ),
            (
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"stop_reason\":null}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
                true,
            ),
            // An interrupting server's bare `[DONE]`; a role chunk; `null` finish reasons.
            (
                "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\ndata: [DONE]\n\n",
                false,
            ),
            (
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"stop_reason\":null}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
                false,
            ),
        ];
        for (stream, finished) in cases {
            let mut t = StreamTracker::new(&Dialect::Auto, &sse);
            let obs = t.observe(&b(stream));
            assert!(obs.done && !t.first_token_seen(), "{stream}");
            assert_eq!(
                (obs.finished, t.finished_empty()),
                (finished, finished),
                "{stream}"
            );
        }
        // After a token, a finish is no empty answer.
        let mut t = StreamTracker::new(&Dialect::Auto, &sse);
        t.observe(&b("data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"));
        assert!(!t.finished_empty());
    }
}
