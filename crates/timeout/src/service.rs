//! [`SseIdleTimeout`]: the service.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tailguard_core::headers::is_grpc;
use tailguard_core::progress::StreamProgress;
use tailguard_core::{BoxError, EndReport, Mode, Respond};
use tokio::time::Instant;
use tower_service::Service;

use crate::body::SseIdleTimeoutBody;
use crate::future::ResponseFuture;
use crate::layer::{Config, SseIdleTimeoutLayer};

/// Applies first-token, idle, total and head timeouts to the responses of `S`.
///
/// Built by [`SseIdleTimeoutLayer`]; see the [crate documentation](crate). In response mode
/// (`M` = [`Respond`]) the error type is the inner service's; in error mode ([`Fail`](crate::Fail)) it is
/// [`BoxError`].
pub struct SseIdleTimeout<S, M = Respond> {
    inner: S,
    config: Arc<Config>,
    _mode: PhantomData<fn() -> M>,
}

impl<S: Clone, M> Clone for SseIdleTimeout<S, M> {
    fn clone(&self) -> Self {
        SseIdleTimeout {
            inner: self.inner.clone(),
            config: self.config.clone(),
            _mode: PhantomData,
        }
    }
}

impl<S, M> SseIdleTimeout<S, M> {
    /// Wraps `inner` with the configuration of `layer` (the same as `layer.layer(inner)`).
    pub fn new(inner: S, layer: &SseIdleTimeoutLayer<M>) -> Self {
        use tower_layer::Layer;
        layer.layer(inner)
    }

    pub(crate) fn from_config(inner: S, config: Arc<Config>) -> Self {
        SseIdleTimeout {
            inner,
            config,
            _mode: PhantomData,
        }
    }

    tailguard_core::inner_service_accessors!();
}

impl<S: fmt::Debug, M> fmt::Debug for SseIdleTimeout<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseIdleTimeout")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, ReqBody, ResBody, M> Service<Request<ReqBody>> for SseIdleTimeout<S, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
    ResBody::Error: Into<BoxError>,
    M: Mode<S::Error>,
{
    type Response = Response<SseIdleTimeoutBody<ResBody>>;
    type Error = M::Error;
    type Future = ResponseFuture<S::Future, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(M::inner)
    }

    // Resolves the request's timers, tightens its `Deadlines` and calls the inner service.
    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let start = Instant::now();
        let timeouts = self.config.prepare(&mut req, start);
        let report = req.extensions().get::<EndReport>().cloned();
        let progress = StreamProgress::of(req.extensions_mut());
        if self.config.require_terminal_event != Some(false) {
            // A terminal event must follow a finish reason (see `body::finished`).
            progress.want_finish();
        }
        let grpc = is_grpc(req.headers());
        let fut = self.inner.call(req);
        ResponseFuture::new(
            fut,
            self.config.clone(),
            timeouts,
            start,
            report,
            progress,
            grpc,
        )
    }
}
