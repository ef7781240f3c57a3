//! [`BudgetBody`]: a response body that settles its request's reservation when it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tailguard_core::AnswerBody;

use crate::reservation::Meter;

pin_project! {
    /// The response body of [`TokenBudget`](crate::TokenBudget).
    ///
    /// The inner body, metered while it streams when its request holds a reservation: every
    /// frame is read (through the request's progress record) as it passes, or, for an answer
    /// that is not a stream, copied (up to [`MAX_DOCUMENT_BYTES`](crate::MAX_DOCUMENT_BYTES)) to
    /// read the document's usage at its end. The reservation is settled when the body ends —
    /// its last frame (`poll_frame` returns `None`, or `is_end_stream` turns true after a
    /// frame), a body error, or the body dropped (the client went away). A refusal is a body of
    /// this type too, carrying the JSON error.
    /// Frames, `is_end_stream`, `size_hint` and trailers are forwarded untouched.
    pub struct BudgetBody<B>
    where
        B: Body,
    {
        // The inner body, or the refusal.
        #[pin]
        body: AnswerBody<B>,
        // The inner body's reservation, until it is settled; never a refusal's.
        meter: Option<Meter>,
    }
}

impl<B: Body> BudgetBody<B> {
    /// `body`, untouched (no reservation, or one already settled).
    pub(crate) fn passed(body: B) -> Self {
        BudgetBody {
            body: AnswerBody::inner(body),
            meter: None,
        }
    }

    /// `body`, settling `meter`'s reservation when it ends.
    pub(crate) fn metered(body: B, meter: Meter) -> Self {
        BudgetBody {
            body: AnswerBody::inner(body),
            meter: Some(meter),
        }
    }

    /// A refusal's body.
    pub(crate) fn local(data: B::Data) -> Self {
        BudgetBody {
            body: AnswerBody::answer(Some(data)),
            meter: None,
        }
    }

    /// Whether this body still holds an unsettled reservation.
    pub fn holds_reservation(&self) -> bool {
        self.meter.is_some()
    }

    /// Whether this body is a refusal rendered by the layer (not the inner service's body).
    pub fn is_refusal(&self) -> bool {
        self.body.is_answer()
    }
}

impl<B: Body> Body for BudgetBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.body.as_mut().poll_frame(cx));
        let ended = match (&frame, this.meter.as_mut()) {
            (_, None) => false,
            (Some(Ok(f)), Some(m)) => {
                if let Some(data) = f.data_ref() {
                    m.observe(data);
                } else if let Some(trailers) = f.trailers_ref() {
                    m.observe_trailers(trailers);
                }
                this.body.is_end_stream()
            }
            (None, Some(_)) => true,
            // A body error: settled with what passed before it.
            (Some(Err(_)), Some(_)) => {
                drop(this.meter.take());
                false
            }
        };
        if let Some(m) = this.meter.take_if(|_| ended) {
            m.finish();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B: Body> fmt::Debug for BudgetBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BudgetBody")
            .field("refusal", &self.is_refusal())
            .field("holds_reservation", &self.holds_reservation())
            .finish()
    }
}
