//! Graceful shutdown of in-flight streams: a small tower layer of the gateway's own.
//!
//! When the shutdown grace period is over, every stream still running is ended the way
//! `SseIdleTimeout` ends one: at an event boundary, with a terminal in-band error event in the
//! stream's own dialect (core's [`render::in_band`]), after reporting
//! [`EndReason::Deadline`] to the recorder. The body keeps the inner body's data type.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker, ready};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use pin_project_lite::pin_project;
use tailguard::core::render::{self, ErrorInfo};
use tailguard::core::{BoxError, Dialect, EndReason, EndReport, StreamTracker};
use tokio::sync::watch;
use tower::{Layer, Service};

type Signal = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Wraps services in [`Drain`].
#[derive(Clone, Debug)]
pub struct DrainLayer {
    signal: watch::Receiver<bool>,
}

impl DrainLayer {
    /// Streams end when `signal` turns `true`.
    pub fn new(signal: watch::Receiver<bool>) -> Self {
        DrainLayer { signal }
    }
}

impl<S> Layer<S> for DrainLayer {
    type Service = Drain<S>;
    fn layer(&self, inner: S) -> Drain<S> {
        Drain {
            inner,
            signal: self.signal.clone(),
        }
    }
}

/// Ends in-flight streams with an in-band error event when the drain signal fires.
#[derive(Clone, Debug)]
pub struct Drain<S> {
    inner: S,
    signal: watch::Receiver<bool>,
}

impl<S, B, RB> Service<Request<B>> for Drain<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: Body + Send + 'static,
    RB::Data: From<Bytes>,
    RB::Error: Into<BoxError>,
{
    type Response = Response<DrainBody<RB>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let report = req.extensions().get::<EndReport>().cloned();
        let fut = self.inner.call(req);
        let mut rx = self.signal.clone();
        let state = self.signal.clone();
        Box::pin(async move {
            let res = fut.await.map_err(Into::into)?;
            let tracker = StreamTracker::new(&Dialect::Auto, res.headers());
            let signal: Signal = Box::pin(async move {
                if rx.wait_for(|drain| *drain).await.is_err() {
                    // The gateway is gone without a drain: never fire.
                    std::future::pending::<()>().await;
                }
            });
            Ok(res.map(|inner| DrainBody {
                inner,
                tracker,
                signal,
                state,
                registered: None,
                draining: false,
                saw_done: false,
                done: false,
                report,
            }))
        })
    }
}

pin_project! {
    /// The response body of [`Drain`]: the inner body, ended in-band on drain.
    pub struct DrainBody<B> {
        #[pin]
        inner: B,
        tracker: StreamTracker,
        signal: Signal,
        // Whether the drain channel changed since `signal` was last polled (an atomic load).
        state: watch::Receiver<bool>,
        // The waker `signal` was last polled with: polling it again with the same one would
        // only take the channel's lock again (the channel is shared by every stream).
        registered: Option<Waker>,
        draining: bool,
        saw_done: bool,
        done: bool,
        report: Option<EndReport>,
    }
}

impl<B> fmt::Debug for DrainBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DrainBody")
            .field("draining", &self.draining)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

fn shutdown_info() -> ErrorInfo {
    ErrorInfo::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the gateway is shutting down and ended this stream; retry the request",
        "server_shutdown",
        "shutdown",
    )
}

impl<B> Body for DrainBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        if !*this.draining {
            // The signal is polled again only when the channel changed or the waker did.
            let changed = this.state.has_changed().unwrap_or(false);
            let fresh = this
                .registered
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()));
            if changed || !fresh {
                if changed {
                    this.state.borrow_and_update();
                }
                *this.draining = this.signal.as_mut().poll(cx).is_ready();
                *this.registered = Some(cx.waker().clone());
            }
        }
        // Draining, and no event half sent: end here.
        if *this.draining && this.tracker.pending_bytes() == 0 {
            *this.done = true;
            if *this.saw_done {
                // The client already has the whole answer.
                return Poll::Ready(None);
            }
            if let Some(r) = this.report.as_ref() {
                r.report(EndReason::Deadline);
            }
            return match render::in_band(this.tracker.wire(), &shutdown_info()) {
                Some(bytes) => Poll::Ready(Some(Ok(Frame::data(bytes.into())))),
                None => Poll::Ready(Some(Err("the gateway is shutting down".into()))),
            };
        }
        match ready!(this.inner.poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(d) = frame.data_ref() {
                    *this.saw_done |= this.tracker.observe(d).done;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                *this.done = true;
                Poll::Ready(Some(Err(e.into())))
            }
            None => {
                *this.done = true;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || (!self.draining && self.inner.is_end_stream())
    }
}
