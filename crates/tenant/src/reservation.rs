//! [`Reservation`]: a request's reserved tokens, settled exactly once; [`Meter`]: what its
//! response (a stream, or a whole document) used.

use std::sync::Arc;

use bytes::Buf;
use http::HeaderMap;
use tailguard_core::progress::Reading;
use tailguard_core::scan::for_each_chunk;
use tailguard_core::{Tenant, Usage};

use crate::limit::{Limit, Tokens};
use crate::metrics;
use crate::store::{Store, Ticket};

/// Tokens taken from a tenant's buckets for one request in flight.
///
/// Settled exactly once: by [`settle`](Self::settle) with what the request used, or, if it is
/// dropped unsettled (the response future dropped before the head, a panic), as unused.
pub(crate) struct Reservation {
    store: Arc<dyn Store>,
    tenant: Tenant,
    limits: Arc<[Limit]>,
    ticket: Ticket,
    reserved: Tokens,
    settled: bool,
}

impl Reservation {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        tenant: Tenant,
        limits: Arc<[Limit]>,
        ticket: Ticket,
        reserved: Tokens,
    ) -> Self {
        metrics::reserved(&tenant, reserved, true);
        Reservation {
            store,
            tenant,
            limits,
            ticket,
            reserved,
            settled: false,
        }
    }

    /// The reserved tokens.
    pub(crate) fn reserved(&self) -> Tokens {
        self.reserved
    }

    /// Settles with `used`: the store gives back or takes the difference, the metrics count
    /// the use.
    pub(crate) fn settle(mut self, used: Tokens) {
        self.finish(used);
    }

    fn finish(&mut self, used: Tokens) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        self.store
            .reconcile(&self.tenant, &self.limits, self.ticket, self.reserved, used);
        metrics::reserved(&self.tenant, self.reserved, false);
        metrics::used(&self.tenant, used);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.finish(Tokens::ZERO);
    }
}

/// The most bytes of a `2xx` answer that is not a stream (a whole JSON document, such as a chat
/// completion asked without `stream`) that [`TokenBudget`](crate::TokenBudget) keeps, to read
/// the usage it reports when its body ends: 1 MiB.
///
/// The usage is usually the document's last member, so the whole body is kept (a copy of its
/// frames, which pass on untouched): at most this much per answer in flight. A longer answer,
/// or one whose size hint says it will be, is not kept past the cap and is charged its
/// reserved output, as is one whose body fails or is dropped before its end.
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// A `2xx` response's use, as its body passes: settles the reservation when the body ends,
/// fails or is dropped (this is dropped with it).
///
/// * **Input**: the prompt tokens the stream (or the document) reported, else the reserved
///   estimate (the upstream accepted the prompt).
/// * **Output**: the completion tokens the stream reported, else the content events this
///   layer passed on to the client (one per chunk: a client that went away, a stream that
///   reported nothing, a resumed stream). A response that is not a stream this layer can read
///   (a whole JSON document) is charged the completion tokens it reported when its body ended
///   cleanly within [`MAX_DOCUMENT_BYTES`], else its reserved output; an empty body, none.
pub(crate) struct Meter {
    reservation: Option<Reservation>,
    /// `None`: not a stream; see `document`.
    reading: Option<Reading>,
    /// Not a stream, and a body: the document, read for its usage when it ends.
    document: Option<Document>,
    /// No body at all: no output.
    empty: bool,
}

/// A whole document's body, collected to read its usage when it ends cleanly.
enum Document {
    /// The bytes so far (at most [`MAX_DOCUMENT_BYTES`]).
    Collecting(Vec<u8>),
    /// Ended cleanly: the usage it reported, if any.
    Ended(Option<Usage>),
    /// Over the cap: no longer collected, charged its reserved output.
    Over,
}

impl Document {
    /// A document of at least `len` bytes (its body's size hint).
    fn new(len: u64) -> Self {
        match usize::try_from(len) {
            // Room for what the hint promises, up to 64 KiB: a hint is the upstream's word,
            // and what it does not send is not allocated.
            Ok(len) if len <= MAX_DOCUMENT_BYTES => {
                Document::Collecting(Vec::with_capacity(len.min(64 << 10)))
            }
            _ => Document::Over,
        }
    }

    fn collect<D: Buf + ?Sized>(&mut self, data: &D) {
        let Document::Collecting(bytes) = self else {
            return;
        };
        let (before, len) = (bytes.len(), data.remaining());
        if before + len > MAX_DOCUMENT_BYTES {
            *self = Document::Over;
            return;
        }
        for_each_chunk(data, |chunk| bytes.extend_from_slice(chunk));
        // A buffer of more chunks than `for_each_chunk` sees: the document is not whole.
        if bytes.len() - before != len {
            *self = Document::Over;
        }
    }

    fn finish(&mut self) {
        if let Document::Collecting(bytes) = self {
            *self = Document::Ended(Usage::from_json(bytes));
        }
    }

    /// The usage the document reported, if it ended cleanly.
    fn usage(&self) -> Option<Usage> {
        match self {
            Document::Ended(usage) => *usage,
            Document::Collecting(_) | Document::Over => None,
        }
    }
}

impl Meter {
    /// The meter of a response whose body is a stream this layer reads (`reading`), or else a
    /// document (of at least `len` bytes, its size hint), or `empty`.
    pub(crate) fn new(
        reservation: Reservation,
        reading: Option<Reading>,
        empty: bool,
        len: u64,
    ) -> Self {
        let document = (reading.is_none() && !empty).then(|| Document::new(len));
        Meter {
            reservation: Some(reservation),
            reading,
            document,
            empty,
        }
    }

    pub(crate) fn observe<D: Buf + ?Sized>(&mut self, data: &D) {
        if let Some(r) = self.reading.as_mut() {
            r.observe(data);
        } else if let Some(d) = self.document.as_mut() {
            d.collect(data);
        }
    }

    pub(crate) fn observe_trailers(&mut self, trailers: &HeaderMap) {
        if let Some(r) = self.reading.as_mut() {
            r.observe_trailers(trailers);
        }
    }

    /// The body ended cleanly: flushes what the framing allows (or reads the document's
    /// usage), then settles.
    pub(crate) fn finish(mut self) {
        if let Some(r) = self.reading.as_mut() {
            r.finish();
        } else if let Some(d) = self.document.as_mut() {
            d.finish();
        }
    }

    /// What the response used, as far as seen.
    fn used(&self, reserved: Tokens) -> Tokens {
        let usage = match (&self.reading, &self.document) {
            (Some(r), _) => r.usage(),
            (None, Some(d)) => d.usage(),
            (None, None) => None,
        };
        let input = usage
            .and_then(|u| u.prompt_tokens)
            .unwrap_or(reserved.input);
        let counted = match &self.reading {
            _ if self.empty => 0,
            Some(r) => r.tokens(),
            None => reserved.output,
        };
        let output = usage.and_then(|u| u.completion_tokens).unwrap_or(counted);
        Tokens::new(input, output)
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if let Some(r) = self.reservation.take() {
            let used = self.used(r.reserved());
            r.settle(used);
        }
    }
}
