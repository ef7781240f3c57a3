//! Incremental scanners that find event boundaries in a body as its frames arrive.
//!
//! A scanner is fed each data frame exactly as it arrives and calls back once per complete event.
//! It never holds on to the frame and never buffers whole lines: what it needs across frames
//! (where it is in a line, the captured prefix of the event's data, the event name) lives in
//! small buffers it owns and reuses, so once warm it does not allocate per frame, and fed one
//! byte per frame it stays linear. One line, event or message larger than the cap
//! ([`DEFAULT_MAX_EVENT_BYTES`] unless set) is a [`ScanError`], never unbounded buffering; the
//! bytes are counted whether they are captured or not.
//!
//! *Capture*: how much of each event's data the scanner copies out for the classifier. Before
//! the first token a classifier needs the whole JSON; after it, a short prefix tells `[DONE]`
//! from data. [`set_capture`](SseScanner::set_capture) bounds the copy; [`Captured::len`] still
//! reports the full length.
//!
//! *Pending bytes*: each scanner's `pending_bytes()` is the number of bytes fed since the last
//! event boundary, i.e. the start of an event that is not complete yet. A layer that ends a
//! stream early forwards everything but those, so the client never sees half an event.

mod grpc;
mod ndjson;
mod sse;

pub use grpc::{Grpc, GrpcScanner};
pub use ndjson::{Ndjson, NdjsonScanner};
pub use sse::{MAX_EVENT_NAME_BYTES, Sse, SseScanner};

use bytes::Buf;

use crate::error::ScanError;

/// Default cap on one SSE line or event, one gRPC message or one NDJSON line: 1 MiB.
///
/// Large enough for any real completion chunk (tool-call deltas included), small enough that a
/// hostile upstream cannot make a proxy buffer without bound.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1 << 20;

/// Data captured for one event: a prefix of at most the capture limit, and the full length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Captured<'a> {
    /// The captured bytes (all of them when [`is_complete`](Captured::is_complete)).
    pub bytes: &'a [u8],
    /// The full length of the data, captured or not.
    pub len: usize,
    /// The last byte of the whole data that is not ASCII whitespace, captured or not (`None`
    /// when there is none): with the captured prefix, how a JSON document begins and ends,
    /// which tells junk from an object without capturing the whole event.
    pub last: Option<u8>,
}

impl<'a> Captured<'a> {
    /// `bytes` captured whole (for a classifier's tests, say).
    pub fn whole(bytes: &'a [u8]) -> Self {
        Captured {
            bytes,
            len: bytes.len(),
            last: last_non_space(bytes, None),
        }
    }

    /// Whether `bytes` holds the whole data.
    pub fn is_complete(&self) -> bool {
        self.bytes.len() == self.len
    }

    /// The same data captured with a limit of `limit` bytes: at most that prefix, the same
    /// full length.
    pub fn limited(self, limit: usize) -> Captured<'a> {
        Captured {
            bytes: &self.bytes[..self.bytes.len().min(limit)],
            len: self.len,
            last: self.last,
        }
    }
}

/// One complete item found by a scanner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event<'a> {
    /// An SSE comment line (starts with `:`); `text` is what follows the colon (captured prefix).
    Comment {
        /// The comment text after the colon.
        text: Captured<'a>,
    },
    /// A dispatched SSE event (a blank line after at least one `data` field).
    Sse {
        /// The `event` field, empty when absent (the client then sees `message`).
        name: &'a [u8],
        /// The `data` fields joined with `\n`.
        data: Captured<'a>,
    },
    /// One gRPC length-prefixed message.
    Grpc {
        /// The compressed flag of the message.
        compressed: bool,
        /// The message bytes.
        data: Captured<'a>,
    },
    /// One non-empty NDJSON line, without its line end.
    Line {
        /// The line.
        data: Captured<'a>,
    },
    /// A non-empty run of body bytes (the framing of opaque bodies).
    Bytes {
        /// How many bytes.
        len: usize,
    },
}

impl<'a> Event<'a> {
    /// The same event with its data (or comment text) captured with a limit of `limit` bytes.
    pub(crate) fn limited(self, limit: usize) -> Event<'a> {
        match self {
            Event::Comment { text } => Event::Comment {
                text: text.limited(limit),
            },
            Event::Sse { name, data } => Event::Sse {
                name,
                data: data.limited(limit),
            },
            Event::Grpc { compressed, data } => Event::Grpc {
                compressed,
                data: data.limited(limit),
            },
            Event::Line { data } => Event::Line {
                data: data.limited(limit),
            },
            Event::Bytes { len } => Event::Bytes { len },
        }
    }
}

/// Calls `feed` with each contiguous chunk of `buf`, without consuming `buf`.
///
/// Uses [`Buf::chunks_vectored`] with room for 64 chunks. Every data type that hyper, axum,
/// tonic and `bytes` produce is one or two chunks; a buffer made of more than 64 discontiguous
/// chunks is seen through its first 64 only.
pub fn for_each_chunk<B: Buf + ?Sized>(buf: &B, mut feed: impl FnMut(&[u8])) {
    let mut slices = [std::io::IoSlice::new(&[]); 64];
    let n = buf.chunks_vectored(&mut slices);
    for s in &slices[..n] {
        if !s.is_empty() {
            feed(s);
        }
    }
}

/// An incremental scanner of one framing: [`SseScanner`], [`GrpcScanner`] or
/// [`NdjsonScanner`].
///
/// The framing ([`Sse`], [`Grpc`], [`Ndjson`]) decides where events begin and end; the scanner
/// around it keeps the caps and the error. After an error the scanner is spent: every later
/// call returns the same error.
#[derive(Debug, Default)]
pub struct Scanner<F> {
    framing: F,
    error: Option<ScanError>,
}

impl<F: Framer> Scanner<F> {
    /// A scanner with the default cap ([`DEFAULT_MAX_EVENT_BYTES`]) that captures whole events.
    pub fn new() -> Self
    where
        F: Default,
    {
        Scanner::with_framing(F::default())
    }

    pub(crate) fn with_framing(framing: F) -> Self {
        Scanner {
            framing,
            error: None,
        }
    }

    /// Sets the cap on one event (an SSE line or event, a gRPC message, an NDJSON line).
    pub fn with_max_event_bytes(mut self, max: usize) -> Self {
        self.framing.limits_mut().max = max;
        self
    }

    /// Copies at most `limit` bytes of each event's data (and of each SSE comment) out of the
    /// stream; [`Captured::len`] still reports the full length. Default: everything (bounded by
    /// the cap). Takes effect for data not yet seen.
    pub fn set_capture(&mut self, limit: usize) {
        self.framing.limits_mut().capture = limit;
    }

    /// Bytes fed since the last event boundary: the part of the stream that belongs to an
    /// event (or a line) not complete yet.
    pub fn pending_bytes(&self) -> usize {
        self.framing.limits().pending
    }

    /// Feeds one contiguous chunk; calls `on_event` for each complete event.
    pub fn feed(
        &mut self,
        chunk: &[u8],
        mut on_event: impl FnMut(Event<'_>),
    ) -> Result<(), ScanError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let result = self.framing.feed(chunk, &mut on_event);
        self.error = result.err();
        result
    }

    /// Feeds every chunk of `buf` (without consuming it), see [`for_each_chunk`].
    pub fn feed_buf<B: Buf + ?Sized>(
        &mut self,
        buf: &B,
        mut on_event: impl FnMut(Event<'_>),
    ) -> Result<(), ScanError> {
        let mut result = Ok(());
        for_each_chunk(buf, |chunk| {
            if result.is_ok() {
                result = self.feed(chunk, &mut on_event);
            }
        });
        result
    }

    /// Ends the body: reports what the framing allows (an NDJSON last line without a line end;
    /// an incomplete SSE event or gRPC message is discarded). Returns the error the scanner met,
    /// if any.
    pub fn finish(&mut self, mut on_event: impl FnMut(Event<'_>)) -> Result<(), ScanError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.framing.finish(&mut on_event);
        Ok(())
    }
}

mod framer {
    use super::{DEFAULT_MAX_EVENT_BYTES, Event, ScanError};

    /// The rules of one framing, as a [`Scanner`](super::Scanner) drives them.
    pub trait Framer {
        /// The caps and the pending count.
        fn limits(&self) -> &Limits;
        /// The caps and the pending count, mutably.
        fn limits_mut(&mut self) -> &mut Limits;
        /// Reads one chunk.
        fn feed(
            &mut self,
            chunk: &[u8],
            on_event: &mut impl FnMut(Event<'_>),
        ) -> Result<(), ScanError>;
        /// Ends the body.
        fn finish(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
            let _ = on_event;
        }
    }

    /// What every framing keeps besides its own state.
    #[derive(Debug)]
    pub struct Limits {
        /// The cap on one event.
        pub max: usize,
        /// How much of each event's data is copied out.
        pub capture: usize,
        /// Bytes fed since the last event boundary.
        pub pending: usize,
    }

    impl Default for Limits {
        fn default() -> Self {
            Limits {
                max: DEFAULT_MAX_EVENT_BYTES,
                capture: usize::MAX,
                pending: 0,
            }
        }
    }
}

pub(crate) use framer::{Framer, Limits};

/// The last byte of `bytes` that is not ASCII whitespace, else `prev` (what [`Captured::last`]
/// was before `bytes`): a look at the end of each piece of data, not a scan of it.
fn last_non_space(bytes: &[u8], prev: Option<u8>) -> Option<u8> {
    bytes
        .iter()
        .rev()
        .find(|b| !b.is_ascii_whitespace())
        .copied()
        .or(prev)
}

/// Appends to `buf` as much of `bytes` as keeps it within `limit` bytes (the capture of every
/// scanner).
fn capture(buf: &mut Vec<u8>, limit: usize, bytes: &[u8]) {
    let room = limit.saturating_sub(buf.len());
    buf.extend_from_slice(&bytes[..room.min(bytes.len())]);
}
