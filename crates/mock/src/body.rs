//! The response body of the mock: frames from a producer task, and a guard that notices when
//! the client goes away.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::stats::{InFlight, Outcome, RequestGuard};

/// What the producer hands the body.
#[derive(Debug)]
pub(crate) enum Item {
    /// One data frame (one event).
    Data(Bytes),
    /// The last data frame, ending the body with this outcome (so that the end is recorded
    /// when the last bytes are handed over, even if the client stops reading right there).
    Last(Bytes, Outcome),
    /// Trailers (gRPC), ending the body with this outcome.
    Trailers(HeaderMap, Outcome),
    /// The end of the body with this outcome.
    End(Outcome),
    /// Break the connection (body error) with this outcome, once the bytes before are
    /// flushed.
    Break(Outcome),
}

/// The error a mock body fails with to break the connection on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MockReset;

impl fmt::Display for MockReset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("mock upstream reset the stream")
    }
}

impl std::error::Error for MockReset {}

enum Source {
    /// One buffered body (non-streamed responses, errors).
    Full(Option<Bytes>, Outcome),
    /// Frames from a producer task.
    Stream(mpsc::Receiver<Item>, AbortHandle),
    Done,
}

/// The mock's response body.
///
/// Dropping it before its end (hyper does so when the client resets the stream or closes the
/// connection) records the request as [`Outcome::Cancelled`] and stops its producer task,
/// which releases the single slot if it held it; with
/// [`ReplicaOptions::prefill_cancelled`](crate::ReplicaOptions::prefill_cancelled) the producer
/// runs on to its first token instead, and the request stays in flight until then.
pub struct MockBody {
    source: Source,
    guard: RequestGuard,
    /// Set before a break: the connection then closes with a TCP RST.
    rst: Option<Arc<AtomicBool>>,
    /// Where the in-flight count goes when the body is dropped early (prefill of a cancelled
    /// request).
    late: Option<oneshot::Sender<InFlight>>,
    /// A break waiting for the bytes before it to be flushed.
    breaking: Option<Outcome>,
}

impl fmt::Debug for MockBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockBody")
            .field("request", &self.guard.index())
            .finish_non_exhaustive()
    }
}

impl MockBody {
    pub(crate) fn full(bytes: Bytes, outcome: Outcome, guard: RequestGuard) -> Self {
        MockBody {
            source: Source::Full((!bytes.is_empty()).then_some(bytes), outcome),
            guard,
            rst: None,
            late: None,
            breaking: None,
        }
    }

    /// Frames from a producer task. `rst`: the connection's abort flag, set before a break;
    /// `late`: hand the in-flight count to the producer when dropped early instead of
    /// aborting it.
    pub(crate) fn stream(
        rx: mpsc::Receiver<Item>,
        task: AbortHandle,
        guard: RequestGuard,
        rst: Option<Arc<AtomicBool>>,
        late: Option<oneshot::Sender<InFlight>>,
    ) -> Self {
        MockBody {
            source: Source::Stream(rx, task),
            guard,
            rst,
            late,
            breaking: None,
        }
    }

    pub(crate) fn headers_sent(&self) {
        self.guard.headers_sent();
    }

    fn end(&mut self, outcome: Outcome) {
        self.guard.finish(outcome);
        self.source = Source::Done;
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = MockReset;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, MockReset>>> {
        let this = self.get_mut();
        if let Some(outcome) = this.breaking.take() {
            if let Some(flag) = &this.rst {
                flag.store(true, Ordering::Relaxed);
            }
            this.end(outcome);
            return Poll::Ready(Some(Err(MockReset)));
        }
        match &mut this.source {
            Source::Done => Poll::Ready(None),
            Source::Full(bytes, outcome) => {
                // The whole body is handed over in one frame: that is its end.
                let outcome = *outcome;
                let bytes = bytes.take();
                this.end(outcome);
                Poll::Ready(bytes.map(|b| Ok(Frame::data(b))))
            }
            Source::Stream(rx, _) => match rx.poll_recv(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Item::Data(b))) => Poll::Ready(Some(Ok(Frame::data(b)))),
                Poll::Ready(Some(Item::Last(b, outcome))) => {
                    this.end(outcome);
                    Poll::Ready(Some(Ok(Frame::data(b))))
                }
                Poll::Ready(Some(Item::Trailers(t, outcome))) => {
                    // Trailers are the last frame: hyper does not poll again after them.
                    this.end(outcome);
                    Poll::Ready(Some(Ok(Frame::trailers(t))))
                }
                Poll::Ready(Some(Item::End(outcome))) => {
                    this.end(outcome);
                    Poll::Ready(None)
                }
                Poll::Ready(Some(Item::Break(outcome))) => {
                    // Pending once, so the connection flushes what came before; then fail.
                    this.breaking = Some(outcome);
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                // The producer stopped without an end: it only does so when it was aborted,
                // which happens on drop; treat as a reset to be safe.
                Poll::Ready(None) => {
                    this.end(Outcome::ResetAfterTokens(0));
                    Poll::Ready(Some(Err(MockReset)))
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.source, Source::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Full(Some(b), _) => SizeHint::with_exact(b.len() as u64),
            Source::Full(None, _) | Source::Done => SizeHint::with_exact(0),
            Source::Stream(..) => SizeHint::default(),
        }
    }
}

impl Drop for MockBody {
    fn drop(&mut self) {
        if let Source::Stream(_, task) = &self.source {
            match self.late.take() {
                Some(late) => {
                    // The replica notices the client is gone only at its first token.
                    let in_flight = self.guard.take_in_flight();
                    self.guard.finish(Outcome::Cancelled);
                    if let Some(n) = in_flight {
                        let _ = late.send(n);
                    }
                }
                None => task.abort(),
            }
        }
        // The guard records `Cancelled` unless the body already ended.
    }
}
