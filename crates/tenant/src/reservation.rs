//! [`Reservation`]: a request's reserved tokens, settled exactly once; [`Meter`]: what its
//! response stream used.

use std::sync::Arc;

use bytes::Buf;
use http::HeaderMap;
use tailguard_core::Tenant;
use tailguard_core::progress::Reading;

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

/// A `2xx` response's use, as its body passes: settles the reservation when the body ends,
/// fails or is dropped (this is dropped with it).
///
/// * **Input**: the prompt tokens the stream reported, else the reserved estimate (the
///   upstream accepted the prompt).
/// * **Output**: the completion tokens the stream reported, else the content events this
///   layer passed on to the client (one per chunk: a client that went away, a stream that
///   reported nothing, a resumed stream). A response that is not a stream this layer can read
///   (a whole JSON document) is charged its reserved output, unless its body was empty.
pub(crate) struct Meter {
    reservation: Option<Reservation>,
    /// `None`: not a stream; the reserved output is charged.
    reading: Option<Reading>,
    /// No body at all: no output.
    empty: bool,
}

impl Meter {
    pub(crate) fn new(reservation: Reservation, reading: Option<Reading>, empty: bool) -> Self {
        Meter {
            reservation: Some(reservation),
            reading,
            empty,
        }
    }

    pub(crate) fn observe<D: Buf + ?Sized>(&mut self, data: &D) {
        if let Some(r) = self.reading.as_mut() {
            r.observe(data);
        }
    }

    pub(crate) fn observe_trailers(&mut self, trailers: &HeaderMap) {
        if let Some(r) = self.reading.as_mut() {
            r.observe_trailers(trailers);
        }
    }

    /// The body ended cleanly: flushes what the framing allows, then settles.
    pub(crate) fn finish(mut self) {
        if let Some(r) = self.reading.as_mut() {
            r.finish();
        }
    }

    /// What the response used, as far as seen.
    fn used(&self, reserved: Tokens) -> Tokens {
        let usage = self.reading.as_ref().and_then(Reading::usage);
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
