//! [`AnswerBody`]: the response body of a layer that either passes the inner service's response
//! on or answers the request itself (a `502` for a transport error, a `400` for a malformed
//! request), so that the layer needs nothing of the inner body beyond `Data: From<Bytes>`, which
//! every hyper, axum and tonic body has.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The inner service's body untouched, or the answer a layer made itself (the JSON error;
    /// none for a gRPC trailers-only answer). The response body of
    /// [`BadGateway`](crate::BadGateway) and [`RequestFactsService`](crate::RequestFactsService).
    ///
    /// The inner body's frames, `is_end_stream` and `size_hint` are forwarded untouched. An
    /// answer is one data frame: `is_end_stream` is true once it was read (at once for an empty
    /// answer), and its `size_hint` is exact (its remaining bytes until read, then 0).
    ///
    /// A layer whose body keeps per-request state (a reservation to settle, a permit to hold, a
    /// race to replay) holds one of these, pinned, beside that state, so that the local answer's
    /// frame logic exists once, here.
    pub struct AnswerBody<B: Body> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B: Body> {
        Inner { #[pin] body: B },
        // The answer's one frame, until it is read.
        Answer { data: Option<B::Data> },
    }
}

impl<B: Body> AnswerBody<B> {
    /// The inner service's body, passed on untouched.
    pub fn inner(body: B) -> Self {
        AnswerBody {
            kind: Kind::Inner { body },
        }
    }

    /// A layer's own answer: `data` as one frame, or an empty body.
    pub fn answer(data: Option<B::Data>) -> Self {
        AnswerBody {
            kind: Kind::Answer { data },
        }
    }

    /// Whether this body is an answer the layer made itself.
    pub fn is_answer(&self) -> bool {
        matches!(self.kind, Kind::Answer { .. })
    }
}

impl<B: Body> fmt::Debug for AnswerBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnswerBody")
            .field("answer", &self.is_answer())
            .finish()
    }
}

impl<B: Body> Body for AnswerBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Answer { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Answer { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Answer { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.remaining() as u64))
            }
        }
    }
}
