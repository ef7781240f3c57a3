//! Per-response token tracking: a scanner and a classifier driven frame by frame.

use bytes::Buf;
use http::HeaderMap;

use crate::classify::{Dialect, Wire};
use crate::error::ScanError;

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
#[derive(Debug)]
pub struct StreamTracker {
    _private: (),
}

impl StreamTracker {
    /// A tracker for a response with `headers`, finding tokens as `dialect` says.
    pub fn new(dialect: &Dialect, headers: &HeaderMap) -> Self {
        let _ = (dialect, headers);
        todo!("implemented by the scanner work")
    }

    /// Sets the cap on one line/event/message (default
    /// [`DEFAULT_MAX_EVENT_BYTES`](crate::scan::DEFAULT_MAX_EVENT_BYTES)).
    pub fn with_max_event_bytes(self, max: usize) -> Self {
        let _ = max;
        todo!()
    }

    /// Also extracts [`Usage`] from the stream (off by default: it captures the data of events
    /// that may carry usage after the first token).
    pub fn with_usage(self, usage: bool) -> Self {
        let _ = usage;
        todo!()
    }

    /// Scans one data frame.
    pub fn observe<D: Buf + ?Sized>(&mut self, data: &D) -> Observation {
        let _ = data;
        todo!()
    }

    /// Looks at the trailers (a gRPC `grpc-status` other than 0 is an error).
    pub fn observe_trailers(&mut self, trailers: &HeaderMap) -> Observation {
        let _ = trailers;
        todo!()
    }

    /// Ends the body: flushes what the framing allows (an NDJSON last line with no line end).
    pub fn finish(&mut self) -> Observation {
        todo!()
    }

    /// Whether a token was seen.
    pub fn first_token_seen(&self) -> bool {
        todo!()
    }

    /// Events seen so far (all classes).
    pub fn events(&self) -> u64 {
        todo!()
    }

    /// Token events seen so far.
    pub fn tokens(&self) -> u64 {
        todo!()
    }

    /// Bytes fed since the last event boundary: the tail of the stream that is part of an event
    /// not complete yet. A layer that ends a stream early holds these back so that the client
    /// never sees half an event.
    pub fn pending_bytes(&self) -> usize {
        todo!()
    }

    /// The wire dialect of the stream as far as seen (e.g. Anthropic once an Anthropic event
    /// name appeared).
    pub fn wire(&self) -> Wire {
        todo!()
    }

    /// Usage reported by the stream, when [`with_usage`](StreamTracker::with_usage) is on.
    pub fn usage(&self) -> Option<Usage> {
        todo!()
    }
}
