//! The response body of a [`ReplicaSet`](crate::ReplicaSet): it holds the attempt's slot on
//! its replica until it ends or is dropped.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tailguard_core::attempt::{AttemptClaim, Settle};

use crate::health::Ticket;

/// An attempt's slot on its replica, released when dropped. Dropped before its body ended, the
/// attempt was cancelled (a loser, or the client went away): a censored sample if it still
/// waited for its first token. An attempt whose body ended is settled by the hedge, which reads
/// that end (or, sent around the hedge, by the ticket's own drop).
pub(crate) struct Guard {
    pub(crate) ticket: Arc<Ticket>,
    pub(crate) ended: bool,
}

impl Guard {
    /// The slot of the attempt `ticket` placed.
    pub(crate) fn new(ticket: Arc<Ticket>) -> Self {
        Guard {
            ticket,
            ended: false,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.ended {
            self.ticket.settle(Settle::Cancelled);
        }
        self.ticket.release();
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard").field("ended", &self.ended).finish()
    }
}

pin_project! {
    /// The response body of a [`ReplicaSet`](crate::ReplicaSet): the replica's body, holding
    /// the attempt's slot until it ends or is dropped.
    pub struct ReplicaBody<B> {
        #[pin]
        inner: B,
        guard: Option<Guard>,
    }
}

impl<B> ReplicaBody<B> {
    pub(crate) fn new(inner: B, guard: Option<Guard>) -> Self {
        ReplicaBody { inner, guard }
    }

    /// The replica's body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B: fmt::Debug> fmt::Debug for ReplicaBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicaBody")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for ReplicaBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        if let (Some(Err(_)), Some(g)) = (&frame, this.guard.as_ref()) {
            // Broken off: a single-slot server's interruption, perhaps (see `Ticket`).
            g.ticket.cut_short();
        }
        if frame.is_none() || this.inner.is_end_stream() {
            // Ended: the slot frees now, not when the body is dropped.
            if let Some(mut g) = this.guard.take() {
                g.ended = true;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
