//! [`ResponseFuture`]: waits for the store's decision, then for the inner service's head.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tailguard_core::headers::grpc_status;
use tailguard_core::progress::StreamProgress;
use tailguard_core::{Dialect, EndReason, EndReport, ErrorInfo, Tenant};
use tower_service::Service;

use crate::body::BudgetBody;
use crate::limit::{Limit, Tokens};
use crate::metrics;
use crate::refusal::{self, Answer};
use crate::reservation::{Meter, Reservation};
use crate::store::{Decision, Reply, Store};

/// A budgeted request on its way to the store.
pub(crate) struct Ask {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) tenant: Tenant,
    pub(crate) limits: Arc<[Limit]>,
    pub(crate) want: Tokens,
    pub(crate) answer: Answer,
}

impl Ask {
    /// Acts on the store's `decision`: calls `svc` holding the reservation, or refuses.
    pub(crate) fn decide<S, ReqB>(
        self,
        decision: Decision,
        svc: &mut S,
        mut req: Request<ReqB>,
    ) -> State<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        match decision {
            Decision::Reserved(ticket) => {
                // The stream is read once, by the innermost layer that reads it; usage and
                // exact output counts are asked of it.
                let progress = StreamProgress::of(req.extensions_mut());
                progress.want_usage();
                let r = Reservation::new(self.store, self.tenant, self.limits, ticket, self.want);
                State::Called {
                    fut: svc.call(req),
                    reservation: Some(r),
                    progress,
                }
            }
            Decision::Refused(short) => {
                metrics::refused(&self.tenant, &short.limit);
                EndReport::report_to(req.extensions(), EndReason::Rejected);
                State::Refused {
                    answer: self.answer,
                    info: Some(refusal::error_info(&short)),
                }
            }
            Decision::Unavailable(retry_after) => {
                EndReport::report_to(req.extensions(), EndReason::Rejected);
                State::Refused {
                    answer: self.answer,
                    info: Some(refusal::unavailable(retry_after)),
                }
            }
        }
    }
}

pin_project! {
    /// The response future of [`TokenBudget`](crate::TokenBudget).
    ///
    /// Waits for a store that answers later, then for the inner service's response head.
    /// Dropped before the head, it gives the reservation back whole. Generic over the inner
    /// service and the request body because, while the store decides, it holds the request.
    pub struct ResponseFuture<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        #[pin]
        state: State<S, ReqB>,
    }
}

pin_project! {
    #[project = StateProj]
    pub(crate) enum State<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        // No budget applies: the inner future, untouched.
        Passed {
            #[pin]
            fut: S::Future,
        },
        // The store decides later.
        Reserving {
            reply: Reply,
            held: Option<Box<Held<S, ReqB>>>,
        },
        Called {
            #[pin]
            fut: S::Future,
            reservation: Option<Reservation>,
            progress: StreamProgress,
        },
        Refused {
            answer: Answer,
            info: Option<ErrorInfo>,
        },
    }
}

/// A request waiting for a store that answers later, with the ready service to send it.
pub(crate) struct Held<S, ReqB> {
    svc: S,
    req: Request<ReqB>,
    ask: Ask,
}

impl<S, ReqB> ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    pub(crate) fn passed(fut: S::Future) -> Self {
        ResponseFuture {
            state: State::Passed { fut },
        }
    }

    pub(crate) fn decided(state: State<S, ReqB>) -> Self {
        ResponseFuture { state }
    }

    pub(crate) fn reserving(reply: Reply, svc: S, req: Request<ReqB>, ask: Ask) -> Self {
        ResponseFuture {
            state: State::Reserving {
                reply,
                held: Some(Box::new(Held { svc, req, ask })),
            },
        }
    }
}

/// Wraps an admitted `2xx` response's body in a [`Meter`] that settles `reservation` when it
/// ends; anything else — an error status, a trailers-only gRPC error — gives the reservation
/// back whole at once (see the crate docs).
fn metered<B>(
    res: Response<B>,
    reservation: Reservation,
    progress: &StreamProgress,
) -> Response<BudgetBody<B>>
where
    B: Body,
{
    let grpc_error = grpc_status(res.headers()).is_some_and(|code| code != 0);
    if !res.status().is_success() || grpc_error {
        drop(reservation);
        return res.map(BudgetBody::passed);
    }
    let headers = res.headers();
    let reading = Dialect::Auto
        .resolve_stream(headers)
        .map(|dialect| progress.reading(&dialect, headers));
    let empty = res.body().is_end_stream();
    let meter = Meter::new(reservation, reading, empty, res.body().size_hint().lower());
    if empty {
        meter.finish();
        return res.map(BudgetBody::passed);
    }
    res.map(|body| BudgetBody::metered(body, meter))
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body,
    ResB::Data: From<Bytes>,
{
    type Output = Result<Response<BudgetBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Passed { fut } => {
                    return Poll::Ready(ready!(fut.poll(cx)).map(|r| r.map(BudgetBody::passed)));
                }
                StateProj::Reserving { reply, held } => {
                    let decision = ready!(Pin::new(reply).poll(cx));
                    let Held { mut svc, req, ask } =
                        *held.take().expect("ResponseFuture polled after completion");
                    state.set(ask.decide(decision, &mut svc, req));
                }
                StateProj::Called {
                    fut,
                    reservation,
                    progress,
                } => {
                    let res = ready!(fut.poll(cx));
                    let r = reservation
                        .take()
                        .expect("ResponseFuture polled after completion");
                    // An inner error gives the reservation back whole (`r` is dropped).
                    return Poll::Ready(res.map(|res| metered(res, r, progress)));
                }
                StateProj::Refused { answer, info } => {
                    let info = info.take().expect("ResponseFuture polled after completion");
                    let res = refusal::response(*answer, &info, |json| {
                        BudgetBody::local(ResB::Data::from(json.unwrap_or_default()))
                    });
                    return Poll::Ready(Ok(res));
                }
            }
        }
    }
}

impl<S, ReqB> fmt::Debug for ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Passed { .. } => "passed",
            State::Reserving { .. } => "reserving",
            State::Called { .. } => "called",
            State::Refused { .. } => "refused",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
