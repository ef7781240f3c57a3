//! [`PriorityClass`]: the classifying service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use tower_service::Service;

use crate::layer::Classifier;

/// Classifies each request and inserts its [`Priority`](tailguard_core::Priority) and
/// [`ClassPolicy`](tailguard_core::ClassPolicy); built by
/// [`PriorityClassLayer`](crate::PriorityClassLayer).
///
/// Responses and errors pass through untouched; the future is the inner service's own.
#[derive(Clone)]
pub struct PriorityClass<S> {
    inner: S,
    cls: Arc<Classifier>,
}

impl<S: fmt::Debug> fmt::Debug for PriorityClass<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PriorityClass")
            .field("inner", &self.inner)
            .field("classifier", &self.cls)
            .finish()
    }
}

impl<S> PriorityClass<S> {
    pub(crate) fn from_classifier(inner: S, cls: Arc<Classifier>) -> Self {
        PriorityClass { inner, cls }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the service, returning the inner one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<Request<B>> for PriorityClass<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let c = self.cls.classify(&parts);
        self.cls.count(&c);
        parts.extensions.insert(c.priority);
        parts.extensions.insert(c.policy);
        self.inner.call(Request::from_parts(parts, body))
    }
}
