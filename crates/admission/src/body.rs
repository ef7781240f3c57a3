//! [`AdmissionBody`]: a response body that holds the admission permit until it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::{HeaderMap, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tailguard_core::progress::{Reading, StreamProgress};
use tailguard_core::{AnswerBody, Dialect};

use crate::fair::Served;
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
        // The inner body, or the refusal.
        #[pin]
        body: AnswerBody<B>,
        // The inner body's permit, until it ends; never a refusal's.
        hold: Option<Hold>,
    }
}

/// What an admitted body holds for the gate: the permit, and what it reads of the stream
/// through the request's progress record.
///
/// The gate wants the first token (an adaptive limit) and the output's tokens (fair queueing:
/// its tenant's charge is corrected with them). For the first token it starts a reading at the
/// head: it follows the layer inside that reads the stream or, if none does, reads it itself,
/// every frame to the end, since the layers outside then follow it. For the output alone it
/// starts no reading (it would become the stream's reader in a stack where the readers are
/// outside it, and scan what they scan): when the hold is dropped (the body ended, failed or
/// was dropped) it follows the record once. The count is exact when a layer inside reads the
/// stream, misses the frame in passing when the reader is outside, and is unknown (the charge
/// at admission stands) when no layer reads it.
struct Hold {
    permit: Permit,
    reading: Option<Box<Reading>>,
    /// The record to follow at the end, for the output (when there is no reading).
    progress: Option<StreamProgress>,
}

impl Hold {
    /// A frame passed through the body.
    fn frame<D: Buf>(&mut self, frame: &Frame<D>) {
        let Some(r) = self.reading.as_mut() else {
            return;
        };
        let first = self.permit.wants_ttft();
        if !(first || r.is_reader()) {
            return;
        }
        if let Some(data) = frame.data_ref() {
            if r.observe(data).first_token && first {
                self.permit.first_token();
            }
        } else if let Some(trailers) = frame.trailers_ref() {
            r.observe_trailers(trailers);
        }
        if !r.is_reader() && !self.permit.wants_ttft() && !self.permit.wants_output() {
            self.reading = None;
        }
    }

    /// The body ended cleanly: the reader flushes what the framing allows.
    fn end(mut self) {
        if let Some(r) = self.reading.as_mut() {
            r.finish();
        }
    }
}

/// The output seen so far by `r`: the usage the stream reported (when a layer asked for it),
/// else its token events.
fn output(r: &mut Reading) -> u64 {
    // A follower learns what the reader saw (the reader knows it).
    r.observe(&Bytes::new());
    let usage = r.usage().and_then(|u| u.completion_tokens);
    usage.unwrap_or_else(|| r.tokens())
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.permit.wants_output() {
            return;
        }
        let n = match (self.reading.as_mut(), &self.progress) {
            (Some(r), _) => output(r),
            (None, Some(p)) => {
                let mut r = p.reading(&Dialect::Auto, &HeaderMap::new());
                if r.is_reader() {
                    // No layer read the stream: the charge at admission stands.
                    return;
                }
                output(&mut r)
            }
            (None, None) => return,
        };
        self.permit.served(Served::Output(n));
    }
}

impl<B: Body> AdmissionBody<B> {
    /// The admitted response `res`, holding `permit` until its body ends. When the gate wants
    /// the first token (an adaptive limit) or the output (fair queueing), a 2xx stream is read
    /// or followed through the request's `progress` record (see [`Hold`]); a 2xx answer that is
    /// not a stream gives no TTFT sample and leaves the output unknown (the charge at admission
    /// stands); any other status ends censored (see [`crate::adaptive`]) with no output.
    pub(crate) fn response(
        res: Response<B>,
        mut permit: Option<Permit>,
        progress: &StreamProgress,
    ) -> Response<Self> {
        let (mut reading, mut follow) = (None, None);
        if let Some(p) = permit
            .as_mut()
            .filter(|p| p.wants_ttft() || p.wants_output())
        {
            let headers = res.headers();
            if !res.status().is_success() {
                // Failed before a token: censored when the permit is released; no output.
                p.served(Served::Output(0));
            } else if Dialect::Auto.resolve_stream(headers).is_none() {
                p.no_ttft();
            } else if p.wants_ttft() {
                reading = Some(Box::new(progress.reading(&Dialect::Auto, headers)));
            } else {
                follow = Some(progress.clone());
            }
        }
        let hold = permit.map(|permit| Hold {
            permit,
            reading,
            progress: follow,
        });
        res.map(|body| AdmissionBody {
            body: AnswerBody::inner(body),
            hold,
        })
    }

    pub(crate) fn local(data: B::Data) -> Self {
        AdmissionBody {
            body: AnswerBody::answer(Some(data)),
            hold: None,
        }
    }

    /// Whether this body still holds admission capacity.
    pub fn holds_permit(&self) -> bool {
        self.hold.is_some()
    }

    /// Whether this body is a refusal rendered by the gate (not the inner service's body).
    pub fn is_rejection(&self) -> bool {
        self.body.is_answer()
    }
}

impl<B: Body> Body for AdmissionBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.body.as_mut().poll_frame(cx));
        let hold = this.hold;
        if let (Some(h), Some(Ok(f))) = (hold.as_mut(), &frame) {
            h.frame(f);
        }
        match &frame {
            // A body error.
            Some(Err(_)) => drop(hold.take()),
            // End of stream, or end after this frame.
            None => hold.take().map_or((), Hold::end),
            Some(Ok(_)) if this.body.is_end_stream() => hold.take().map_or((), Hold::end),
            Some(Ok(_)) => {}
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

impl<B: Body> fmt::Debug for AdmissionBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionBody")
            .field("rejection", &self.is_rejection())
            .field("holds_permit", &self.holds_permit())
            .finish()
    }
}
