//! The response future of a [`ReplicaSet`](crate::ReplicaSet): an attempt waits in the
//! gateway for a free slot, then calls its replica.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tailguard_core::Upstream;
use tailguard_core::attempt::{Attempt, AttemptClaim, Settle};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;
use tower::util::Oneshot;
use tower_service::Service;

use crate::body::{Guard, ReplicaBody};
use crate::line::Spot;
use crate::place::Placer;

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
        set: Placer<S>,
        // Its place in the set's line while it waits for a slot.
        spot: Spot,
        // Wakes it when its patience for a preferred replica runs out.
        patience: Option<Pin<Box<Sleep>>>,
        guard: Option<Guard>,
        // The replica placed on, once placed.
        replica: usize,
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
    pub(crate) fn new(set: Placer<S>, req: Request<B>) -> Self {
        let since = req
            .extensions()
            .get::<Attempt>()
            .map_or_else(Instant::now, Attempt::since);
        let spot = Spot::new(set.health.clone(), since);
        let mut fut = ResponseFuture {
            set,
            spot,
            patience: None,
            guard: None,
            replica: 0,
            state: State::Waiting { req: None },
        };
        match fut.set.place(&req, &mut fut.spot, None) {
            Some((i, ticket)) => {
                fut.guard = Some(Guard::new(ticket));
                fut.replica = i;
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
                    // No free slot (or one only on a replica worse than waiting): in line
                    // until a slot is released, then placed again.
                    let Some((i, ticket)) = this.set.place(r, this.spot, Some(cx.waker())) else {
                        let Some(until) = this.spot.patience.filter(|t| Instant::now() < *t) else {
                            return Poll::Pending;
                        };
                        let sleep = this
                            .patience
                            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                        ready!(sleep.as_mut().poll(cx));
                        // Out of patience: placed again, on any replica with room.
                        continue;
                    };
                    let Some(r) = req.take() else {
                        return Poll::Pending;
                    };
                    *this.guard = Some(Guard::new(ticket));
                    *this.replica = i;
                    let fut = this.set.replica(i).oneshot(r);
                    this.state.set(State::Calling { fut });
                }
                StateProj::Calling { fut } => {
                    let res = ready!(fut.poll(cx));
                    let guard = this.guard.take();
                    return Poll::Ready(match res {
                        Ok(mut res) => {
                            if res.extensions().get::<Upstream>().is_none() {
                                let name = this.set.names[*this.replica].clone();
                                res.extensions_mut().insert(name);
                            }
                            Ok(res.map(|inner| ReplicaBody::new(inner, guard)))
                        }
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
