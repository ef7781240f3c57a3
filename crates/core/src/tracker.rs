//! Per-response token tracking: a scanner and a classifier driven frame by frame.

use std::sync::Arc;

use bytes::Buf;
use http::HeaderMap;
use memchr::memmem;

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
/// pass over the frame and a few byte comparisons per event. After a [`ScanError`] the tracker
/// reports it once and scans nothing more.
#[derive(Debug)]
pub struct StreamTracker {
    scanner: Scanner,
    state: State,
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
}

#[derive(Debug)]
struct UsageState {
    finder: memmem::Finder<'static>,
    usage: Usage,
    seen: bool,
}

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
            state: State {
                preset,
                detect_anthropic,
                wire,
                first_token_seen: false,
                events: 0,
                tokens: 0,
                failed: false,
                usage: None,
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
        self.state.usage = usage.then(|| UsageState {
            finder: memmem::Finder::new(b"\"usage\""),
            usage: Usage::default(),
            seen: false,
        });
        self.set_capture();
        self
    }

    /// Scans one data frame.
    pub fn observe<D: Buf + ?Sized>(&mut self, data: &D) -> Observation {
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

    /// Looks at the trailers (a gRPC `grpc-status` other than 0 is an error).
    pub fn observe_trailers(&mut self, trailers: &HeaderMap) -> Observation {
        let mut obs = Observation::default();
        if let Some(status) = trailers.get("grpc-status")
            && status.as_bytes().trim_ascii() != b"0"
        {
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
    }

    /// Sets the scanner's capture for the current phase.
    fn set_capture(&mut self) {
        let limit = if !self.state.first_token_seen || self.state.usage.is_some() {
            usize::MAX
        } else {
            self.state.preset.capture_after_first_token()
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
    pub fn pending_bytes(&self) -> usize {
        match &self.scanner {
            Scanner::Sse(s) => s.pending_bytes(),
            Scanner::Grpc(s) => s.pending_bytes(),
            Scanner::Ndjson(s) => s.pending_bytes(),
            Scanner::Bytes => 0,
        }
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
    #[inline]
    fn on_event(&mut self, event: &Event<'_>, obs: &mut Observation) {
        let class = self.preset.classify(event, self.first_token_seen);
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
    /// Extracts usage from an event whose data has a `"usage"` member holding an object.
    fn scan(&mut self, data: &Captured<'_>) {
        if !data.is_complete() || !self.may_carry_usage(data.bytes) {
            return;
        }
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(data.bytes) else {
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
    fn may_carry_usage(&self, bytes: &[u8]) -> bool {
        self.finder.find_iter(bytes).any(|at| {
            let rest = bytes[at + 7..].trim_ascii_start();
            match rest.split_first() {
                Some((b':', rest)) => rest.trim_ascii_start().first() == Some(&b'{'),
                _ => false,
            }
        })
    }
}
