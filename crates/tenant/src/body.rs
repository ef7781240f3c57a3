//! [`BudgetBody`]: a response body that settles its request's reservation when it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::reservation::Meter;

pin_project! {
    /// The response body of [`TokenBudget`](crate::TokenBudget).
    ///
    /// The inner body, metered while it streams when its request holds a reservation: every
    /// frame is read (through the request's progress record) as it passes, and the
    /// reservation is settled when the body ends — its last frame (`poll_frame` returns `None`,
    /// or `is_end_stream` turns true after a frame), a body error, or the body dropped (the
    /// client went away). A refusal is a body of this type too, carrying the JSON error.
    /// Frames, `is_end_stream`, `size_hint` and trailers are forwarded untouched.
    pub struct BudgetBody<B>
    where
        B: Body,
    {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B>
    where
        B: Body,
    {
        Stream {
            #[pin]
            body: B,
            meter: Option<Meter>,
        },
        Local {
            data: Option<B::Data>,
        },
    }
}

impl<B: Body> BudgetBody<B> {
    /// `body`, untouched (no reservation, or one already settled).
    pub(crate) fn passed(body: B) -> Self {
        BudgetBody {
            kind: Kind::Stream { body, meter: None },
        }
    }

    /// `body`, settling `meter`'s reservation when it ends.
    pub(crate) fn metered(body: B, meter: Meter) -> Self {
        BudgetBody {
            kind: Kind::Stream {
                body,
                meter: Some(meter),
            },
        }
    }

    /// A refusal's body.
    pub(crate) fn local(data: B::Data) -> Self {
        BudgetBody {
            kind: Kind::Local { data: Some(data) },
        }
    }

    /// Whether this body still holds an unsettled reservation.
    pub fn holds_reservation(&self) -> bool {
        matches!(&self.kind, Kind::Stream { meter: Some(_), .. })
    }

    /// Whether this body is a refusal rendered by the layer (not the inner service's body).
    pub fn is_refusal(&self) -> bool {
        matches!(self.kind, Kind::Local { .. })
    }
}

impl<B: Body> Body for BudgetBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Stream { mut body, meter } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                let ended = match (&frame, meter.as_mut()) {
                    (_, None) => false,
                    (Some(Ok(f)), Some(m)) => {
                        if let Some(data) = f.data_ref() {
                            m.observe(data);
                        } else if let Some(trailers) = f.trailers_ref() {
                            m.observe_trailers(trailers);
                        }
                        body.is_end_stream()
                    }
                    (None, Some(_)) => true,
                    // A body error: settled with what passed before it.
                    (Some(Err(_)), Some(_)) => {
                        drop(meter.take());
                        false
                    }
                };
                if let Some(m) = meter.take_if(|_| ended) {
                    m.finish();
                }
                Poll::Ready(frame)
            }
            KindProj::Local { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Stream { body, .. } => body.is_end_stream(),
            Kind::Local { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Stream { body, .. } => body.size_hint(),
            Kind::Local { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.remaining() as u64))
            }
        }
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
