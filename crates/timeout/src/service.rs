//! [`SseIdleTimeout`]: the service.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Request, Response};
use http_body::Body;
use tailguard_core::{BoxError, EndReport, Fail, Respond};
use tokio::time::Instant;
use tower_service::Service;

use crate::body::SseIdleTimeoutBody;
use crate::future::ResponseFuture;
use crate::layer::{Config, SseIdleTimeoutLayer};

/// Applies first-token, idle, total and head timeouts to the responses of `S`.
///
/// Built by [`SseIdleTimeoutLayer`]; see the [crate documentation](crate). In response mode
/// (`M` = [`Respond`]) the error type is the inner service's; in error mode ([`Fail`]) it is
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

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug, M> fmt::Debug for SseIdleTimeout<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseIdleTimeout")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for SseIdleTimeout<S, Respond>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<SseIdleTimeoutBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, Respond>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        self.start(req)
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for SseIdleTimeout<S, Fail>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<SseIdleTimeoutBody<ResBody>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, Fail>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        self.start(req)
    }
}

impl<S, M> SseIdleTimeout<S, M> {
    /// Resolves the request's timers, tightens its [`Deadlines`] and calls the inner service.
    fn start<ReqBody>(&mut self, mut req: Request<ReqBody>) -> ResponseFuture<S::Future, M>
    where
        S: Service<Request<ReqBody>>,
    {
        let start = Instant::now();
        let timeouts = self.config.prepare(&mut req, start);
        let report = req.extensions().get::<EndReport>().cloned();
        let grpc = req
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let fut = self.inner.call(req);
        ResponseFuture::new(fut, self.config.clone(), timeouts, start, report, grpc)
    }
}
