//! [`PriorityClass`]: the classifying service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::future::ResponseFuture;
use crate::layer::{Classifier, PriorityClassLayer};

/// Classifies each request and inserts its [`Priority`](tailguard_core::Priority) and
/// [`ClassPolicy`](tailguard_core::ClassPolicy); built by
/// [`PriorityClassLayer`](crate::PriorityClassLayer).
///
/// Errors pass through untouched; a response gets the request's `Priority` copied into its
/// extensions (see [`ResponseFuture`](crate::future::ResponseFuture)).
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
    /// Wraps `inner` with the configuration of `layer` (the same as `layer.layer(inner)`).
    pub fn new(inner: S, layer: &PriorityClassLayer) -> Self {
        use tower_layer::Layer;
        layer.layer(inner)
    }

    pub(crate) fn from_classifier(inner: S, cls: Arc<Classifier>) -> Self {
        // Help text for exporters that print it (Prometheus `# HELP`).
        metrics::describe_counter!(
            "tailguard_priority_classified_total",
            metrics::Unit::Count,
            "Requests classified, by priority class and by what decided it"
        );
        PriorityClass { inner, cls }
    }

    tailguard_core::inner_service_accessors!();
}

impl<S, B, ResB> Service<Request<B>> for PriorityClass<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let c = self.cls.classify(&parts);
        metrics::counter!(
            "tailguard_priority_classified_total",
            "priority" => c.priority.name().to_owned(),
            "source" => c.source.as_str()
        )
        .increment(1);
        parts.extensions.insert(c.priority.clone());
        parts.extensions.insert(c.policy);
        ResponseFuture::new(
            self.inner.call(Request::from_parts(parts, body)),
            c.priority,
        )
    }
}
