//! One reading of each stream: the progress record the layers of one request share.
//!
//! Several layers watch the same response stream: the timeout (its timers and its ending), the
//! recorder (first token, gaps, usage, end reason), admission's adaptive limit (the first
//! token). Each used to scan every frame with a [`StreamTracker`] of its own, in a dialect of
//! its own configuration. Now the stream is read once:
//!
//! * each layer takes the request's [`StreamProgress`] from its extensions when it calls the
//!   inner service ([`StreamProgress::of`], which puts one there if no layer did), and says what
//!   it needs of the reading ([`want_usage`](StreamProgress::want_usage));
//! * at the response head, the first layer to start a [`Reading`] (the innermost one that reads
//!   the stream: it sees the head first) reads the stream with a tracker, in the dialect it
//!   resolved, and publishes what it saw after every frame; every layer that starts a reading
//!   later follows that record and reads no byte itself.
//!
//! Both kinds of reading answer the same calls with the same meaning (an [`Observation`] per
//! frame: what is new since the layer's last frame), so a layer has one code path, alone or in
//! a stack. A follower outside a layer that holds frames back (the timeout holds back the
//! bytes of an unfinished event) learns of an event when the frame that ends it reaches it.
//!
//! A hedge sends several attempts of a request and reads each one up to its first token on its
//! own (attempts race, and a loser's stream is not the request's): it keeps its own trackers,
//! and no record goes on with an attempt.
//!
//! ```
//! use bytes::Bytes;
//! use http::{HeaderMap, HeaderValue, Request};
//! use tailguard_core::Dialect;
//! use tailguard_core::progress::StreamProgress;
//!
//! let mut req = Request::new(());
//! // An outer layer (the recorder) and an inner one (the timeout) take the same record.
//! let outer = StreamProgress::of(req.extensions_mut());
//! let inner = StreamProgress::of(req.extensions_mut());
//! let mut headers = HeaderMap::new();
//! headers.insert("content-type", HeaderValue::from_static("text/event-stream"));
//! // The inner layer sees the response first: it reads the stream.
//! let mut reads = inner.reading(&Dialect::OpenAi, &headers);
//! let mut follows = outer.reading(&Dialect::OpenAi, &headers);
//! assert!(reads.is_reader() && !follows.is_reader());
//!
//! let frame = Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n");
//! assert!(reads.observe(&frame).first_token);
//! // The frame goes on outwards: the outer layer learns of it from the record.
//! let seen = follows.observe(&frame);
//! assert!(seen.first_token);
//! assert_eq!((seen.tokens, follows.tokens()), (1, 1));
//! ```

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Buf;
use http::{Extensions, HeaderMap};

use crate::classify::{Dialect, Wire};
use crate::error::ScanError;
use crate::tracker::{Observation, StreamTracker, Usage};

/// The progress record of one request's response stream, shared by the layers of that request
/// through the request extensions. See the [module docs](self).
#[derive(Clone, Debug, Default)]
pub struct StreamProgress {
    slot: Arc<Mutex<Slot>>,
}

#[derive(Debug, Default)]
struct Slot {
    /// A layer asked for usage (and exact output counts).
    usage: bool,
    /// A layer asked whether a finish reason came.
    finish: bool,
    /// A layer reads the stream.
    claimed: bool,
    seen: Seen,
}

/// What the stream's reader saw, from the start of the stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Seen {
    events: u64,
    tokens: u64,
    meta: u64,
    keepalives: u64,
    done: bool,
    error: bool,
    malformed: bool,
    first_token: bool,
    finished: bool,
    finish_seen: bool,
    scan_error: Option<ScanError>,
    usage: Option<Usage>,
    wire: Option<Wire>,
    pending_bytes: usize,
}

impl Seen {
    /// What `self` holds that `before` did not, as one observation.
    fn since(&self, before: &Seen) -> Observation {
        let n = |now: u64, then: u64| u32::try_from(now.saturating_sub(then)).unwrap_or(u32::MAX);
        Observation {
            events: n(self.events, before.events),
            tokens: n(self.tokens, before.tokens),
            meta: n(self.meta, before.meta),
            keepalives: n(self.keepalives, before.keepalives),
            done: self.done && !before.done,
            error: self.error && !before.error,
            malformed: self.malformed && !before.malformed,
            first_token: self.first_token && !before.first_token,
            finished: self.finished && !before.finished,
            scan_error: self.scan_error.filter(|_| before.scan_error.is_none()),
        }
    }
}

impl StreamProgress {
    /// The request's record: the one in `extensions`, or a new one, put there for the layers
    /// inside.
    pub fn of(extensions: &mut Extensions) -> StreamProgress {
        extensions.get_or_insert_default::<StreamProgress>().clone()
    }

    /// A record of its own, for an attempt that is not the request's stream.
    pub fn detached() -> StreamProgress {
        StreamProgress::default()
    }

    /// Asks the stream's reader to extract [`Usage`] and count output exactly (see
    /// [`StreamTracker::with_usage`]); call it before the request goes on to the layers inside.
    pub fn want_usage(&self) {
        self.lock().usage = true;
    }

    /// Asks the stream's reader to find a finish reason after the first token too (see
    /// [`StreamTracker::with_finish`]); call it before the request goes on to the layers
    /// inside.
    pub fn want_finish(&self) {
        self.lock().finish = true;
    }

    /// Starts this layer's reading of the response with `headers`: the first caller reads the
    /// stream (a [`StreamTracker`] in `dialect`, resolved against the headers); every later
    /// caller follows it, whatever its own `dialect`.
    pub fn reading(&self, dialect: &Dialect, headers: &HeaderMap) -> Reading {
        let mut slot = self.lock();
        if slot.claimed {
            return Reading {
                kind: Kind::Follow {
                    record: self.clone(),
                    seen: Seen::default(),
                },
            };
        }
        slot.claimed = true;
        let tracker = StreamTracker::new(dialect, headers)
            .with_usage(slot.usage)
            .with_finish(slot.finish);
        slot.seen.wire = Some(tracker.wire());
        drop(slot);
        Reading {
            kind: Kind::Read {
                tracker: Box::new(tracker),
                record: self.clone(),
            },
        }
    }

    /// Whether the stream, past its first token, ended with a terminal event while its finish
    /// reason was missing (see [`Reading::finish_missing`]): an answer cut short, as by an
    /// interrupting server's bare `[DONE]`. Only when a layer asked for the finish reason or
    /// usage, as the reader looks for it only then.
    pub fn cut_short(&self) -> bool {
        let slot = self.lock();
        let s = &slot.seen;
        let asked = slot.finish || slot.usage;
        let wire = s.wire.unwrap_or(Wire::Opaque);
        asked && s.done && s.first_token && finish_missing(wire, s.finish_seen)
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The rule behind [`Reading::finish_missing`]: a wire with a way to say how an answer ended
/// that has not said it.
fn finish_missing(wire: Wire, finish_seen: bool) -> bool {
    matches!(wire, Wire::OpenAiSse | Wire::AnthropicSse) && !finish_seen
}

/// One layer's reading of a response stream: the stream's tracker (the layer reads it and
/// publishes what it saw), or a follower of the layer that does. See the [module docs](self).
#[derive(Debug)]
pub struct Reading {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Read {
        tracker: Box<StreamTracker>,
        record: StreamProgress,
    },
    Follow {
        record: StreamProgress,
        /// The record as of this layer's last frame.
        seen: Seen,
    },
}

impl Reading {
    /// Whether this layer reads the stream (the others follow it).
    pub fn is_reader(&self) -> bool {
        matches!(self.kind, Kind::Read { .. })
    }

    /// A data frame reached this layer: what it holds that the layer had not seen.
    pub fn observe<D: Buf + ?Sized>(&mut self, data: &D) -> Observation {
        self.step(|t| t.observe(data))
    }

    /// The trailers reached this layer.
    pub fn observe_trailers(&mut self, trailers: &HeaderMap) -> Observation {
        self.step(|t| t.observe_trailers(trailers))
    }

    /// The body ended: flushes what the framing allows (an NDJSON last line with no line end).
    pub fn finish(&mut self) -> Observation {
        self.step(StreamTracker::finish)
    }

    /// The reader runs `f` on its tracker and publishes; a follower takes what is new.
    fn step(&mut self, f: impl FnOnce(&mut StreamTracker) -> Observation) -> Observation {
        match &mut self.kind {
            Kind::Read { tracker, record } => {
                let obs = f(tracker);
                let mut slot = record.lock();
                let s = &mut slot.seen;
                s.events = tracker.events();
                s.tokens = tracker.tokens();
                s.meta += u64::from(obs.meta);
                s.keepalives += u64::from(obs.keepalives);
                s.done |= obs.done;
                s.error |= obs.error;
                s.malformed |= obs.malformed;
                s.first_token = tracker.first_token_seen();
                s.finished = tracker.finished_empty();
                s.finish_seen = tracker.finish_seen();
                s.scan_error = s.scan_error.or(obs.scan_error);
                s.usage = tracker.usage();
                s.wire = Some(tracker.wire());
                s.pending_bytes = tracker.pending_bytes();
                obs
            }
            Kind::Follow { record, seen } => {
                let now = record.lock().seen;
                let obs = now.since(seen);
                *seen = now;
                obs
            }
        }
    }

    /// The record as of this layer's last frame (the reader's is always current).
    fn seen(&self) -> Seen {
        match &self.kind {
            Kind::Read { record, .. } => record.lock().seen,
            Kind::Follow { seen, .. } => *seen,
        }
    }

    /// Events seen so far (all classes).
    pub fn events(&self) -> u64 {
        self.seen().events
    }

    /// Token events seen so far.
    pub fn tokens(&self) -> u64 {
        self.seen().tokens
    }

    /// Whether a token was seen.
    pub fn first_token_seen(&self) -> bool {
        self.seen().first_token
    }

    /// Whether a finish reason came (see [`StreamTracker::finish_seen`] and
    /// [`StreamProgress::want_finish`]).
    pub fn finish_seen(&self) -> bool {
        self.seen().finish_seen
    }

    /// Whether the stream has not said how its answer ended where its wire has a way to: no
    /// finish reason yet on an OpenAI or Anthropic stream (see [`finish_seen`](Self::finish_seen);
    /// the reader must want it, [`StreamProgress::want_finish`] or
    /// [`want_usage`](StreamProgress::want_usage)). A terminal event while this holds ends an
    /// answer cut short: an interrupting server ends the running stream with a bare `[DONE]`.
    /// Never on the Responses API's or gRPC's wires, whose endings say it otherwise.
    pub fn finish_missing(&self) -> bool {
        finish_missing(self.wire(), self.finish_seen())
    }

    /// Usage reported by the stream (see [`StreamProgress::want_usage`]).
    pub fn usage(&self) -> Option<Usage> {
        self.seen().usage
    }

    /// The stream's wire dialect as far as seen (see [`StreamTracker::wire`]).
    pub fn wire(&self) -> Wire {
        match &self.kind {
            Kind::Read { tracker, .. } => tracker.wire(),
            Kind::Follow { seen, record } => seen
                .wire
                .or(record.lock().seen.wire)
                .unwrap_or(Wire::Opaque),
        }
    }

    /// Bytes of an event not complete yet (see [`StreamTracker::pending_bytes`]).
    pub fn pending_bytes(&self) -> usize {
        match &self.kind {
            Kind::Read { tracker, .. } => tracker.pending_bytes(),
            Kind::Follow { seen, .. } => seen.pending_bytes,
        }
    }
}
