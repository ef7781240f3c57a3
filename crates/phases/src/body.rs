//! The response body of [`LatencyPhaseRecorder`](crate::LatencyPhaseRecorder).

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tracing::Span;

use crate::recording::{Observed, Recording};

pin_project! {
    /// Response body of [`LatencyPhaseRecorder`](crate::LatencyPhaseRecorder): passes every
    /// frame through untouched (`B::Data` included) and records the stream's phases.
    ///
    /// The report is finalised exactly once: when the inner body ends (`None`, trailers, or
    /// `is_end_stream()` turning true after a frame), when it yields an error, or when this body
    /// is dropped before any of those: a client disconnect, or `completed` if the frame with the
    /// stream's terminal event (`[DONE]`, `message_stop`) was already handed on. Per data frame
    /// it takes what the stream's reading saw (core's [`progress`](tailguard_core::progress)):
    /// its own scan, or the record of a layer inside that reads the stream.
    pub struct LatencyPhaseRecorderBody<B> {
        #[pin]
        inner: B,
        rec: Option<Box<Recording>>,
        span: Span,
    }

    impl<B> PinnedDrop for LatencyPhaseRecorderBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(rec) = this.rec.take() {
                rec.finish(Observed::Dropped, this.span);
            }
        }
    }
}

impl<B: Body> LatencyPhaseRecorderBody<B> {
    pub(crate) fn new(inner: B, rec: Option<Box<Recording>>, span: Span) -> Self {
        let mut body = LatencyPhaseRecorderBody { inner, rec, span };
        if body.inner.is_end_stream() {
            // An empty body may never be polled: it ends here.
            if let Some(rec) = body.rec.take() {
                rec.finish(Observed::End, &body.span);
            }
        }
        body
    }
}

impl<B> LatencyPhaseRecorderBody<B> {
    /// The inner body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B: std::fmt::Debug> std::fmt::Debug for LatencyPhaseRecorderBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyPhaseRecorderBody")
            .field("inner", &self.inner)
            .field("recording", &self.rec.is_some())
            .finish()
    }
}

impl<B: Body> Body for LatencyPhaseRecorderBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let polled = this.inner.as_mut().poll_frame(cx);
        let Poll::Ready(res) = &polled else {
            return Poll::Pending;
        };
        if let Some(rec) = this.rec.as_mut() {
            let end = match res {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        rec.on_data(data);
                        this.inner.is_end_stream().then_some(Observed::End)
                    } else if let Some(trailers) = frame.trailers_ref() {
                        rec.on_trailers(trailers);
                        Some(Observed::End)
                    } else {
                        this.inner.is_end_stream().then_some(Observed::End)
                    }
                }
                Some(Err(_)) => Some(Observed::BodyError),
                None => Some(Observed::End),
            };
            if let Some(end) = end
                && let Some(rec) = this.rec.take()
            {
                rec.finish(end, this.span);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
