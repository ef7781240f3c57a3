//! The response future of [`LatencyPhaseRecorder`](crate::LatencyPhaseRecorder).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tracing::Span;

use crate::body::LatencyPhaseRecorderBody;
use crate::recording::{Observed, Recording};

pin_project! {
    /// Response future of [`LatencyPhaseRecorder`](crate::LatencyPhaseRecorder).
    ///
    /// Records the time to headers and wraps the body. If it fails, the request is reported
    /// with an upstream transport error (unless an inner layer reported a reason); if it is
    /// dropped before headers, as a client disconnect, after the inner future is dropped (so
    /// that what the inner layers report as they are dropped is in the report).
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Option<F>,
        span: Span,
        rec: Option<Box<Recording>>,
    }

    impl<F> PinnedDrop for ResponseFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if let Some(rec) = this.rec.take() {
                this.inner.set(None);
                rec.finish(Observed::Dropped, this.span);
            }
        }
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, span: Span, rec: Box<Recording>) -> Self {
        ResponseFuture {
            inner: Some(inner),
            span,
            rec: Some(rec),
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("pending", &self.rec.is_some())
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body,
{
    type Output = Result<Response<LatencyPhaseRecorderBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            panic!("ResponseFuture polled after completion");
        };
        let res = {
            let _enter = this.span.enter();
            ready!(inner.poll(cx))
        };
        this.inner.set(None);
        match res {
            Ok(mut res) => {
                let rec = this.rec.take().map(|mut rec| {
                    rec.on_headers(&mut res);
                    rec
                });
                let span = std::mem::replace(this.span, Span::none());
                let (parts, body) = res.into_parts();
                let body = LatencyPhaseRecorderBody::new(body, rec, span);
                Poll::Ready(Ok(Response::from_parts(parts, body)))
            }
            Err(e) => {
                if let Some(rec) = this.rec.take() {
                    rec.finish(Observed::ServiceError, this.span);
                }
                Poll::Ready(Err(e))
            }
        }
    }
}
