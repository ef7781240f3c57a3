//! The response body of [`Resume`](super::Resume): the stream as the client gets it, resumed on
//! another replica when it breaks.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tailguard_core::attempt::Attempt;
use tailguard_core::{AnswerBody, BoxError, EndReport, ResumeOutcome, Resumption, Upstream};
use tokio::time::Instant;

use super::finish;
use super::layer::{Shared, attempts_of};
use super::plan::{NotResumable, Plan};
use super::read::{Break, Reader};
use super::stall::Stall;

// A stalled stream and its continuation racing: `Reading::stalled` and `Reading::race`.
mod race;

/// A continuation request on its way: its response.
pub(crate) type Sending<RB> = Pin<Box<dyn Future<Output = Result<Response<RB>, BoxError>> + Send>>;

/// Sends a continuation: its body, and its attempt in the request's record.
pub(crate) type Sender<RB> = Box<dyn FnMut(Bytes, Attempt) -> Sending<RB> + Send>;

/// What a resumable response's body needs to resume it.
pub(crate) struct Ctx<RB> {
    send: Sender<RB>,
    plan: Plan,
    /// The request's attempt record: a continuation is a later attempt of the same request,
    /// so the placer below sends it to a replica no earlier attempt went to.
    record: Attempt,
    /// Attempts the request took so far (the number of the next one).
    attempts: u8,
    resumes: u8,
    shared: Arc<Shared>,
    /// Where each break and its outcome are reported (the recorder's), if anywhere.
    report: Option<EndReport>,
    /// The upstream of the stream being read, when its response named it.
    from: Option<Upstream>,
}

impl<RB> Ctx<RB> {
    pub(crate) fn new(
        send: Sender<RB>,
        plan: Plan,
        record: Attempt,
        attempts: u8,
        shared: Arc<Shared>,
    ) -> Self {
        Ctx {
            send,
            plan,
            record,
            attempts,
            resumes: 0,
            shared,
            report: None,
            from: None,
        }
    }

    /// Reports breaks to `report`, the first stream's coming from `from`.
    pub(crate) fn reporting(mut self, report: Option<EndReport>, from: Option<Upstream>) -> Self {
        self.report = report;
        self.from = from;
        self
    }
}

pin_project! {
    /// The response body of [`Resume`](super::Resume).
    ///
    /// For a request that cannot be resumed, the inner body itself. For one that can, the
    /// stream read event by event: complete events pass on as they came, and when the stream
    /// breaks (see [`Resume`](super::Resume)), what the client got so far is the prefix of a
    /// continuation sent to another replica, whose stream continues this one.
    pub struct ResumeBody<RB: Body> {
        #[pin]
        inner: Inner<RB>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<RB: Body> {
        // The inner body untouched, or an answer the layer rendered itself.
        Direct { #[pin] body: AnswerBody<RB> },
        Reading { reading: Box<Reading<RB>> },
    }
}

/// What polling a body for its next frame gives.
type Polled<RB> = Poll<Option<Result<Frame<<RB as Body>::Data>, <RB as Body>::Error>>>;

/// A resumable stream.
struct Reading<RB: Body> {
    ctx: Ctx<RB>,
    reader: Reader,
    phase: Phase<RB>,
    /// Bytes to hand on before anything else.
    out: VecDeque<Bytes>,
    /// Whether the stream has stalled.
    stall: Stall,
}

enum Phase<RB: Body> {
    /// Reading the current stream.
    Live(Pin<Box<RB>>),
    /// Past what the reader can read (an event over its cap): passed on as it is.
    Raw(Pin<Box<RB>>),
    /// A continuation on its way, for `brk`; `fallback`: what happens if it fails. A stalled
    /// stream (`Fallback::Live`) races it: its next token first, and the continuation (which
    /// the hedge below answers only at its first token) is dropped.
    Resuming {
        sending: Sending<RB>,
        brk: Break,
        fallback: Fallback<RB>,
    },
    /// Ending as the broken stream ended.
    Ending(End<RB::Error>),
    Done,
}

/// What a stream whose continuation failed does.
enum Fallback<RB: Body> {
    /// Ends as it broke.
    End(End<RB::Error>),
    /// Goes on: a stalled stream, kept while its continuation was on its way.
    Live(Pin<Box<RB>>),
}

/// Why no continuation went out for a break.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NotSent {
    /// A tool call was in progress.
    ToolCall,
    /// The request cannot be continued from what was sent (see [`Plan::continuation`]).
    Request(NotResumable),
    /// The request took its most resumes.
    MaxResumes,
    /// The resume budget is spent.
    Budget,
}

impl NotSent {
    /// The metric label (`tailguard_resumes_total{outcome}`).
    fn as_str(self) -> &'static str {
        match self {
            NotSent::ToolCall => "tool_call",
            NotSent::Request(why) => why.as_str(),
            NotSent::MaxResumes => "max_resumes",
            NotSent::Budget => "budget",
        }
    }
}

/// How a stream ended that was not resumed.
enum End<E> {
    Clean,
    Error(E),
}

impl<RB: Body> ResumeBody<RB> {
    pub(crate) fn direct(body: RB) -> Self {
        ResumeBody {
            inner: Inner::Direct {
                body: AnswerBody::inner(body),
            },
        }
    }

    pub(crate) fn reading(body: RB, ctx: Ctx<RB>) -> Self {
        let reader = Reader::first(ctx.plan.api());
        let stall = Stall::new(ctx.shared.stall_after);
        ResumeBody {
            inner: Inner::Reading {
                reading: Box::new(Reading {
                    ctx,
                    reader,
                    phase: Phase::Live(Box::pin(body)),
                    out: VecDeque::new(),
                    stall,
                }),
            },
        }
    }

    pub(crate) fn local(data: Option<Bytes>) -> Self
    where
        RB::Data: From<Bytes>,
    {
        ResumeBody {
            inner: Inner::Direct {
                body: AnswerBody::answer(data.map(RB::Data::from)),
            },
        }
    }

    /// How many times the stream was resumed so far.
    pub fn resumes(&self) -> u8 {
        match &self.inner {
            Inner::Reading { reading } => reading.ctx.resumes,
            _ => 0,
        }
    }
}

impl<RB> Body for ResumeBody<RB>
where
    RB: Body,
    RB::Data: From<Bytes>,
    RB::Error: Into<BoxError>,
{
    type Data = RB::Data;
    type Error = RB::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<RB::Data>, RB::Error>>> {
        match self.project().inner.project() {
            InnerProj::Direct { body } => body.poll_frame(cx),
            InnerProj::Reading { reading } => reading.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Direct { body } => body.is_end_stream(),
            Inner::Reading { reading } => {
                reading.out.is_empty() && matches!(reading.phase, Phase::Done)
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Direct { body } => body.size_hint(),
            // A resumed stream's length is nobody's to promise.
            Inner::Reading { .. } => SizeHint::default(),
        }
    }
}

impl<RB> Reading<RB>
where
    RB: Body,
    RB::Data: From<Bytes>,
    RB::Error: Into<BoxError>,
{
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Polled<RB> {
        loop {
            if let Some(bytes) = self.out.pop_front() {
                if !bytes.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(bytes.into()))));
                }
                continue;
            }
            match &mut self.phase {
                Phase::Live(body) => match body.as_mut().poll_frame(cx) {
                    Poll::Ready(next) => {
                        let frame = self.read(next);
                        self.stall.tokens(self.reader.sent().output_tokens);
                        if let Some(frame) = frame {
                            return Poll::Ready(Some(Ok(frame)));
                        }
                    }
                    Poll::Pending if self.stall.poll(cx) => self.stalled(),
                    Poll::Pending => return Poll::Pending,
                },
                Phase::Raw(body) => return body.as_mut().poll_frame(cx),
                Phase::Resuming { sending, .. } => match sending.as_mut().poll(cx) {
                    Poll::Ready(res) => self.continued(res),
                    Poll::Pending if self.race(cx) => {}
                    Poll::Pending => return Poll::Pending,
                },
                Phase::Ending(_) => {
                    let Phase::Ending(end) = std::mem::replace(&mut self.phase, Phase::Done) else {
                        continue;
                    };
                    return Poll::Ready(match end {
                        End::Clean => None,
                        End::Error(e) => Some(Err(e)),
                    });
                }
                Phase::Done => return Poll::Ready(None),
            }
        }
    }

    /// Reads the current stream's next frame: its complete events go out; a frame that is
    /// not data (trailers) is handed back to pass on as it is.
    fn read(
        &mut self,
        next: Option<Result<Frame<RB::Data>, RB::Error>>,
    ) -> Option<Frame<RB::Data>> {
        match next {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(mut data) => {
                    let bytes = data.copy_to_bytes(data.remaining());
                    match self.reader.frame(&bytes) {
                        Ok((out, brk)) => {
                            self.out.push_back(out);
                            if let Some(brk) = brk {
                                self.broke(brk, None);
                            }
                        }
                        Err(_) => self.raw(),
                    }
                    None
                }
                Err(frame) => Some(frame),
            },
            Some(Err(e)) => {
                // A connection closed after an early terminal event (an interruption's bare
                // `[DONE]`) is the interruption's break, not a transport one.
                let brk = if self.reader.holding() {
                    Break::DoneWithoutFinish
                } else {
                    Break::Transport
                };
                self.broke(brk, Some(End::Error(e)));
                None
            }
            None => {
                let (held, brk) = self.reader.end();
                self.out.push_back(held);
                match brk {
                    Some(brk) => self.broke(brk, Some(End::Clean)),
                    None => self.phase = Phase::Done,
                }
                None
            }
        }
    }

    /// The reader cannot follow the stream (an event over its cap): what it did not forward,
    /// and the rest, pass on as they are; not resumable any more.
    fn raw(&mut self) {
        self.give_up(None);
    }

    /// The current stream broke (`brk`): a continuation goes out if the request may take
    /// one; otherwise the stream ends as it broke, with what was held back of it: `end` when
    /// its body ended, or (`None`, an in-band error event) the rest of its body as it is.
    fn broke(&mut self, brk: Break, end: Option<End<RB::Error>>) {
        match self.resume(brk) {
            Ok(sending) => {
                // The broken stream's body (if it still runs) is dropped: its upstream request
                // is cancelled.
                self.phase = Phase::Resuming {
                    sending,
                    brk,
                    fallback: Fallback::End(end.unwrap_or(End::Clean)),
                };
            }
            Err(NotSent::Request(NotResumable::NoTokensLeft)) if brk != Break::ErrorEvent => {
                // The answer is whole; only its finish is missing (see `finish`). The broken
                // stream's held bytes (a bare terminal event) are dropped with its body.
                self.outcome(brk, ResumeOutcome::FinishedAtLimit, None);
                self.reader.take_held();
                let api = self.ctx.plan.api();
                self.out
                    .push_back(finish::at_limit(api, self.reader.sent()));
                self.phase = Phase::Done;
            }
            Err(why) => {
                self.outcome(brk, ResumeOutcome::NotSent(why.as_str()), None);
                self.give_up(end);
            }
        }
    }

    /// Sends a continuation for `brk` if the request may take one, or says why not (a tool
    /// call in progress, the output limit used up, the most resumes taken, the budget spent).
    fn resume(&mut self, brk: Break) -> Result<Sending<RB>, NotSent> {
        let ctx = &mut self.ctx;
        let sent = self.reader.sent();
        if sent.tool_call {
            return Err(NotSent::ToolCall);
        }
        let body = ctx.plan.continuation(sent).map_err(NotSent::Request)?;
        if ctx.resumes >= ctx.shared.max_resumes {
            return Err(NotSent::MaxResumes);
        }
        if !ctx.shared.budget.spend(Instant::now()) {
            return Err(NotSent::Budget);
        }
        ctx.resumes += 1;
        let attempt = ctx.record.next(ctx.attempts);
        tracing::info!(
            reason = brk.as_str(),
            resume = ctx.resumes,
            "tailguard-hedge: stream broke after its first token; resuming on another replica"
        );
        Ok((ctx.send)(body, attempt))
    }

    /// A continuation's response arrived (or failed).
    fn continued(&mut self, res: Result<Response<RB>, BoxError>) {
        let Phase::Resuming { brk, fallback, .. } = std::mem::replace(&mut self.phase, Phase::Done)
        else {
            return;
        };
        match res {
            Ok(res) if res.status().is_success() => {
                let to = res.extensions().get::<Upstream>().cloned();
                self.outcome(brk, ResumeOutcome::Resumed, to.clone());
                self.ctx.from = to;
                self.ctx.attempts = self
                    .ctx
                    .attempts
                    .saturating_add(attempts_of(res.extensions()));
                self.reader = Reader::continuing(self.ctx.plan.api(), self.reader.sent().clone());
                self.phase = Phase::Live(Box::pin(res.into_body()));
                // The continuation has the stall limit for its next token.
                self.stall.restart();
            }
            _ => {
                self.outcome(brk, ResumeOutcome::Failed, None);
                // Its attempt number is spent.
                self.ctx.attempts = self.ctx.attempts.saturating_add(1);
                match fallback {
                    Fallback::End(end) => self.give_up(Some(end)),
                    Fallback::Live(body) => self.phase = Phase::Live(body),
                }
            }
        }
    }

    /// Ends the stream as it broke: what was held back of it, then its end (`None`: the rest
    /// of the live body, as it is).
    fn give_up(&mut self, end: Option<End<RB::Error>>) {
        self.out.push_back(self.reader.take_held());
        self.phase = match (end, std::mem::replace(&mut self.phase, Phase::Done)) {
            (Some(end), _) => Phase::Ending(end),
            (None, Phase::Live(body)) => Phase::Raw(body),
            (None, _) => Phase::Ending(End::Clean),
        };
    }

    /// A stream broke (`brk`), and what came of it: counted and reported.
    fn outcome(&self, brk: Break, outcome: ResumeOutcome, to: Option<Upstream>) {
        count(brk, outcome);
        if let Some(report) = &self.ctx.report {
            report.report_resume(Resumption::new(brk, outcome, self.ctx.from.clone(), to));
        }
    }
}

/// `tailguard_resumes_total{reason, outcome}`.
fn count(brk: Break, outcome: ResumeOutcome) {
    metrics::counter!(
        "tailguard_resumes_total",
        "reason" => brk.as_str(),
        "outcome" => outcome.as_str()
    )
    .increment(1);
}

impl<RB: Body> Drop for Reading<RB> {
    /// The client went away while a continuation was on its way: counted as `cancelled` (the
    /// continuation's request is cancelled with it).
    fn drop(&mut self) {
        if let Phase::Resuming { brk, .. } = self.phase {
            count(brk, ResumeOutcome::Cancelled);
        }
    }
}

impl<RB: Body> fmt::Debug for ResumeBody<RB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Direct { body } if body.is_answer() => f.write_str("ResumeBody::Local"),
            Inner::Direct { .. } => f.write_str("ResumeBody::Direct"),
            Inner::Reading { reading } => f
                .debug_struct("ResumeBody::Reading")
                .field("resumes", &reading.ctx.resumes)
                .finish_non_exhaustive(),
        }
    }
}
