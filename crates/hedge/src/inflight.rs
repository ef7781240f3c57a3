//! One attempt of a race, read from its response head up to its first token.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Buf;
use http::Response;
use http_body::Body;
use tailguard_core::{EndReport, StreamTracker};
use tokio::time::Instant;

use crate::body::{Live, LiveProj};
use crate::config::Config;
use crate::verdict::{self, Fault, Verdict};

/// An attempt whose response head arrived: the head, the frames it sent so far (all before
/// its first token), and its body, in one box that becomes the client's body.
pub(crate) type Streaming<RB> = Pin<Box<Live<RB>>>;

/// An attempt that failed before its first token.
pub(crate) enum Failure<RB: Body, E> {
    /// A response: replayed as it went (with the body error, if it broke) should it be the
    /// most informative failure.
    Response {
        fault: Fault,
        stream: Streaming<RB>,
        error: Option<RB::Error>,
    },
    /// The inner service's error.
    Service(E),
}

impl<RB: Body, E> Failure<RB, E> {
    pub(crate) fn fault(&self) -> Fault {
        match self {
            Failure::Response { fault, .. } => *fault,
            Failure::Service(_) => Fault::NO_RESPONSE,
        }
    }
}

/// Where an attempt got to when polled.
pub(crate) enum Step<RB: Body, E> {
    Pending,
    /// Commit to this attempt; `token` when it produced a first token (a TTFT sample).
    Commit(Streaming<RB>, bool),
    Failed(Failure<RB, E>),
}

enum State<F, RB: Body> {
    Head(Pin<Box<F>>),
    Body(Streaming<RB>),
    /// Committed or failed: handed to the race.
    Taken,
}

/// An attempt in flight.
pub(crate) struct InFlight<F, RB: Body> {
    pub(crate) index: u8,
    pub(crate) sent_at: Instant,
    /// This attempt's own end report, when the request carries one.
    pub(crate) report: Option<EndReport>,
    /// The request asked to stream (its [`RequestFacts`](tailguard_core::RequestFacts) say
    /// `stream: true`): an answer that is not a stream fails the attempt.
    stream_asked: bool,
    state: State<F, RB>,
}

impl<F, RB, E> InFlight<F, RB>
where
    F: Future<Output = Result<Response<RB>, E>>,
    RB: Body,
{
    pub(crate) fn new(
        index: u8,
        sent_at: Instant,
        report: Option<EndReport>,
        stream_asked: bool,
        fut: F,
    ) -> Self {
        InFlight {
            index,
            sent_at,
            report,
            stream_asked,
            state: State::Head(Box::pin(fut)),
        }
    }

    /// Polls the attempt as far as it goes: its response head, then its body frame by frame,
    /// until a verdict.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>, cfg: &Config) -> Step<RB, E> {
        if let State::Head(fut) = &mut self.state {
            let res = match fut.as_mut().poll(cx) {
                Poll::Pending => return Step::Pending,
                Poll::Ready(Err(e)) => {
                    self.state = State::Taken;
                    return Step::Failed(Failure::Service(e));
                }
                Poll::Ready(Ok(res)) => res,
            };
            let (head, body) = res.into_parts();
            let verdict = verdict::of_head(cfg, head.status, &head.headers, self.stream_asked);
            // Only a body read on for its first token needs a tracker.
            let tracker = (verdict == Verdict::ReadOn)
                .then(|| StreamTracker::new(&cfg.dialect, &head.headers));
            self.state = State::Body(Live::new(head, body, tracker));
            if verdict != Verdict::ReadOn {
                return self.settle(verdict, None);
            }
        }
        let State::Body(stream) = &mut self.state else {
            return Step::Pending;
        };
        let (verdict, error) = read_until_token(stream, cx, cfg);
        self.settle(verdict, error)
    }

    /// Hands the attempt's response over once `verdict` decided it.
    fn settle(&mut self, verdict: Verdict, error: Option<RB::Error>) -> Step<RB, E> {
        if verdict == Verdict::ReadOn {
            return Step::Pending;
        }
        let State::Body(stream) = std::mem::replace(&mut self.state, State::Taken) else {
            return Step::Pending;
        };
        match verdict {
            Verdict::Commit { token } => Step::Commit(stream, token),
            Verdict::Fail(fault) => Step::Failed(Failure::Response {
                fault,
                stream,
                error,
            }),
            Verdict::ReadOn => Step::Pending,
        }
    }
}

/// Reads frames of an attempt's body, holding them for replay, until a verdict (with the body's
/// error, if it broke) or `Pending` (a [`Verdict::ReadOn`]).
fn read_until_token<RB: Body>(
    stream: &mut Streaming<RB>,
    cx: &mut Context<'_>,
    cfg: &Config,
) -> (Verdict, Option<RB::Error>) {
    let LiveProj {
        tracker,
        replay,
        replay_bytes,
        mut body,
        ..
    } = stream.as_mut().project();
    let Some(tracker) = tracker.as_mut() else {
        return (Verdict::Commit { token: false }, None);
    };
    loop {
        let Some(inner) = body.as_mut().as_pin_mut() else {
            return (
                verdict::of_end(&tracker.finish(), tracker.finished_empty()),
                None,
            );
        };
        let frame = match inner.poll_frame(cx) {
            Poll::Pending => return (Verdict::ReadOn, None),
            Poll::Ready(None) => {
                body.set(None);
                return (
                    verdict::of_end(&tracker.finish(), tracker.finished_empty()),
                    None,
                );
            }
            Poll::Ready(Some(Err(e))) => {
                body.set(None);
                return (Verdict::Fail(Fault::BODY_ERROR), Some(e));
            }
            Poll::Ready(Some(Ok(frame))) => frame,
        };
        let end_stream = body
            .as_ref()
            .get_ref()
            .as_ref()
            .is_some_and(Body::is_end_stream);
        let verdict = if let Some(data) = frame.data_ref() {
            let obs = tracker.observe(data);
            *replay_bytes += data.remaining() as u64;
            verdict::of_data(cfg, &obs, *replay_bytes, tracker.finished_empty())
        } else if let Some(trailers) = frame.trailers_ref() {
            // Trailers end the body: they always decide.
            body.set(None);
            verdict::of_trailers(cfg, &tracker.observe_trailers(trailers), trailers)
        } else {
            Verdict::ReadOn
        };
        replay.push_back(frame);
        if verdict != Verdict::ReadOn {
            return (verdict, None);
        }
        if end_stream {
            body.set(None);
            return (
                verdict::of_end(&tracker.finish(), tracker.finished_empty()),
                None,
            );
        }
    }
}

/// What caused an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    Primary,
    Delay,
    Failure,
}

impl Trigger {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Trigger::Primary => "primary",
            Trigger::Delay => "delay",
            Trigger::Failure => "failure",
        }
    }
}
