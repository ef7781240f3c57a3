//! [`TokenBudget`]: the budget service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tailguard_core::Tenant;
use tower_service::Service;

use crate::body::BudgetBody;
use crate::future::{Ask, ResponseFuture};
use crate::layer::{Config, TokenBudgetLayer};
use crate::refusal::Answer;
use crate::store::Reply;

/// Token budgets in front of an inner service; built by [`TokenBudgetLayer`].
///
/// `poll_ready` only forwards the inner service's readiness; the reservation is asked of the
/// store in `call`, and a store that answers later is waited for in the [`ResponseFuture`]
/// (with the ready inner service, which is why `S: Clone`). Clones share the budgets.
pub struct TokenBudget<S> {
    inner: S,
    cfg: Arc<Config>,
}

impl<S: Clone> Clone for TokenBudget<S> {
    fn clone(&self) -> Self {
        TokenBudget {
            inner: self.inner.clone(),
            cfg: self.cfg.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for TokenBudget<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBudget")
            .field("inner", &self.inner)
            .field("store", &self.cfg.store)
            .finish()
    }
}

impl<S> TokenBudget<S> {
    /// Wraps `inner` with the budgets of `layer` (the same as `layer.layer(inner)`).
    pub fn new(inner: S, layer: &TokenBudgetLayer) -> Self {
        Self::from_config(inner, layer.cfg.clone())
    }

    pub(crate) fn from_config(inner: S, cfg: Arc<Config>) -> Self {
        TokenBudget { inner, cfg }
    }

    tailguard_core::inner_service_accessors!();
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for TokenBudget<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    ResB: Body,
    ResB::Data: From<Bytes>,
{
    type Response = Response<BudgetBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let cfg = &self.cfg;
        let Some(tenant) = req.extensions().get::<Tenant>() else {
            return ResponseFuture::passed(self.inner.call(req));
        };
        let limits = cfg.shared_limits(tenant.id());
        if limits.is_empty() {
            return ResponseFuture::passed(self.inner.call(req));
        }
        cfg.describe();
        let ask = Ask {
            store: cfg.store.clone(),
            tenant: tenant.clone(),
            limits,
            want: cfg.reservation(&req),
            answer: Answer::of(&req),
        };
        match cfg.store.reserve(&ask.tenant, &ask.limits, ask.want) {
            Reply::Ready(decision) => {
                ResponseFuture::decided(ask.decide(decision, &mut self.inner, req))
            }
            later => {
                // The ready service goes with the request; the clone is polled next time.
                let clone = self.inner.clone();
                let svc = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::reserving(later, svc, req, ask)
            }
        }
    }
}
