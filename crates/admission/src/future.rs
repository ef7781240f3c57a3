//! [`ResponseFuture`]: admission waits inside the response future.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use tailguard_core::progress::StreamProgress;
use tailguard_core::render::respond;
use tailguard_core::{
    AdmissionOutcome, EndReason, EndReport, Mode, OverloadReason, Overloaded, RenderError, Respond,
};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::body::AdmissionBody;
use crate::cluster::LeaseFuture;
use crate::fair::Served;
use crate::gate::{Grant, Permit, Queued, Rejection};
use crate::layer::Config;

pin_project! {
    /// The response future of [`BoundedAdmission`](crate::BoundedAdmission).
    ///
    /// A request that had to queue waits here (not in `poll_ready`) until it is admitted, refused
    /// or its deadline passes; dropping the future removes it from the queue at once. Generic over
    /// the inner service and the request body because a queued request is sent only once it is
    /// admitted.
    pub struct ResponseFuture<S, ReqB, M = Respond>
    where
        S: Service<Request<ReqB>>,
    {
        #[pin]
        state: State<S, ReqB>,
        // A refusal of a gRPC request is a trailers-only gRPC response.
        grpc: bool,
        // The request's progress record: the adaptive limit's first token.
        progress: StreamProgress,
        _mode: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    pub(crate) enum State<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        Called {
            #[pin]
            fut: S::Future,
            permit: Option<Permit>,
            // The queue wait to report in an `AdmissionOutcome` (`None`: reporting is off).
            wait: Option<Duration>,
        },
        Waiting {
            wait: Pin<Box<Wait<S, ReqB>>>,
        },
        Leasing {
            step: Box<LeaseStep<S, ReqB>>,
        },
        Refused {
            refusal: Option<Refusal>,
        },
    }
}

pin_project! {
    /// A queued request: its queue entry, its deadline, the ready service and the request to
    /// send it (boxed once, pinned in place, so the deadline timer needs no box of its own).
    pub(crate) struct Wait<S, ReqB> {
        // Declared first so the queue entry is removed before anything else is dropped.
        queued: Queued,
        #[pin]
        sleep: Option<Sleep>,
        expired: bool,
        svc: Option<S>,
        req: Option<Request<ReqB>>,
        units: u32,
        full_status: StatusCode,
        outcome: bool,
    }
}

/// A locally admitted request taking its cluster lease (cluster mode).
pub(crate) struct LeaseStep<S, ReqB> {
    lease: LeaseFuture,
    permit: Option<Permit>,
    svc: Option<S>,
    req: Option<Request<ReqB>>,
    /// The local queue wait so far; the lease wait is added to it.
    waited: Duration,
    started: Instant,
    full_status: StatusCode,
    outcome: bool,
}

/// A refusal on its way to the caller.
#[derive(Debug)]
pub(crate) struct Refusal {
    overloaded: Overloaded,
    outcome: AdmissionOutcome,
}

impl Refusal {
    pub(crate) fn new(cfg_full_status: StatusCode, r: Rejection, waited: Duration) -> Self {
        let status = match r.reason {
            OverloadReason::QueueTimeout
            | OverloadReason::DeadlineTooShort
            | OverloadReason::ClusterUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => cfg_full_status,
        };
        Refusal {
            overloaded: Overloaded::new(r.reason, status)
                .with_retry_after(r.retry_after)
                .with_queue_wait(waited),
            outcome: AdmissionOutcome::rejected(waited, r.units, r.reason),
        }
    }
}

/// The response-mode answer to a refusal: the rendered error (trailers-only for a gRPC
/// request), carrying the outcome.
fn refused<B>(
    overloaded: &Overloaded,
    outcome: AdmissionOutcome,
    grpc: bool,
) -> Response<AdmissionBody<B>>
where
    B: Body,
    B::Data: From<Bytes>,
{
    let mut res = respond(&overloaded.error_info(), grpc, |b| {
        AdmissionBody::local(B::Data::from(b.unwrap_or_default()))
    });
    res.extensions_mut().insert(outcome);
    res
}

impl<S, ReqB> State<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    pub(crate) fn called(fut: S::Future, permit: Permit, wait: Option<Duration>) -> Self {
        State::Called {
            fut,
            permit: Some(permit),
            wait,
        }
    }

    pub(crate) fn waiting(
        queued: Queued,
        svc: S,
        req: Request<ReqB>,
        units: u32,
        cfg: &Config,
    ) -> Self {
        State::Waiting {
            wait: Box::pin(Wait {
                queued,
                sleep: None,
                expired: false,
                svc: Some(svc),
                req: Some(req),
                units,
                full_status: cfg.full_status,
                outcome: cfg.outcome,
            }),
        }
    }

    /// A locally admitted request: takes its cluster lease first in cluster mode, else is
    /// called at once. `waited` is its local queue wait, `deadline` its queue deadline.
    pub(crate) fn admitted(
        mut svc: S,
        req: Request<ReqB>,
        permit: Permit,
        waited: Duration,
        deadline: Instant,
        (full_status, outcome): (StatusCode, bool),
    ) -> Self {
        match permit.cluster_lease(deadline) {
            None => State::called(svc.call(req), permit, outcome.then_some(waited)),
            Some(lease) => State::Leasing {
                step: Box::new(LeaseStep {
                    lease,
                    permit: Some(permit),
                    svc: Some(svc),
                    req: Some(req),
                    waited,
                    started: Instant::now(),
                    full_status,
                    outcome,
                }),
            },
        }
    }

    pub(crate) fn refused(refusal: Refusal) -> Self {
        State::Refused {
            refusal: Some(refusal),
        }
    }
}

impl<S, ReqB> Wait<S, ReqB> {
    /// Waits for the gate's decision or the deadline, whichever comes first.
    fn poll_outcome(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Grant> {
        let mut this = self.project();
        loop {
            if let Poll::Ready(r) = Pin::new(&mut this.queued.rx).poll(cx) {
                this.queued.guard.disarm();
                // The gate is gone: there is no current limit to cap the units at.
                return Poll::Ready(r.unwrap_or(Err(Rejection {
                    reason: OverloadReason::QueueTimeout,
                    retry_after: Duration::from_secs(1),
                    units: *this.units,
                })));
            }
            if *this.expired {
                // The gate decided while the deadline fired; its message is on the way.
                return Poll::Pending;
            }
            if this.sleep.is_none() {
                // Armed lazily, on the first poll, inside the runtime.
                this.sleep
                    .set(Some(tokio::time::sleep_until(this.queued.deadline)));
            }
            if let Some(sleep) = this.sleep.as_mut().as_pin_mut() {
                ready!(sleep.poll(cx));
            }
            *this.expired = true;
            if let Some(r) = this.queued.guard.expire() {
                return Poll::Ready(Err(r));
            }
        }
    }
}

/// What the shared state machine ends with.
type Polled<B, E> = Result<Response<AdmissionBody<B>>, Failure<E>>;

/// Why the state machine stopped without a response of the inner service.
pub(crate) enum Failure<E> {
    Inner(E),
    Refused(Refusal),
}

fn poll_state<S, ReqB, ResB>(
    mut state: Pin<&mut State<S, ReqB>>,
    progress: &StreamProgress,
    cx: &mut Context<'_>,
) -> Poll<Polled<ResB, S::Error>>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body,
{
    loop {
        match state.as_mut().project() {
            StateProj::Called { fut, permit, wait } => {
                return Poll::Ready(match ready!(fut.poll(cx)) {
                    Ok(mut res) => {
                        let mut permit = permit.take();
                        if let (Some(w), Some(p)) = (wait.take(), permit.as_ref()) {
                            res.extensions_mut()
                                .insert(AdmissionOutcome::admitted(w, p.units()));
                        }
                        if res.body().is_end_stream() {
                            // No body to wait for (no output): release at once.
                            if let Some(p) = permit.as_mut() {
                                p.served(Served::Output(0));
                            }
                            permit = None;
                        }
                        Ok(AdmissionBody::response(res, permit, progress))
                    }
                    Err(e) => {
                        if let Some(mut p) = permit.take() {
                            p.served(Served::Output(0));
                        }
                        Err(Failure::Inner(e))
                    }
                });
            }
            StateProj::Refused { refusal } => {
                let refusal = refusal
                    .take()
                    .expect("ResponseFuture polled after completion");
                return Poll::Ready(Err(Failure::Refused(refusal)));
            }
            StateProj::Waiting { .. } => ready!(poll_waiting(state.as_mut(), cx)),
            StateProj::Leasing { step } => {
                let next = ready!(poll_leasing(step, cx));
                state.set(next);
            }
        }
    }
}

/// A queued request: waits for the gate's decision, then moves `state` on to `Called` or
/// `Refused`.
fn poll_waiting<S, ReqB>(mut state: Pin<&mut State<S, ReqB>>, cx: &mut Context<'_>) -> Poll<()>
where
    S: Service<Request<ReqB>>,
{
    let StateProj::Waiting { wait } = state.as_mut().project() else {
        return Poll::Ready(());
    };
    let grant = ready!(wait.as_mut().poll_outcome(cx));
    let w = wait.as_mut().project();
    let req = w.req.take().expect("request present while waiting");
    let next = match grant {
        Ok((permit, waited)) => {
            let svc = w.svc.take().expect("service present while waiting");
            let flavour = (*w.full_status, *w.outcome);
            State::admitted(svc, req, permit, waited, w.queued.deadline, flavour)
        }
        Err(r) => {
            let waited = Instant::now().saturating_duration_since(w.queued.enqueued);
            EndReport::report_to(req.extensions(), EndReason::Rejected);
            State::refused(Refusal::new(*w.full_status, r, waited))
        }
    };
    state.set(next);
    Poll::Ready(())
}

/// A locally admitted request waiting for its cluster lease: the next state once decided.
fn poll_leasing<S, ReqB>(
    step: &mut LeaseStep<S, ReqB>,
    cx: &mut Context<'_>,
) -> Poll<State<S, ReqB>>
where
    S: Service<Request<ReqB>>,
{
    let outcome = ready!(step.lease.as_mut().poll(cx));
    let (Some(mut permit), Some(mut svc), Some(req)) =
        (step.permit.take(), step.svc.take(), step.req.take())
    else {
        panic!("ResponseFuture polled after completion");
    };
    let waited = step.waited + Instant::now().saturating_duration_since(step.started);
    Poll::Ready(match outcome {
        Ok(lease) => State::called(
            svc.call(req),
            permit.with_lease(lease),
            step.outcome.then_some(waited),
        ),
        Err(reason) => {
            let r = permit.refusal(reason);
            // Never sent: its tenant is charged nothing.
            permit.served(Served::Nothing);
            drop(permit);
            EndReport::report_to(req.extensions(), EndReason::Rejected);
            State::refused(Refusal::new(step.full_status, r, waited))
        }
    })
}

impl<S, ReqB, ResB, M> Future for ResponseFuture<S, ReqB, M>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body,
    ResB::Data: From<Bytes>,
    M: Mode<S::Error>,
{
    type Output = Result<Response<AdmissionBody<ResB>>, M::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let grpc = *this.grpc;
        Poll::Ready(match ready!(poll_state(this.state, this.progress, cx)) {
            Ok(res) => Ok(res),
            Err(Failure::Inner(e)) => Err(M::inner(e)),
            Err(Failure::Refused(Refusal {
                overloaded,
                outcome,
            })) => M::own(overloaded, |o| refused(&o, outcome, grpc)),
        })
    }
}

impl<S, ReqB, M> ResponseFuture<S, ReqB, M>
where
    S: Service<Request<ReqB>>,
{
    pub(crate) fn new(state: State<S, ReqB>, grpc: bool, progress: StreamProgress) -> Self {
        ResponseFuture {
            state,
            grpc,
            progress,
            _mode: PhantomData,
        }
    }
}

impl<S, ReqB, M> fmt::Debug for ResponseFuture<S, ReqB, M>
where
    S: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Called { .. } => "called",
            State::Waiting { .. } => "waiting",
            State::Leasing { .. } => "leasing",
            State::Refused { .. } => "refused",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
