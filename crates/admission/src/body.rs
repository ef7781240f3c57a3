//! [`AdmissionBody`]: a response body that holds the admission permit until it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tailguard_core::Dialect;
use tailguard_core::progress::{Reading, StreamProgress};

use crate::gate::Permit;

pin_project! {
    /// The response body of [`BoundedAdmission`](crate::BoundedAdmission).
    ///
    /// Wraps the inner body and holds the request's capacity until the body ends: the last frame
    /// (`poll_frame` returns `None`, or `is_end_stream` turns true after a frame), a body error,
    /// or the body dropped (the client went away). A refusal in the response mode is a body
    /// of this type too, carrying the JSON error. Frames, `is_end_stream`, `size_hint` and
    /// trailers are forwarded untouched; the data type stays `B::Data`.
    pub struct AdmissionBody<B>
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
            permit: Option<Permit>,
            // With an adaptive limit, until the first token: finds it.
            tracker: Option<Box<Reading>>,
        },
        Local {
            data: Option<B::Data>,
        },
    }
}

impl<B: Body> AdmissionBody<B> {
    /// The admitted response `res`, holding `permit` until its body ends. With an adaptive
    /// limit a 2xx stream is watched for its first token (read through the request's
    /// `progress` record); a 2xx answer that is not a stream
    /// gives no TTFT sample; anything else ends censored (see [`crate::adaptive`]).
    pub(crate) fn response(
        res: Response<B>,
        mut permit: Option<Permit>,
        progress: &StreamProgress,
    ) -> Response<Self> {
        let mut tracker = None;
        if let Some(p) = permit.as_mut().filter(|p| p.wants_ttft()) {
            let headers = res.headers();
            if !res.status().is_success() {
                // Failed before a token: censored when the permit is released.
            } else if Dialect::Auto.resolve_stream(headers).is_some() {
                tracker = Some(Box::new(progress.reading(&Dialect::Auto, headers)));
            } else {
                p.no_ttft();
            }
        }
        res.map(|body| AdmissionBody {
            kind: Kind::Stream {
                body,
                permit,
                tracker,
            },
        })
    }

    pub(crate) fn local(data: B::Data) -> Self {
        AdmissionBody {
            kind: Kind::Local { data: Some(data) },
        }
    }

    /// Whether this body still holds admission capacity.
    pub fn holds_permit(&self) -> bool {
        matches!(
            &self.kind,
            Kind::Stream {
                permit: Some(_),
                ..
            }
        )
    }

    /// Whether this body is a refusal rendered by the gate (not the inner service's body).
    pub fn is_rejection(&self) -> bool {
        matches!(self.kind, Kind::Local { .. })
    }
}

impl<B: Body> Body for AdmissionBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Stream {
                mut body,
                permit,
                tracker,
            } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                if let (Some(t), Some(Ok(f))) = (tracker.as_mut(), &frame)
                    && let Some(data) = f.data_ref()
                    && t.observe(data).first_token
                {
                    *tracker = None;
                    if let Some(p) = permit.as_mut() {
                        p.first_token();
                    }
                }
                // End of stream, end after this frame, or a body error.
                if !matches!(frame, Some(Ok(_))) || body.is_end_stream() {
                    drop(permit.take());
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

impl<B: Body> fmt::Debug for AdmissionBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionBody")
            .field("rejection", &self.is_rejection())
            .field("holds_permit", &self.holds_permit())
            .finish()
    }
}
