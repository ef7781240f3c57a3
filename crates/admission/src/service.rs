//! [`BoundedAdmission`]: the admission service.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tailguard_core::headers::is_grpc;
use tailguard_core::progress::StreamProgress;
use tailguard_core::{ClassPolicy, Deadlines, EndReason, EndReport, Mode, Priority, Respond};
use tokio::time::Instant;
use tower_service::Service;

use crate::body::AdmissionBody;
use crate::future::{Refusal, ResponseFuture, State};
use crate::gate::{Acquire, Shared};
use crate::layer::AdmissionHandle;

/// Admission control in front of an inner service; built by
/// [`BoundedAdmissionLayer`](crate::BoundedAdmissionLayer).
///
/// `poll_ready` only forwards the inner service's readiness; the admission decision is made in
/// `call`, and a queued request waits inside the [`ResponseFuture`]. Clones share the gate.
pub struct BoundedAdmission<S, M = Respond> {
    inner: S,
    shared: Arc<Shared>,
    _mode: PhantomData<fn() -> M>,
}

impl<S: Clone, M> Clone for BoundedAdmission<S, M> {
    fn clone(&self) -> Self {
        BoundedAdmission {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            _mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, M> fmt::Debug for BoundedAdmission<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundedAdmission")
            .field("inner", &self.inner)
            .field("gate", &self.shared)
            .finish()
    }
}

impl<S, M> BoundedAdmission<S, M> {
    /// Wraps `inner` with the configuration of `layer`, sharing its gate (the same as
    /// `layer.layer(inner)`).
    pub fn new(inner: S, layer: &crate::BoundedAdmissionLayer<M>) -> Self {
        use tower_layer::Layer;
        layer.layer(inner)
    }

    pub(crate) fn from_shared(inner: S, shared: Arc<Shared>) -> Self {
        BoundedAdmission {
            inner,
            shared,
            _mode: PhantomData,
        }
    }

    /// A handle to observe the gate.
    pub fn handle(&self) -> AdmissionHandle {
        AdmissionHandle {
            shared: self.shared.clone(),
        }
    }

    tailguard_core::inner_service_accessors!();

    /// Weighs the request, asks the gate, and starts the response future in the state the
    /// gate decided: called, waiting in the queue, or refused.
    fn start<ReqB>(&mut self, mut req: Request<ReqB>) -> State<S, ReqB>
    where
        S: Service<Request<ReqB>> + Clone,
    {
        let cfg = self.shared.config();
        let now = Instant::now();
        cfg.client_deadline.accept(&mut req, now);
        let (parts, body) = req.into_parts();
        let units = self.shared.units_for(cfg.cost.units(&parts));
        let demand = cfg.tenant_fairness.then(|| cfg.fairness.demand(&parts));
        let req = Request::from_parts(parts, body);
        let ext = req.extensions();
        let left = ext.get::<Deadlines>().and_then(|d| d.total_left(now));
        let acquired = self.shared.acquire(
            ext.get::<Priority>(),
            ext.get::<ClassPolicy>().and_then(|p| p.reserved_share),
            units,
            left,
            demand,
        );
        match acquired {
            Acquire::Admitted(permit) if cfg.cluster.is_none() => State::called(
                self.inner.call(req),
                permit,
                cfg.outcome.then_some(Duration::ZERO),
            ),
            Acquire::Admitted(permit) => {
                // Cluster mode: the ready service goes with the request to the lease step.
                let clone = self.inner.clone();
                let svc = std::mem::replace(&mut self.inner, clone);
                let deadline = now + left.map_or(cfg.queue_timeout, |l| l.min(cfg.queue_timeout));
                let flavour = (cfg.full_status, cfg.outcome);
                State::admitted(svc, req, permit, Duration::ZERO, deadline, flavour)
            }
            Acquire::Rejected(r) => {
                EndReport::report_to(req.extensions(), EndReason::Rejected);
                State::refused(Refusal::new(cfg.full_status, r, Duration::ZERO))
            }
            Acquire::Queued(q) => {
                // The ready service goes with the request; the clone is polled next time.
                let clone = self.inner.clone();
                let svc = std::mem::replace(&mut self.inner, clone);
                State::waiting(q, svc, req, units, cfg)
            }
        }
    }
}

impl<S, ReqB, ResB, M> Service<Request<ReqB>> for BoundedAdmission<S, M>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: Body,
    ResB::Data: From<Bytes>,
    M: Mode<S::Error>,
{
    type Response = Response<AdmissionBody<ResB>>;
    type Error = M::Error;
    type Future = ResponseFuture<S, ReqB, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(M::inner)
    }

    fn call(&mut self, mut req: Request<ReqB>) -> Self::Future {
        let grpc = is_grpc(req.headers());
        let progress = StreamProgress::of(req.extensions_mut());
        ResponseFuture::new(self.start(req), grpc, progress)
    }
}
