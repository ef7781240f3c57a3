//! [`SseIdleTimeout`]: the service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::CONTENT_TYPE;
use http::{Request, Response};
use http_body::Body;
use tailguard_core::{BoxError, EndReport};
use tokio::time::Instant;
use tower_service::Service;

use crate::body::SseIdleTimeoutBody;
use crate::future::ResponseFuture;
use crate::layer::{Config, SseIdleTimeoutLayer};

/// Applies first-token, idle, total and head timeouts to the responses of `S`.
///
/// Built by [`SseIdleTimeoutLayer`]; see the [crate documentation](crate).
#[derive(Clone)]
pub struct SseIdleTimeout<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> SseIdleTimeout<S> {
    /// Wraps `inner` with the configuration of `layer`.
    pub fn new(inner: S, layer: &SseIdleTimeoutLayer) -> Self {
        use tower_layer::Layer;
        layer.layer(inner)
    }

    pub(crate) fn from_config(inner: S, config: Arc<Config>) -> Self {
        SseIdleTimeout { inner, config }
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

impl<S: fmt::Debug> fmt::Debug for SseIdleTimeout<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseIdleTimeout")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for SseIdleTimeout<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: Body,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<SseIdleTimeoutBody<ResBody>>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
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
