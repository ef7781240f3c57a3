//! The race of one eligible request: buffer the body, send attempts, poll them, commit the
//! first to produce a token or return the most informative failure.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use tailguard_core::attempt::{Attempt, Settle};
use tailguard_core::progress::StreamProgress;
use tailguard_core::replay::Buffering;
use tailguard_core::{BoxError, Deadlines, EndReport, HedgeOutcome, ReplayBody, deadline};
use tokio::time::Instant;
use tower_service::Service;

use crate::answer::{self, Escape};
use crate::body::{CutWatch, Forward, HedgeBody};
use crate::cost::Costs;
use crate::delay::{self, Estimator};
use crate::error::RequestBodyError;
use crate::inflight::{Failure, InFlight, Step, Streaming, Trigger};
use crate::state::HedgeState;
use crate::template::Template;
use crate::verdict::Fault;

mod end;
mod timer;

use timer::HedgeTimer;

/// Refusals after which a backup may borrow from the budget: asked at the delay, again two
/// delays later, then four (doubling intervals), its third ask comes when its primary has
/// waited seven delays, past any slow tail: stuck, not queued behind a stream or two (issue
/// 29: borrowing from the second ask, three delays late, sent backups for a burst of primaries
/// merely queued on the free replica of the real bench, and lost).
const STUCK_AFTER_REFUSALS: u8 = 2;

/// The most informative failure so far: its attempt index, the failure, the attempt's own end
/// report.
type Kept<RB, E> = (u8, Failure<RB, E>, Option<EndReport>);

enum Phase<F, B> {
    Buffering(Buffering<B>),
    /// The body is over the replay cap: one attempt, passed through as it is.
    Single(Pin<Box<F>>),
    Racing,
    Done,
}

/// What a race resolves to, before the mode says what the caller gets.
pub(crate) type Output<RB, E> = Result<Response<HedgeBody<RB>>, Escape<E>>;

/// The race of one eligible request.
pub(crate) struct Race<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    B: Body,
    RB: Body,
{
    shared: Arc<HedgeState>,
    service: S,
    /// Whether `service` is ready for a call (it is for the first: `call` took the ready one).
    ready: bool,
    phase: Phase<S::Future, B>,
    head: Template,
    outer_report: Option<EndReport>,
    body: Option<ReplayBody<B>>,
    record: Attempt,
    /// The number of this race's first attempt: `0`, or, for a request that came with an
    /// [`Attempt`] of its own (a resumed stream's continuation), that attempt's number, so
    /// that the placer below sees a later attempt of the same request.
    base: u8,
    estimator: Option<Arc<Estimator>>,
    /// The request's deadlines, set by a layer outside (the delay stays within them).
    deadlines: Option<Deadlines>,
    /// The delay in force for this request (the outcome's), capped by the deadlines at start.
    delay: Option<Duration>,
    /// When the next delay-triggered attempt is due.
    timer: HedgeTimer,
    /// The attempts in flight, in the order they were sent.
    attempts: Vec<InFlight<S::Future, RB>>,
    sent: u8,
    /// Attempts that ended without a token (see [`delay_cap`](Self::delay_cap)).
    empties: u8,
    pending_send: Option<Trigger>,
    best: Option<Kept<RB, S::Error>>,
    budget_exhausted: bool,
    /// How many times the hedge budget refused this race a backup.
    refusals: u8,
    /// The primary was found to be a probe against an alternative (see `delay::probe_due`).
    probe_seen: bool,
    /// A backup was skipped: it could not have won before the deadline.
    deadline_skipped: bool,
    /// The request's progress record, when a layer outside reads the stream (see `CutWatch`).
    progress: Option<StreamProgress>,
    costs: Costs,
}

impl<S, B, RB> fmt::Debug for Race<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    B: Body,
    RB: Body,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Race")
            .field("sent", &self.sent)
            .field("in_flight", &self.attempts.len())
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl<S, B, RB> Race<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
    RB: Body,
    RB::Data: From<Bytes>,
    RB::Error: Into<BoxError>,
{
    pub(crate) fn new(shared: Arc<HedgeState>, service: S, parts: Parts, body: B) -> Self {
        shared.budget.deposit();
        let estimator = shared.delay.estimator(&parts);
        let cap = shared.config.replay_cap;
        let outer_report = parts.extensions.get::<EndReport>().cloned();
        let deadlines = parts.extensions.get::<Deadlines>().copied();
        let costs = Costs::new(&parts);
        let adopted = parts.extensions.get::<Attempt>().cloned();
        Race {
            progress: parts.extensions.get::<StreamProgress>().cloned(),
            costs,
            deadline_skipped: false,
            outer_report,
            deadlines,
            shared,
            service,
            ready: true,
            phase: Phase::Buffering(ReplayBody::buffer(body, cap)),
            head: Template::new(parts),
            body: None,
            base: adopted.as_ref().map_or(0, Attempt::number),
            record: adopted.unwrap_or_else(Attempt::primary),
            estimator,
            delay: None,
            timer: HedgeTimer::default(),
            attempts: Vec::new(),
            sent: 0,
            empties: 0,
            pending_send: None,
            best: None,
            budget_exhausted: false,
            refusals: 0,
            probe_seen: false,
        }
    }

    /// Attempt `index` of this race, in the request's record.
    fn attempt(&self, index: u8) -> Attempt {
        self.record.next(self.base.saturating_add(index))
    }

    /// The request of attempt `index`: a copy of the client's head, with the attempt header,
    /// the [`Attempt`], the attempt's own end report and progress record.
    fn request(
        &self,
        index: u8,
        body: ReplayBody<B>,
        report: Option<&EndReport>,
    ) -> Request<ReplayBody<B>> {
        let header = self.shared.config.attempt_header.as_ref();
        (self.head).attempt_request(body, self.attempt(index), header, report)
    }

    /// Sends attempt number `self.sent` on the (ready) service.
    fn send(&mut self, trigger: Trigger, now: Instant) {
        let Some(body) = self.body.as_ref().and_then(ReplayBody::try_clone) else {
            return;
        };
        let index = self.sent;
        let report = self.outer_report.as_ref().map(|_| EndReport::new());
        let mut req = self.request(index, body, report.as_ref());
        deadline::propagate(&mut req, now);
        let fut = self.service.call(req);
        self.ready = false;
        let stream = self.head.asks_to_stream();
        self.attempts
            .push(InFlight::new(index, now, report, stream, fut));
        self.sent += 1;
        if index > 0 {
            metrics::counter!("tailguard_hedge_sent_total", "trigger" => trigger.as_str())
                .increment(1);
        }
        tracing::debug!(
            attempt = index,
            trigger = trigger.as_str(),
            delay_ms = self.delay.map(|d| d.as_millis() as u64),
            "tailguard-hedge: attempt sent"
        );
        // The next delay-triggered attempt goes out `delay` after this one, within what the
        // deadlines leave. The timer itself is armed lazily, only if the race is still
        // undecided when it would go to sleep.
        let next = (self.delay)
            .and_then(|d| delay::within(d, self.deadlines.as_ref(), now))
            .filter(|_| self.sent < self.delay_cap());
        self.timer.arm(now, next);
    }

    /// How many attempts the delay may bring in all (see `Config::attempt_cap`).
    fn delay_cap(&self) -> u8 {
        self.shared.config.attempt_cap(self.empties)
    }

    /// Brings the backup of a primary its placer marked a probe against an alternative
    /// forward, when that is due sooner than the delay (see `delay::probe_due`); asked until
    /// the placer has placed the primary, while it is the only attempt.
    fn back_up_probe_sooner(&mut self) {
        if self.probe_seen || self.sent != 1 {
            return;
        }
        let Some(alternative) = self.record.probe_alternative() else {
            return;
        };
        self.probe_seen = true;
        let primary = self.attempts.first();
        (self.timer).sooner(primary.and_then(|p| delay::probe_due(p.sent_at, alternative)));
    }

    /// Decides to send another attempt, if none is waiting to go out, fewer than `cap` were
    /// sent and the budget allows.
    fn want(&mut self, trigger: Trigger, cap: u8) {
        if self.pending_send.is_some() || self.sent >= cap {
            return;
        }
        let now = Instant::now();
        let expected = self.estimator.as_ref().and_then(|e| e.expected(now));
        if !delay::could_win(self.deadlines.as_ref(), expected, now) {
            self.deadline_skipped = true;
            metrics::counter!("tailguard_hedge_deadline_skipped_total").increment(1);
            tracing::debug!(
                trigger = trigger.as_str(),
                "tailguard-hedge: no time to win"
            );
            return;
        }
        // A backup its placer knows would wait longer than the attempt it backs up (the last
        // sent) has waited is held until it has, with no budget spent (`delay::held_until`).
        let last = self.attempts.last().filter(|_| trigger == Trigger::Delay);
        let known = || self.record.backup_wait();
        if let Some((due, wait)) = last.and_then(|a| delay::held_until(a.sent_at, known()?, now)) {
            tracing::debug!(
                wait_ms = wait.as_millis() as u64,
                "tailguard-hedge: backup held"
            );
            return self.timer.until(due, wait);
        }
        let failover = trigger == Trigger::Failure;
        let granted = if failover || self.refusals < STUCK_AFTER_REFUSALS {
            self.shared.budget.withdraw(failover, now)
        } else {
            self.shared.budget.borrow(now)
        };
        if !granted {
            self.budget_exhausted = true;
            self.refusals = self.refusals.saturating_add(u8::from(!failover));
            tracing::debug!(
                trigger = trigger.as_str(),
                "tailguard-hedge: budget exhausted, no attempt sent"
            );
            if trigger == Trigger::Delay {
                // Asked again after twice the interval (few asks): deposits may have come.
                self.timer.again(now);
            }
            return;
        }
        if trigger == Trigger::Delay {
            metrics::histogram!("tailguard_hedge_delay_used_seconds")
                .record(self.timer.armed().as_secs_f64());
        }
        self.pending_send = Some(trigger);
    }

    /// Keeps `failure` of attempt `index` if it is the most informative so far, and calls for
    /// the next attempt.
    fn fail(&mut self, index: u8, failure: Failure<RB, S::Error>, report: Option<EndReport>) {
        let fault = failure.fault();
        // A stream that ended without a token (an interrupting server's bare `[DONE]`): the
        // placer may read it as an interruption, and it may take further attempts.
        let empty = fault == Fault::NO_TOKEN;
        let how = if empty { Settle::Empty } else { Settle::Failed };
        self.empties = self.empties.saturating_add(u8::from(empty));
        self.attempt(index).settle(how);
        tracing::debug!(
            attempt = index,
            failure = fault.kind.as_str(),
            "tailguard-hedge: attempt failed before its first token"
        );
        if self
            .best
            .as_ref()
            .is_none_or(|(_, kept, _)| fault.replaces(kept.fault()))
        {
            self.best = Some((index, failure, report));
        }
        // Every other failure stays within the attempts configured.
        let c = &self.shared.config;
        let cap = c.attempt_cap(if empty { c.empty_retries } else { 0 });
        self.want(Trigger::Failure, cap);
    }

    fn forward(&self, report: Option<EndReport>) -> Option<Forward> {
        Some(Forward {
            inner: report?,
            outer: self.outer_report.clone()?,
        })
    }

    fn commit(
        &mut self,
        attempt: InFlight<S::Future, RB>,
        stream: Streaming<RB>,
        token: bool,
    ) -> Response<HedgeBody<RB>> {
        let (index, sent_at) = (attempt.index, attempt.sent_at);
        // Tells whatever placed the attempt below (a `ReplicaSet`) how it went (its score).
        let how = if token {
            Settle::Token
        } else {
            Settle::Answered
        };
        self.attempt(index).settle(how);
        let now = Instant::now();
        self.cancel_all(now, token);
        self.phase = Phase::Done;
        self.best = None;
        if token {
            if let Some(e) = &self.estimator {
                e.record(now.saturating_duration_since(sent_at), false, now);
            }
            if index > 0 {
                metrics::counter!("tailguard_hedge_won_total").increment(1);
            }
        }
        tracing::debug!(
            attempt = index,
            attempts = self.sent,
            first_token = token,
            "tailguard-hedge: attempt committed"
        );
        let forward = self.forward(attempt.report);
        let mut res = stream.into_response(None, forward);
        if let Some(progress) = self.progress.take() {
            let attempt = self.attempt(index);
            res.body_mut().watch(CutWatch { attempt, progress });
        }
        self.stamp(&mut res, self.outcome(Some(index)));
        res
    }

    /// Every attempt failed: the answer to the most informative failure, and the reason in the
    /// request's end report (after an inner layer's own, see `answer`).
    fn finalize(&mut self) -> Output<RB, S::Error> {
        self.phase = Phase::Done;
        self.timer.stop();
        metrics::counter!("tailguard_hedge_all_failed_total").increment(1);
        let Some((index, failure, report)) = self.best.take() else {
            let error = "tailguard-hedge: no attempt completed".into();
            return Err(Escape::Own(error, self.head.is_grpc()));
        };
        let fault = failure.fault();
        tracing::debug!(
            attempt = index,
            attempts = self.sent,
            failure = fault.kind.as_str(),
            "tailguard-hedge: every attempt failed"
        );
        let (answer, reason) = answer::every_attempt_failed(
            failure,
            self.forward(report),
            self.shared.config.as_errors,
            self.sent,
            self.head.is_grpc(),
        );
        if let Some(outer) = &self.outer_report {
            outer.report(reason);
        }
        answer.map(|mut res| {
            self.stamp(&mut res, self.outcome(None));
            res
        })
    }

    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Output<RB, S::Error>> {
        loop {
            match &mut self.phase {
                Phase::Buffering(buffering) => {
                    let body = match ready!(Pin::new(buffering).poll(cx)) {
                        Ok(body) => body,
                        Err(e) => {
                            self.phase = Phase::Done;
                            let error = RequestBodyError::new(e.into()).into();
                            return Poll::Ready(Err(Escape::Own(error, self.head.is_grpc())));
                        }
                    };
                    self.start(body);
                }
                Phase::Single(fut) => {
                    let res = ready!(fut.as_mut().poll(cx));
                    self.phase = Phase::Done;
                    return Poll::Ready(match res {
                        Ok(res) => {
                            let mut res = res.map(HedgeBody::direct);
                            self.stamp(&mut res, HedgeOutcome::new(1, 0, None));
                            Ok(res)
                        }
                        Err(e) => Err(Escape::Inner(e)),
                    });
                }
                Phase::Racing => return self.poll_race(cx),
                Phase::Done => return Poll::Pending,
            }
        }
    }

    /// The request body is buffered: send the primary.
    fn start(&mut self, body: ReplayBody<B>) {
        if body.is_replayable() {
            self.body = Some(body);
            self.phase = Phase::Racing;
            let now = Instant::now();
            self.delay = self
                .shared
                .delay
                .delay(self.estimator.as_deref(), now)
                .and_then(|d| delay::within(d, self.deadlines.as_ref(), now));
            self.send(Trigger::Primary, now);
        } else {
            tracing::debug!("tailguard-hedge: request body over the replay cap");
            let req = self.request(0, body, None);
            self.sent = 1;
            self.phase = Phase::Single(Box::pin(self.service.call(req)));
        }
    }

    fn poll_race(&mut self, cx: &mut Context<'_>) -> Poll<Output<RB, S::Error>> {
        loop {
            let mut progressed = self.poll_send(cx);
            let mut i = 0;
            while i < self.attempts.len() {
                match self.attempts[i].poll(cx, &self.shared.config) {
                    Step::Pending => i += 1,
                    Step::Commit(stream, token) => {
                        let attempt = self.attempts.remove(i);
                        return Poll::Ready(Ok(self.commit(attempt, stream, token)));
                    }
                    Step::Failed(failure) => {
                        let attempt = self.attempts.remove(i);
                        self.costs
                            .ended(attempt.index, attempt.sent_at, Instant::now());
                        self.fail(attempt.index, failure, attempt.report);
                        progressed = true;
                    }
                }
            }
            self.back_up_probe_sooner();
            if self.timer.poll(cx) {
                self.want(Trigger::Delay, self.delay_cap());
                progressed = true;
            }
            if self.attempts.is_empty() && self.pending_send.is_none() {
                return Poll::Ready(self.finalize());
            }
            if !progressed {
                return Poll::Pending;
            }
        }
    }

    /// Sends the attempt waiting to go out once the service is ready; `true` when something
    /// happened (sent, or the service failed, which counts as a failed attempt).
    fn poll_send(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(trigger) = self.pending_send else {
            return false;
        };
        if !self.ready {
            match self.service.poll_ready(cx) {
                Poll::Pending => return false,
                Poll::Ready(Ok(())) => self.ready = true,
                Poll::Ready(Err(e)) => {
                    self.pending_send = None;
                    let index = self.sent;
                    self.sent += 1;
                    self.fail(index, Failure::Service(e), None);
                    return true;
                }
            }
        }
        self.pending_send = None;
        self.send(trigger, Instant::now());
        true
    }
}
