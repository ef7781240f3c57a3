//! The response body of a hedged request.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tailguard_core::EndReport;

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
    /// continues with the winner's live body. After the replay each frame costs one branch and
    /// one poll of the inner body: no scanning, no allocation.
    pub struct HedgeBody<B: Body> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B: Body> {
        Direct { #[pin] body: B },
        Raced {
            replay: VecDeque<Frame<B::Data>>,
            replay_bytes: u64,
            error: Option<B::Error>,
            body: Option<Pin<Box<B>>>,
            forward: Option<Forward>,
        },
    }
}

impl<B: Body> HedgeBody<B> {
    /// The upstream body, untouched.
    pub(crate) fn direct(body: B) -> Self {
        HedgeBody {
            inner: Inner::Direct { body },
        }
    }

    /// Replays `replay`, then yields `error` if any, then continues with `body` if any.
    pub(crate) fn raced(
        replay: VecDeque<Frame<B::Data>>,
        replay_bytes: u64,
        error: Option<B::Error>,
        body: Option<Pin<Box<B>>>,
        forward: Option<Forward>,
    ) -> Self {
        if let Some(f) = &forward {
            f.apply();
        }
        HedgeBody {
            inner: Inner::Raced {
                replay,
                replay_bytes,
                error,
                body,
                forward,
            },
        }
    }

    /// Whether this body went through a race (its response was read before it was returned).
    pub fn is_raced(&self) -> bool {
        matches!(self.inner, Inner::Raced { .. })
    }
}

impl<B: Body> Body for HedgeBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        match self.project().inner.project() {
            InnerProj::Direct { body } => body.poll_frame(cx),
            InnerProj::Raced {
                replay,
                replay_bytes,
                error,
                body,
                forward,
            } => {
                if let Some(frame) = replay.pop_front() {
                    if let Some(d) = frame.data_ref() {
                        *replay_bytes = replay_bytes.saturating_sub(d.remaining() as u64);
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                if let Some(e) = error.take() {
                    *body = None;
                    end(forward);
                    return Poll::Ready(Some(Err(e)));
                }
                let Some(inner) = body.as_mut() else {
                    end(forward);
                    return Poll::Ready(None);
                };
                let next = ready!(inner.as_mut().poll_frame(cx));
                match &next {
                    Some(Ok(frame)) if !frame.is_trailers() => {}
                    None => {
                        *body = None;
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
            Inner::Raced {
                replay,
                error,
                body,
                ..
            } => {
                replay.is_empty()
                    && error.is_none()
                    && body.as_ref().is_none_or(|b| b.is_end_stream())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Direct { body } => body.size_hint(),
            Inner::Raced {
                replay_bytes, body, ..
            } => {
                let mut hint = body
                    .as_ref()
                    .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint());
                let lower = hint.lower().saturating_add(*replay_bytes);
                if let Some(upper) = hint.upper() {
                    hint.set_upper(upper.saturating_add(*replay_bytes));
                }
                hint.set_lower(lower);
                hint
            }
        }
    }
}

/// The stream ends: an inner layer's report for the winner reaches the outer report before the
/// outer layer sees the end.
#[inline]
fn end(forward: &mut Option<Forward>) {
    if let Some(f) = forward.take() {
        f.apply();
    }
}

impl<B: Body> fmt::Debug for HedgeBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Direct { .. } => f.write_str("HedgeBody::Direct"),
            Inner::Raced {
                replay,
                replay_bytes,
                error,
                body,
                ..
            } => f
                .debug_struct("HedgeBody::Raced")
                .field("replay_frames", &replay.len())
                .field("replay_bytes", replay_bytes)
                .field("error", &error.is_some())
                .field("live", &body.is_some())
                .finish(),
        }
    }
}
