//! The response body of a hedged request.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use http::{Response, response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tailguard_core::attempt::Attempt;
use tailguard_core::progress::StreamProgress;
use tailguard_core::{AnswerBody, EndReport, StreamTracker};

/// Carries the end reason an inner layer reported for the winning attempt (each raced attempt
/// gets an `EndReport` of its own, so that a loser's report cannot win) to the request's
/// outer `EndReport`.
#[derive(Debug)]
pub(crate) struct Forward {
    pub(crate) inner: EndReport,
    pub(crate) outer: EndReport,
}

impl Forward {
    pub(crate) fn apply(&self) {
        if let Some(reason) = self.inner.get() {
            self.outer.report(reason);
        }
    }
}

pin_project! {
    /// The response body `FirstTokenHedge` hands to the client.
    ///
    /// For a request that was not hedged it is the upstream body itself. For a raced request
    /// it first replays, frame by frame and byte for byte, the frames the winning attempt sent
    /// before its first token (they are the very `B::Data` values the upstream produced), then
    /// continues with the winner's live body, whose frames are passed on as they are (not
    /// scanned, not copied). The error the hedge renders when every attempt failed before its
    /// first token (a `502`) is a body of this type too, its one frame `B::Data::from` the
    /// rendered bytes.
    pub struct HedgeBody<B: Body> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B: Body> {
        // The upstream body untouched, or an answer the hedge rendered itself.
        Direct { #[pin] body: AnswerBody<B> },
        Raced {
            live: Pin<Box<Live<B>>>,
            forward: Option<Forward>,
            cut: Option<CutWatch>,
        },
    }
}

pin_project! {
    /// One attempt from its response head on: boxed once when the head arrives (the body is
    /// pinned in place, next to what the race read of it), and handed to the client as it is
    /// when the attempt is committed.
    #[project = LiveProj]
    pub(crate) struct Live<B: Body> {
        // The response head; taken when the response is built.
        head: Option<response::Parts>,
        // The first-token scan while the race reads the body; `None` for a response returned
        // as it is, and once committed.
        pub(crate) tracker: Option<StreamTracker>,
        // The frames read before the first token, to replay.
        pub(crate) replay: VecDeque<Frame<B::Data>>,
        pub(crate) replay_bytes: u64,
        error: Option<B::Error>,
        // The upstream body; `None` once it ended.
        #[pin]
        pub(crate) body: Option<B>,
    }
}

impl<B: Body> Live<B> {
    pub(crate) fn new(
        head: response::Parts,
        body: B,
        tracker: Option<StreamTracker>,
    ) -> Pin<Box<Self>> {
        Box::pin(Live {
            head: Some(head),
            tracker,
            replay: VecDeque::new(),
            replay_bytes: 0,
            error: None,
            body: Some(body),
        })
    }

    /// The response status.
    pub(crate) fn status(&self) -> http::StatusCode {
        self.head
            .as_ref()
            .map_or(http::StatusCode::OK, |h| h.status)
    }

    /// The response to hand to the client: the head, then a body that replays the frames read,
    /// yields `error` if any, then continues live.
    pub(crate) fn into_response(
        mut self: Pin<Box<Self>>,
        error: Option<B::Error>,
        forward: Option<Forward>,
    ) -> Response<HedgeBody<B>> {
        let this = self.as_mut().project();
        // The head is taken only here, and this consumes the box.
        let head = this
            .head
            .take()
            .unwrap_or_else(|| Response::new(()).into_parts().0);
        *this.tracker = None;
        if let Some(f) = &forward {
            f.apply();
        }
        *this.error = error;
        Response::from_parts(
            head,
            HedgeBody {
                inner: Inner::Raced {
                    live: self,
                    forward,
                    cut: None,
                },
            },
        )
    }
}

/// Tells the placer of the winning attempt, when the body goes, that its stream was cut short
/// (core's `Attempt::cut_short`), as the request's progress record, read by a layer outside,
/// says: the hedge no longer reads a stream it committed to.
#[derive(Debug)]
pub(crate) struct CutWatch {
    pub(crate) attempt: Attempt,
    pub(crate) progress: StreamProgress,
}

impl Drop for CutWatch {
    fn drop(&mut self) {
        if self.progress.cut_short() {
            self.attempt.cut_short();
        }
    }
}

impl<B: Body> HedgeBody<B> {
    /// Watches a raced body's end for a stream cut short (see [`CutWatch`]).
    pub(crate) fn watch(&mut self, watch: CutWatch) {
        if let Inner::Raced { cut, .. } = &mut self.inner {
            *cut = Some(watch);
        }
    }

    /// The upstream body, untouched.
    pub(crate) fn direct(body: B) -> Self {
        HedgeBody {
            inner: Inner::Direct {
                body: AnswerBody::inner(body),
            },
        }
    }

    /// A body the hedge rendered itself: `data`, then the end.
    pub(crate) fn local(data: Option<B::Data>) -> Self {
        HedgeBody {
            inner: Inner::Direct {
                body: AnswerBody::answer(data),
            },
        }
    }

    /// Whether this body answers a raced request: the winner's (its response was read before
    /// it was returned), or the error rendered when every attempt failed.
    pub fn is_raced(&self) -> bool {
        match &self.inner {
            Inner::Direct { body } => body.is_answer(),
            Inner::Raced { .. } => true,
        }
    }
}

impl<B: Body> Body for HedgeBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        match self.project().inner.project() {
            InnerProj::Direct { body } => body.poll_frame(cx),
            InnerProj::Raced { live, forward, .. } => {
                let LiveProj {
                    replay,
                    replay_bytes,
                    error,
                    mut body,
                    ..
                } = live.as_mut().project();
                if let Some(frame) = replay.pop_front() {
                    if let Some(d) = frame.data_ref() {
                        *replay_bytes = replay_bytes.saturating_sub(d.remaining() as u64);
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                if let Some(e) = error.take() {
                    body.set(None);
                    end(forward);
                    return Poll::Ready(Some(Err(e)));
                }
                let Some(inner) = body.as_mut().as_pin_mut() else {
                    end(forward);
                    return Poll::Ready(None);
                };
                let next = ready!(inner.poll_frame(cx));
                match &next {
                    Some(Ok(frame)) if !frame.is_trailers() => {}
                    None => {
                        body.set(None);
                        end(forward);
                    }
                    // Trailers or an error: the last frame.
                    Some(_) => end(forward),
                }
                Poll::Ready(next)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Direct { body } => body.is_end_stream(),
            Inner::Raced { live, .. } => {
                live.replay.is_empty()
                    && live.error.is_none()
                    && live.body.as_ref().is_none_or(|b| b.is_end_stream())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Direct { body } => body.size_hint(),
            Inner::Raced { live, .. } => {
                let replay_bytes = live.replay_bytes;
                let mut hint = live
                    .body
                    .as_ref()
                    .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint());
                let lower = hint.lower().saturating_add(replay_bytes);
                if let Some(upper) = hint.upper() {
                    hint.set_upper(upper.saturating_add(replay_bytes));
                }
                hint.set_lower(lower);
                hint
            }
        }
    }
}

/// The stream ends: an inner layer's report for the winner reaches the outer report before the
/// outer layer sees the end.
fn end(forward: &mut Option<Forward>) {
    if let Some(f) = forward.take() {
        f.apply();
    }
}

impl<B: Body> fmt::Debug for HedgeBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Direct { body } if body.is_answer() => f.write_str("HedgeBody::Local"),
            Inner::Direct { .. } => f.write_str("HedgeBody::Direct"),
            Inner::Raced { live, .. } => f
                .debug_struct("HedgeBody::Raced")
                .field("replay_frames", &live.replay.len())
                .field("replay_bytes", &live.replay_bytes)
                .field("error", &live.error.is_some())
                .field("live", &live.body.is_some())
                .finish(),
        }
    }
}
