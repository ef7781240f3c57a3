//! The response future and body of a [`ReplicaSet`](crate::ReplicaSet): an attempt waits in
//! the gateway for a free slot, then holds its slot until its body ends or is dropped.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower::ServiceExt;
use tower::util::Oneshot;
use tower_service::Service;

use crate::replicas::ReplicaSet;
use crate::score::{Settle, Ticket};

/// An attempt's slot on its replica, released when dropped. Dropped before its body ended, the
/// attempt was cancelled (a loser, or the client went away): a censored sample if it still
/// waited for its first token. An attempt whose body ended is settled by the hedge, which reads
/// that end (or, sent around the hedge, by the ticket's own drop).
struct Guard {
    ticket: Arc<Ticket>,
    ended: bool,
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
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        Waiting { req: Option<Request<B>> },
        Calling { #[pin] fut: Oneshot<S, Request<B>> },
    }
}

pin_project! {
    /// The response future of a [`ReplicaSet`](crate::ReplicaSet).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        set: ReplicaSet<S>,
        guard: Option<Guard>,
        #[pin]
        state: State<S, B>,
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("placed", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

impl<S, B, RB> ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
{
    pub(crate) fn new(set: ReplicaSet<S>, req: Request<B>) -> Self {
        let mut fut = ResponseFuture {
            set,
            guard: None,
            state: State::Waiting { req: None },
        };
        match fut.set.place(&req, None) {
            Some((i, ticket)) => {
                fut.guard = Some(Guard {
                    ticket,
                    ended: false,
                });
                let svc = fut.set.replica(i);
                fut.state = State::Calling {
                    fut: svc.oneshot(req),
                };
            }
            None => fut.state = State::Waiting { req: Some(req) },
        }
        fut
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
{
    type Output = Result<Response<ReplicaBody<RB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Waiting { req } => {
                    let Some(r) = req.as_ref() else {
                        return Poll::Pending;
                    };
                    // No free slot: parked until one is released, then placed again.
                    let Some((i, ticket)) = this.set.place(r, Some(cx.waker())) else {
                        return Poll::Pending;
                    };
                    let Some(r) = req.take() else {
                        return Poll::Pending;
                    };
                    *this.guard = Some(Guard {
                        ticket,
                        ended: false,
                    });
                    let fut = this.set.replica(i).oneshot(r);
                    this.state.set(State::Calling { fut });
                }
                StateProj::Calling { fut } => {
                    let res = ready!(fut.poll(cx));
                    let guard = this.guard.take();
                    return Poll::Ready(match res {
                        Ok(res) => Ok(res.map(|inner| ReplicaBody { inner, guard })),
                        Err(e) => {
                            if let Some(g) = &guard {
                                g.ticket.settle(Settle::Failed);
                            }
                            Err(e)
                        }
                    });
                }
            }
        }
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
