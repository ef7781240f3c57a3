//! Per-response token tracking: a scanner and a classifier driven frame by frame.

use std::sync::Arc;

use bytes::Buf;
use http::HeaderMap;

use crate::classify::{
    AnthropicClassifier, AnyByteClassifier, AnySseClassifier, Class, Classify, Dialect, Framing,
    GrpcClassifier, LlmSseClassifier, NdjsonClassifier, OpenAiClassifier, Wire, anthropic_event,
};
use crate::error::ScanError;
use crate::scan::{Captured, Event, GrpcScanner, NdjsonScanner, SseScanner};

/// Token usage reported by the stream itself (`include_usage` chunks, Anthropic `usage`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt (input) tokens.
    pub prompt_tokens: Option<u64>,
    /// Completion (output) tokens.
    pub completion_tokens: Option<u64>,
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
    /// This frame carried the stream's first token.
    pub first_token: bool,
    /// The scanner met an item over its cap; the tracker scans nothing more after this.
    pub scan_error: Option<ScanError>,
}

impl Observation {
    /// The same observation, built field by field: merged with one built from scalars (the
    /// steady path of [`StreamTracker::observe`]), it stays a set of scalars in the caller
    /// instead of a copy through memory.
    #[inline(always)]
    fn rebuilt(self) -> Observation {
        Observation {
            events: self.events,
            tokens: self.tokens,
            meta: self.meta,
            keepalives: self.keepalives,
            done: self.done,
            error: self.error,
            first_token: self.first_token,
            scan_error: self.scan_error,
        }
    }

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
/// its JSON); from the first token on the scanner captures only
/// [`Classify::capture_after_first_token`] bytes per event, so the steady state is a `memchr`
/// pass over the frame and a few byte comparisons per event. For SSE that steady state is a path
/// of [`observe`](StreamTracker::observe) inlined into the caller: the whole one-line `data:`
/// events at the front of a frame that starts on an event boundary are counted straight from
/// the frame, and a preset's class for them is remembered by the event's 16-byte prefix (after
/// the first token the presets decide from that prefix alone), so a token chunk costs one
/// `memchr` and one 16-byte comparison (with usage extraction on, plus one search of the event
/// for a `"usage"` key, and the class decided without the memo); the rest of the frame, if any,
/// goes through the general path, with the same result. After a [`ScanError`] the tracker
/// reports it once and scans nothing more.
#[derive(Debug)]
pub struct StreamTracker {
    scanner: Scanner,
    state: State,
    /// The scanner's pending bytes as of the last scan through the general path (the steady
    /// path takes whole events only, so it leaves them at 0).
    pending: usize,
}

#[derive(Debug)]
enum Scanner {
    Sse(SseScanner),
    Grpc(GrpcScanner),
    Ndjson(NdjsonScanner),
    Bytes,
}

/// The classifier, statically dispatched for the presets.
#[derive(Clone)]
enum Preset {
    OpenAi,
    Anthropic,
    LlmSse,
    AnySse,
    AnyByte,
    Grpc,
    Ndjson,
    Custom(Arc<dyn Classify>),
}

impl std::fmt::Debug for Preset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Preset::OpenAi => f.write_str("OpenAi"),
            Preset::Anthropic => f.write_str("Anthropic"),
            Preset::LlmSse => f.write_str("LlmSse"),
            Preset::AnySse => f.write_str("AnySse"),
            Preset::AnyByte => f.write_str("AnyByte"),
            Preset::Grpc => f.write_str("Grpc"),
            Preset::Ndjson => f.write_str("Ndjson"),
            Preset::Custom(_) => f.write_str("Custom"),
        }
    }
}

impl Preset {
    #[inline]
    fn classify(&self, event: &Event<'_>, first_token_seen: bool) -> Class {
        match self {
            Preset::OpenAi => OpenAiClassifier.classify(event, first_token_seen),
            Preset::Anthropic => AnthropicClassifier.classify(event, first_token_seen),
            Preset::LlmSse => LlmSseClassifier.classify(event, first_token_seen),
            Preset::AnySse => AnySseClassifier.classify(event, first_token_seen),
            Preset::AnyByte => AnyByteClassifier.classify(event, first_token_seen),
            Preset::Grpc => GrpcClassifier.classify(event, first_token_seen),
            Preset::Ndjson => NdjsonClassifier.classify(event, first_token_seen),
            Preset::Custom(c) => c.classify(event, first_token_seen),
        }
    }

    fn capture_after_first_token(&self) -> usize {
        match self {
            Preset::OpenAi => OpenAiClassifier.capture_after_first_token(),
            Preset::Anthropic => AnthropicClassifier.capture_after_first_token(),
            Preset::LlmSse => LlmSseClassifier.capture_after_first_token(),
            Preset::AnySse => AnySseClassifier.capture_after_first_token(),
            Preset::AnyByte => AnyByteClassifier.capture_after_first_token(),
            Preset::Grpc => GrpcClassifier.capture_after_first_token(),
            Preset::Ndjson => NdjsonClassifier.capture_after_first_token(),
            Preset::Custom(c) => c.capture_after_first_token(),
        }
    }
}

#[derive(Debug)]
struct State {
    preset: Preset,
    /// Whether the wire turns Anthropic when an Anthropic event name appears.
    detect_anthropic: bool,
    wire: Wire,
    first_token_seen: bool,
    events: u64,
    tokens: u64,
    failed: bool,
    usage: Option<UsageState>,
    /// The steady state: a token was seen, no scan error, SSE framing. Whole
    /// unnamed data events then take [`StreamTracker::observe`]'s fast path.
    steady: bool,
    /// The class of the last steady-state data event decided by a preset (see [`Memo`]).
    memo: Option<Memo>,
    /// Whether the steady-state fast path may be taken (off only in tests, to compare it with
    /// the general path).
    fast: bool,
    /// How many bytes of an event's data the classifier sees: everything, except after the
    /// first token while usage extraction keeps the scanner capturing whole events, when the
    /// classifier still sees only [`Classify::capture_after_first_token`] bytes, as it would
    /// without usage extraction (so extracting usage never changes a class).
    class_limit: usize,
}

/// The counts of the steady-state fast path (see [`State::steady`]): what
/// [`State::on_event`] counts for a whole unnamed data event after the first token, less what
/// cannot apply there (the first token, Anthropic event names); usage, when extracted, is
/// scanned alongside.
#[derive(Clone, Copy, Default)]
struct Counts {
    events: u32,
    tokens: u32,
    meta: u32,
    keepalives: u32,
    done: bool,
    error: bool,
}

impl Counts {
    #[inline(always)]
    fn add(&mut self, class: Class) {
        self.events += 1;
        match class {
            Class::Token => self.tokens += 1,
            Class::Meta => self.meta += 1,
            Class::Keepalive => self.keepalives += 1,
            Class::Done => self.done = true,
            Class::Error => self.error = true,
        }
    }

    #[inline(always)]
    fn observation(self) -> Observation {
        Observation {
            events: self.events,
            tokens: self.tokens,
            meta: self.meta,
            keepalives: self.keepalives,
            done: self.done,
            error: self.error,
            first_token: false,
            scan_error: None,
        }
    }
}

/// The captured prefix of a steady-state data event and the class a preset gave it.
///
/// After the first token the presets decide an unnamed data event from its captured prefix
/// (at most [`MEMO_BYTES`]) and whether that prefix is the whole data, nothing else; and in a
/// real stream every chunk starts alike (`{"id":"chatcmpl-…` with the same id), so the class
/// of the previous event usually answers for the next one with one 16-byte comparison. Never
/// used for a custom classifier, which may be stateful.
#[derive(Clone, Copy, Debug)]
struct Memo {
    prefix: [u8; MEMO_BYTES],
    class: Class,
}

/// The prefix length the memo keys on: the presets' capture after the first token.
const MEMO_BYTES: usize = 16;

#[derive(Debug, Default)]
struct UsageState {
    usage: Usage,
    seen: bool,
}

/// The length of the `"usage"` key, searched for in every complete event while usage
/// extraction is on.
const USAGE_KEY_LEN: usize = b"\"usage\"".len();

impl StreamTracker {
    /// A tracker for a response with `headers`, finding tokens as `dialect` says.
    pub fn new(dialect: &Dialect, headers: &HeaderMap) -> Self {
        let resolved = dialect.resolve(headers);
        let (preset, framing, wire) = match resolved {
            Dialect::Auto | Dialect::LlmSse => (Preset::LlmSse, Framing::Sse, Wire::OpenAiSse),
            Dialect::OpenAi => (Preset::OpenAi, Framing::Sse, Wire::OpenAiSse),
            Dialect::Anthropic => (Preset::Anthropic, Framing::Sse, Wire::AnthropicSse),
            Dialect::AnySse => (Preset::AnySse, Framing::Sse, Wire::Sse),
            Dialect::AnyByte => (Preset::AnyByte, Framing::Bytes, Wire::Opaque),
            Dialect::Grpc => (Preset::Grpc, Framing::Grpc, Wire::Grpc),
            Dialect::Ndjson => (Preset::Ndjson, Framing::Ndjson, Wire::Ndjson),
            Dialect::Custom {
                framing,
                classifier,
            } => {
                let wire = match framing {
                    Framing::Sse => Wire::Sse,
                    Framing::Grpc => Wire::Grpc,
                    Framing::Ndjson => Wire::Ndjson,
                    Framing::Bytes => Wire::Opaque,
                };
                (Preset::Custom(classifier), framing, wire)
            }
        };
        let scanner = match framing {
            Framing::Sse => Scanner::Sse(SseScanner::new()),
            Framing::Grpc => Scanner::Grpc(GrpcScanner::new()),
            Framing::Ndjson => Scanner::Ndjson(NdjsonScanner::new()),
            Framing::Bytes => Scanner::Bytes,
        };
        let detect_anthropic = matches!(preset, Preset::LlmSse);
        StreamTracker {
            scanner,
            pending: 0,
            state: State {
                preset,
                detect_anthropic,
                wire,
                first_token_seen: false,
                events: 0,
                tokens: 0,
                failed: false,
                usage: None,
                steady: false,
                memo: None,
                fast: true,
                class_limit: usize::MAX,
            },
        }
    }

    /// Sets the cap on one line/event/message (default
    /// [`DEFAULT_MAX_EVENT_BYTES`](crate::scan::DEFAULT_MAX_EVENT_BYTES)).
    pub fn with_max_event_bytes(mut self, max: usize) -> Self {
        self.scanner = match self.scanner {
            Scanner::Sse(s) => Scanner::Sse(s.with_max_event_bytes(max)),
            Scanner::Grpc(s) => Scanner::Grpc(s.with_max_event_bytes(max)),
            Scanner::Ndjson(s) => Scanner::Ndjson(s.with_max_event_bytes(max)),
            Scanner::Bytes => Scanner::Bytes,
        };
        self
    }

    /// Also extracts [`Usage`] from the stream (off by default: it captures the data of events
    /// that may carry usage after the first token).
    pub fn with_usage(mut self, usage: bool) -> Self {
        self.state.usage = usage.then(UsageState::default);
        self.set_capture();
        self
    }

    /// Scans one data frame.
    ///
    /// The steady state (after the first token, SSE) is inlined into
    /// the caller: whole unnamed `data:` events at the front of the frame are counted straight
    /// from it, and the rest of the frame, if any, goes through the general path.
    #[inline(always)]
    pub fn observe<D: Buf + ?Sized>(&mut self, data: &D) -> Observation {
        if self.state.steady
            && let Scanner::Sse(s) = &mut self.scanner
        {
            let chunk = data.chunk();
            if chunk.len() == data.remaining() {
                let mut counts = Counts::default();
                let state = &mut self.state;
                let mut used = 0;
                if s.at_boundary() {
                    while let Some((n, data)) = s.next_data_event(&chunk[used..]) {
                        counts.add(state.steady_class(data));
                        if let Some(usage) = &mut state.usage {
                            usage.scan(&data);
                        }
                        used += n;
                    }
                }
                state.events += u64::from(counts.events);
                state.tokens += u64::from(counts.tokens);
                // Built in one go from scalars, so that the caller sees the fields as values.
                let obs = counts.observation();
                if used == chunk.len() {
                    return obs;
                }
                return self.observe_rest(&chunk[used..], obs).rebuilt();
            }
        }
        self.observe_general(data).rebuilt()
    }

    /// The general path of [`observe`](StreamTracker::observe).
    #[inline(never)]
    fn observe_general<D: Buf + ?Sized>(&mut self, data: &D) -> Observation {
        let mut obs = Observation::default();
        if self.state.failed {
            return obs;
        }
        let had_token = self.state.first_token_seen;
        let state = &mut self.state;
        let result = match &mut self.scanner {
            Scanner::Sse(s) => s.feed_buf(data, |e| state.on_event(&e, &mut obs)),
            Scanner::Grpc(s) => s.feed_buf(data, |e| state.on_event(&e, &mut obs)),
            Scanner::Ndjson(s) => s.feed_buf(data, |e| state.on_event(&e, &mut obs)),
            Scanner::Bytes => {
                let len = data.remaining();
                if len > 0 {
                    state.on_event(&Event::Bytes { len }, &mut obs);
                }
                Ok(())
            }
        };
        self.after_scan(result, had_token, &mut obs);
        obs
    }

    /// The part of a steady-state frame after its whole data events, through the general path,
    /// added to `obs`.
    #[inline(never)]
    fn observe_rest(&mut self, rest: &[u8], mut obs: Observation) -> Observation {
        let state = &mut self.state;
        let result = match &mut self.scanner {
            Scanner::Sse(s) => s.feed(rest, |e| state.on_event(&e, &mut obs)),
            _ => Ok(()),
        };
        self.after_scan(result, true, &mut obs);
        obs
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
        let mut obs = Observation::default();
        if self.state.failed {
            return obs;
        }
        let had_token = self.state.first_token_seen;
        let state = &mut self.state;
        let result = match &mut self.scanner {
            Scanner::Sse(s) => s.finish(|e| state.on_event(&e, &mut obs)),
            Scanner::Grpc(s) => s.finish(|e| state.on_event(&e, &mut obs)),
            Scanner::Ndjson(s) => s.finish(|e| state.on_event(&e, &mut obs)),
            Scanner::Bytes => Ok(()),
        };
        self.after_scan(result, had_token, &mut obs);
        obs
    }

    fn after_scan(
        &mut self,
        result: Result<(), ScanError>,
        had_token: bool,
        obs: &mut Observation,
    ) {
        if let Err(e) = result {
            self.state.failed = true;
            obs.scan_error = Some(e);
        }
        if !had_token && self.state.first_token_seen {
            self.set_capture();
        }
        self.pending = match &self.scanner {
            Scanner::Sse(s) => s.pending_bytes(),
            Scanner::Grpc(s) => s.pending_bytes(),
            Scanner::Ndjson(s) => s.pending_bytes(),
            Scanner::Bytes => 0,
        };
        self.state.steady = self.state.fast
            && self.state.first_token_seen
            && !self.state.failed
            && matches!(self.scanner, Scanner::Sse(_));
    }

    /// Sets the scanner's capture for the current phase.
    fn set_capture(&mut self) {
        let limit = if !self.state.first_token_seen || self.state.usage.is_some() {
            usize::MAX
        } else {
            self.state.preset.capture_after_first_token()
        };
        self.state.class_limit = if self.state.first_token_seen && self.state.usage.is_some() {
            self.state.preset.capture_after_first_token()
        } else {
            usize::MAX
        };
        match &mut self.scanner {
            Scanner::Sse(s) => s.set_capture(limit),
            Scanner::Grpc(s) => s.set_capture(limit),
            Scanner::Ndjson(s) => s.set_capture(limit),
            Scanner::Bytes => {}
        }
    }

    /// Whether a token was seen.
    pub fn first_token_seen(&self) -> bool {
        self.state.first_token_seen
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
    #[inline]
    pub fn pending_bytes(&self) -> usize {
        self.pending
    }

    /// The wire dialect of the stream as far as seen (e.g. Anthropic once an Anthropic event
    /// name appeared).
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
    /// The class of an unnamed data event after the first token, through the memo for presets.
    #[inline(always)]
    fn steady_class(&mut self, data: Captured<'_>) -> Class {
        let data = data.limited(self.class_limit);
        // Only a prefix shorter than the data is a key: the class depends on its bytes only.
        let key = match <[u8; MEMO_BYTES]>::try_from(data.bytes) {
            Ok(prefix) if data.len > MEMO_BYTES => Some(prefix),
            _ => None,
        };
        // (The memo is only ever set for a preset.)
        if let (Some(prefix), Some(memo)) = (key, &self.memo)
            && memo.prefix == prefix
        {
            return memo.class;
        }
        let key = key.filter(|_| !matches!(self.preset, Preset::Custom(_)));
        let class = self.classify_steady(data);
        if let Some(prefix) = key {
            self.memo = Some(Memo { prefix, class });
        }
        class
    }

    /// The class of `event` seen through [`class_limit`](State::class_limit).
    #[inline(never)]
    fn classify_limited(&self, event: &Event<'_>) -> Class {
        let limit = self.class_limit;
        let limited = match *event {
            Event::Sse { name, data } => Event::Sse {
                name,
                data: data.limited(limit),
            },
            Event::Line { data } => Event::Line {
                data: data.limited(limit),
            },
            Event::Comment { text } => Event::Comment {
                text: text.limited(limit),
            },
            Event::Grpc { compressed, data } => Event::Grpc {
                compressed,
                data: data.limited(limit),
            },
            other => other,
        };
        self.preset.classify(&limited, self.first_token_seen)
    }

    #[inline(never)]
    fn classify_steady(&self, data: Captured<'_>) -> Class {
        self.preset.classify(&Event::Sse { name: b"", data }, true)
    }

    #[inline]
    fn on_event(&mut self, event: &Event<'_>, obs: &mut Observation) {
        let class = if self.class_limit == usize::MAX {
            self.preset.classify(event, self.first_token_seen)
        } else {
            self.classify_limited(event)
        };
        if self.detect_anthropic
            && let Event::Sse { name, .. } = event
            && self.wire != Wire::AnthropicSse
            && !name.is_empty()
            && *name != b"error"
            && anthropic_event(name).is_some()
        {
            self.wire = Wire::AnthropicSse;
        }
        if let Some(usage) = &mut self.usage {
            match event {
                Event::Sse { data, .. } | Event::Line { data } => usage.scan(data),
                _ => {}
            }
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
            Class::Meta => obs.meta += 1,
            Class::Keepalive => obs.keepalives += 1,
            Class::Done => obs.done = true,
            Class::Error => obs.error = true,
        }
    }
}

impl UsageState {
    /// Extracts usage from an event whose data has a `"usage"` member holding an object. The
    /// search is inlined into the event path; the parse, rare, is not.
    #[inline]
    fn scan(&mut self, data: &Captured<'_>) {
        if data.is_complete() && self.may_carry_usage(data.bytes) {
            self.parse(data.bytes);
        }
    }

    #[cold]
    #[inline(never)]
    fn parse(&mut self, bytes: &[u8]) {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else {
            return;
        };
        let field = |v: Option<&serde_json::Value>, key: &str| {
            v.and_then(|u| u.get(key)).and_then(|n| n.as_u64())
        };
        let top = value.get("usage").filter(|u| u.is_object());
        // OpenAI: `usage.prompt_tokens` / `usage.completion_tokens`.
        if let Some(n) = field(top, "prompt_tokens") {
            self.usage.prompt_tokens = Some(n);
            self.seen = true;
        }
        if let Some(n) = field(top, "completion_tokens") {
            self.usage.completion_tokens = Some(n);
            self.seen = true;
        }
        let typ = value.get("type").and_then(|t| t.as_str());
        // Anthropic: input tokens in `message_start.message.usage`, output tokens in
        // `message_delta.usage` (the count in `message_start` is a placeholder).
        if typ == Some("message_start") {
            let inner = value.get("message").and_then(|m| m.get("usage"));
            if let Some(n) = field(inner, "input_tokens") {
                self.usage.prompt_tokens = Some(n);
                self.seen = true;
            }
        } else {
            if let Some(n) = field(top, "input_tokens") {
                self.usage.prompt_tokens = Some(n);
                self.seen = true;
            }
            if let Some(n) = field(top, "output_tokens") {
                self.usage.completion_tokens = Some(n);
                self.seen = true;
            }
        }
    }

    /// `"usage"`, optional whitespace, `:`, optional whitespace, `{` somewhere in `bytes`.
    ///
    /// Found from the key's `u`: one `memchr` pass over the event (a `u` is rare in a JSON
    /// chunk's syntax, so few candidates are checked), which costs less on a chunk of a few
    /// hundred bytes than a substring search whose bytes (`"`, `s`, `a`, `e`) are all common.
    /// Every occurrence of the key counts, overlapping ones included.
    #[inline]
    fn may_carry_usage(&self, bytes: &[u8]) -> bool {
        memchr::memchr_iter(b'u', bytes).any(|at| {
            at > 0
                && bytes[at - 1] == b'"'
                && bytes[at + 1..].starts_with(b"sage\"")
                && match bytes[at + USAGE_KEY_LEN - 1..]
                    .trim_ascii_start()
                    .split_first()
                {
                    Some((b':', rest)) => rest.trim_ascii_start().first() == Some(&b'{'),
                    _ => false,
                }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

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

    /// Every frame's observation, and the tracker's state after it, then the end.
    fn trace(mut t: StreamTracker, frames: &[Vec<u8>], split_bufs: bool) -> Vec<String> {
        let mut out = Vec::new();
        for f in frames {
            let obs = if split_bufs && f.len() > 1 {
                let (a, b) = f.split_at(f.len() / 2);
                t.observe(&bytes::Buf::chain(a, b))
            } else {
                t.observe(&Bytes::copy_from_slice(f))
            };
            let scanner_pending = match &t.scanner {
                Scanner::Sse(s) => s.pending_bytes(),
                Scanner::Grpc(s) => s.pending_bytes(),
                Scanner::Ndjson(s) => s.pending_bytes(),
                Scanner::Bytes => 0,
            };
            assert_eq!(t.pending_bytes(), scanner_pending);
            out.push(format!(
                "{obs:?} events={} tokens={} first={} pending={} wire={:?}",
                t.events(),
                t.tokens(),
                t.first_token_seen(),
                t.pending_bytes(),
                t.wire()
            ));
        }
        out.push(format!("{:?} {:?}", t.finish(), t.usage()));
        out
    }

    fn sse_piece() -> impl proptest::strategy::Strategy<Value = &'static [u8]> {
        use proptest::prelude::*;
        prop_oneof![
            Just(&b"data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"[..]),
            Just(&b"data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\r\n\r\n"[..]),
            Just(&b"data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n"[..]),
            Just(&b"data:{\"id\":\"chatcmpl-2\",\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":3}}\n\n"[..]),
            Just(&b"data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"[..]),
            Just(&b"data: {\"error\":{\"message\":\"overloaded\"}}\n\n"[..]),
            Just(&b"data: { \"error\" :{\"message\":\"overloaded\"}}\n\n"[..]),
            Just(&b"data:  {\"error\":{\"message\":\"overloaded\"}}\n\n"[..]),
            Just(&b"data: [DONE]\n\n"[..]),
            Just(&b"data: [DONE] and then some more bytes\n\n"[..]),
            Just(&b"data: 0123456789abcdef\n\n"[..]),
            Just(&b"data: 0123456789abcdefg\n\n"[..]),
            Just(&b"data: x\n\n"[..]),
            Just(&b"data:\n\n"[..]),
            Just(&b"data\n\n"[..]),
            Just(&b"data: a\ndata: b\n\n"[..]),
            Just(&b"data: a\r\r"[..]),
            Just(&b"data: a\r"[..]),
            Just(&b"\n"[..]),
            Just(&b"\r\n"[..]),
            Just(&b": keepalive\n\n"[..]),
            Just(&b": keepalive\n"[..]),
            Just(&b"event: ping\ndata: {\"type\":\"ping\"}\n\n"[..]),
            Just(&b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\n"[..]),
            Just(&b"event: error\ndata: {}\n\n"[..]),
            Just(&b"id: 7\ndata: {\"choices\":[{\"delta\":{\"content\":\"y\"}}]}\n\n"[..]),
            Just(&b"\xEF\xBB\xBF"[..]),
            Just(&b"data: {\"cut"[..]),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// The steady-state fast path reports exactly what the general path does: the same
        /// observation for every frame and the same state after it, whatever the framing, the
        /// dialect, the cap, usage extraction and buffers of two chunks.
        #[test]
        fn steady_fast_path_matches_the_general_path(
            pieces in proptest::collection::vec(sse_piece(), 0..40),
            raw_cuts in proptest::collection::vec(0usize..4096, 0..8),
            boundary_cuts in proptest::collection::vec(proptest::bool::weighted(0.7), 40),
            dialect in 0usize..5,
            small_cap in proptest::bool::ANY,
            usage in proptest::bool::ANY,
            split_bufs in proptest::bool::ANY,
        ) {
            let bytes = pieces.concat();
            let mut cuts: Vec<usize> = raw_cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            // Mostly at piece boundaries, where the fast path can take over.
            let mut at = 0;
            for (i, piece) in pieces.iter().enumerate() {
                at += piece.len();
                if boundary_cuts.get(i).copied().unwrap_or(true) {
                    cuts.push(at);
                }
            }
            cuts.sort_unstable();
            cuts.push(bytes.len());
            let mut frames = Vec::new();
            let mut at = 0;
            for cut in cuts {
                frames.push(bytes[at..cut].to_vec());
                at = cut;
            }
            let dialect = [Dialect::Auto, Dialect::OpenAi, Dialect::Anthropic, Dialect::AnySse, Dialect::LlmSse][dialect].clone();
            let make = || {
                let mut t = StreamTracker::new(&dialect, &headers("text/event-stream"));
                if small_cap {
                    t = t.with_max_event_bytes(48);
                }
                t.with_usage(usage)
            };
            let mut general = make();
            general.state.fast = false;
            proptest::prop_assert_eq!(trace(make(), &frames, split_bufs), trace(general, &frames, split_bufs));
        }
    }

    #[test]
    fn steady_fast_path_is_taken_and_memo_follows_the_prefix() {
        let sse = headers("text/event-stream");
        let mut t = StreamTracker::new(&Dialect::Auto, &sse);
        t.observe(&b(TOKEN));
        assert!(t.state.steady);
        let long_token = "data: {\"choices\":[{\"delta\":{\"content\":\"xy\"}}]}\n\n";
        let three = Bytes::from(format!("{long_token}{long_token}data: [DONE]\n\n"));
        let obs = t.observe(&three);
        assert_eq!((obs.events, obs.tokens, obs.done), (3, 2, true));
        assert!(t.state.memo.is_some_and(|m| m.class == Class::Token));
        // Same 16-byte prefix is not enough when the data is only 16 bytes long (then it is
        // whole, and decided afresh), and an error with a new prefix replaces the memo.
        let obs = t.observe(&b("data: {\"error\":{\"code\":1}}\n\n"));
        assert!(obs.error && obs.tokens == 0);
        assert!(t.state.memo.is_some_and(|m| m.class == Class::Error));
        let obs = t.observe(&b(long_token));
        assert_eq!(obs.tokens, 1);
        // A frame that ends inside an event leaves the fast path for the rest of it.
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
        assert!(t.state.steady && t.state.memo.is_none());
        assert_eq!(*asked.lock().unwrap(), 3);
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
    }

    #[test]
    fn usage_object_is_found_after_any_number_of_other_usage_keys() {
        let u = UsageState::default();
        assert!(u.may_carry_usage(br#"{"usage":{"prompt_tokens":1}}"#));
        assert!(u.may_carry_usage(br#"{"usage" :  {"a":1}}"#));
        assert!(u.may_carry_usage(br#"{"usage":null,"x":{"usage":"no"},"y":{"usage":{}}}"#));
        assert!(!u.may_carry_usage(br#"{"usage":null,"x":{"usage":"no"}}"#));
        assert!(!u.may_carry_usage(br#"{"choices":[],"usage":null}"#));
        assert!(!u.may_carry_usage(br#"{"usage""#));
        assert!(!u.may_carry_usage(br#"{"usage":"#));
        assert!(!u.may_carry_usage(b""));
        // Overlapping candidates both count (this is only the prefilter: the JSON parse that
        // follows decides, and rejects this one).
        assert!(u.may_carry_usage(br#""usage"usage":{}"#));
        assert!(u.may_carry_usage(br#""usage""usage":{}"#));
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
        // Off by default.
        let mut t = StreamTracker::new(&Dialect::Auto, &sse);
        t.observe(&b(
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5}}\n\n",
        ));
        assert_eq!(t.usage(), None);
    }
}
