//! The response future of [`FirstTokenHedge`](crate::FirstTokenHedge), and the race it runs.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Buf;
use http::request::Parts;
use http::{
    Extensions, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri, Version,
};
use http_body::Body;
use pin_project_lite::pin_project;
use tailguard_core::headers::grpc_status;
use tailguard_core::replay::Buffering;
use tailguard_core::{
    BoxError, EndReason, EndReport, HedgeOutcome, ReplayBody, StreamTracker, UpstreamError,
    UpstreamFailure,
};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::attempt::{Attempt, attempt_header_value};
use crate::body::{Forward, HedgeBody, Live, LiveProj};
use crate::delay::Estimator;
use crate::error::RequestBodyError;
use crate::layer::MAX_ATTEMPTS;
use crate::service::Shared;

pin_project! {
    /// The response future of [`FirstTokenHedge`](crate::FirstTokenHedge).
    ///
    /// Resolves when a winner is committed (its first token arrived) or every attempt failed.
    /// Dropping it drops every attempt in flight, which cancels their upstream requests.
    pub struct ResponseFuture<S, B, RB>
    where
        S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
        B: Body,
        RB: Body,
    {
        #[pin]
        kind: Kind<S::Future, Box<Race<S, B, RB>>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, R> {
        Direct { #[pin] fut: F },
        Hedged { race: R },
    }
}

impl<S, B, RB> ResponseFuture<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    B: Body,
    RB: Body,
{
    pub(crate) fn direct(fut: S::Future) -> Self {
        ResponseFuture {
            kind: Kind::Direct { fut },
        }
    }

    pub(crate) fn hedged(race: Race<S, B, RB>) -> Self {
        ResponseFuture {
            kind: Kind::Hedged {
                race: Box::new(race),
            },
        }
    }
}

impl<S, B, RB> fmt::Debug for ResponseFuture<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    B: Body,
    RB: Body,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Direct { .. } => f.write_str("ResponseFuture::Direct"),
            Kind::Hedged { race } => f
                .debug_struct("ResponseFuture::Hedged")
                .field("sent", &race.sent)
                .field("in_flight", &race.attempts.len())
                .field("delay", &race.delay)
                .finish(),
        }
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
    RB: Body,
{
    type Output = Result<Response<HedgeBody<RB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Direct { fut } => Poll::Ready(match ready!(fut.poll(cx)) {
                Ok(res) => Ok(res.map(HedgeBody::direct)),
                Err(e) => Err(e.into()),
            }),
            KindProj::Hedged { race } => race.poll(cx),
        }
    }
}

/// What caused an attempt after the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trigger {
    Primary,
    Delay,
    Failure,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Primary => "primary",
            Trigger::Delay => "delay",
            Trigger::Failure => "failure",
        }
    }
}

/// An attempt whose response head arrived: the head, the frames it sent so far (all before
/// its first token), and its body, in one allocation that becomes the client's body.
type Streaming<RB> = Pin<Box<Live<RB>>>;

enum SlotState<F, RB: Body> {
    Head(Pin<Box<F>>),
    Body(Streaming<RB>),
    Taken,
}

struct Slot<F, RB: Body> {
    index: u8,
    sent_at: Instant,
    /// This attempt's own end report, when the request carries one.
    report: Option<EndReport>,
    state: SlotState<F, RB>,
}

/// An attempt that failed before its first token.
enum Failure<RB: Body, E> {
    Response {
        kind: UpstreamFailure,
        rank: u8,
        stream: Streaming<RB>,
        error: Option<RB::Error>,
    },
    Service(E),
}

impl<RB: Body, E> Failure<RB, E> {
    fn kind(&self) -> UpstreamFailure {
        match self {
            Failure::Response { kind, .. } => *kind,
            Failure::Service(_) => UpstreamFailure::Transport,
        }
    }

    fn rank(&self) -> u8 {
        match self {
            Failure::Response { rank, .. } => *rank,
            Failure::Service(_) => 0,
        }
    }
}

/// The request head of a race.
enum Head {
    /// As the client sent it (with the primary's attempt header), until the primary takes it:
    /// the primary is sent with the original head, not a copy.
    Original(Parts),
    /// The copy backups are built from, made when the primary was sent.
    Template(Template),
    /// Given to the only attempt there will be.
    Taken,
}

/// The request head backups are built from (`http::request::Parts` cannot be cloned).
///
/// The headers are kept as a list of name/value pairs, not a `HeaderMap`: one allocation for
/// the copy instead of two (a map's index table is rebuilt only when a backup is sent).
struct Template {
    method: Method,
    uri: Uri,
    version: Version,
    headers: Vec<(HeaderName, HeaderValue)>,
    extensions: Extensions,
}

impl Template {
    fn of(parts: &Parts) -> Self {
        let mut headers = Vec::with_capacity(parts.headers.len());
        headers.extend(parts.headers.iter().map(|(n, v)| (n.clone(), v.clone())));
        Template {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            headers,
            extensions: parts.extensions.clone(),
        }
    }

    /// A copy of the head, as a request with `body`. Every value of a name is appended in the
    /// order the original map held them, so the copy iterates exactly as the original did.
    fn request<T>(&self, body: T) -> Request<T> {
        // Capacity counts names, not values; a huge list grows the map as it goes.
        let mut headers = HeaderMap::with_capacity(self.headers.len().min(256));
        for (name, value) in &self.headers {
            headers.append(name.clone(), value.clone());
        }
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = headers;
        *req.extensions_mut() = self.extensions.clone();
        req
    }
}

/// The attempts in flight, in the order they were sent: at most [`MAX_ATTEMPTS`], kept inline
/// (no allocation per request).
struct Slots<T> {
    items: [Option<T>; MAX_ATTEMPTS as usize],
    len: usize,
}

impl<T> Slots<T> {
    fn new() -> Self {
        Slots {
            items: [const { None }; MAX_ATTEMPTS as usize],
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `item`. At most `max_attempts <= MAX_ATTEMPTS` attempts are ever sent, so there
    /// is always room.
    fn push(&mut self, item: T) {
        debug_assert!(
            self.len < self.items.len(),
            "more attempts than MAX_ATTEMPTS"
        );
        if let Some(slot) = self.items.get_mut(self.len) {
            *slot = Some(item);
            self.len += 1;
        }
    }

    /// The item at `i < len`.
    fn get_mut(&mut self, i: usize) -> &mut T {
        self.items[i].as_mut().expect("slot below len is filled")
    }

    /// Removes the item at `i < len`, keeping the order of the others.
    fn remove(&mut self, i: usize) -> T {
        let item = self.items[i].take().expect("slot below len is filled");
        self.items[i..self.len].rotate_left(1);
        self.len -= 1;
        item
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.items[..self.len].iter().flatten()
    }

    fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        let len = std::mem::take(&mut self.len);
        self.items[..len].iter_mut().filter_map(Option::take)
    }
}

/// A deadline that does not come (about 30 years).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// In-band error event or retryable gRPC status: the upstream's own words.
const RANK_IN_BAND: u8 = 3;
/// A retryable HTTP status with its body.
const RANK_STATUS: u8 = 2;
/// A `2xx` stream that ended or broke before its first token.
const RANK_NO_TOKEN: u8 = 1;

/// The best failure so far: its attempt index, the failure, the attempt's own end report.
type Kept<RB, E> = (u8, Failure<RB, E>, Option<EndReport>);

enum Step<RB: Body, E> {
    Pending,
    /// Commit this attempt; `token` when it produced a first token (a TTFT sample).
    Commit(Streaming<RB>, bool),
    Failed(Failure<RB, E>),
}

enum Phase<F, B> {
    Buffering(Buffering<B>),
    Single(Pin<Box<F>>),
    Racing,
    Done,
}

/// The race of one eligible request.
pub(crate) struct Race<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    B: Body,
    RB: Body,
{
    shared: Arc<Shared>,
    service: S,
    /// Whether `service` is ready for a call (it is for the first: `call` took the ready one).
    ready: bool,
    phase: Phase<S::Future, B>,
    head: Head,
    outer_report: Option<EndReport>,
    body: Option<ReplayBody<B>>,
    record: Attempt,
    estimator: Option<Arc<Estimator>>,
    delay: Option<Duration>,
    /// When the next delay-triggered attempt is due.
    hedge_at: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
    attempts: Slots<Slot<S::Future, RB>>,
    sent: u8,
    pending_send: Option<Trigger>,
    best: Option<Kept<RB, S::Error>>,
    budget_exhausted: bool,
}

impl<S, B, RB> Race<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
    RB: Body,
{
    pub(crate) fn new(shared: Arc<Shared>, service: S, mut parts: Parts, body: B) -> Self {
        shared.budget.deposit();
        // The template carries the primary's attempt header, so that each attempt's copy of the
        // headers only has a value replaced (no reallocation).
        if let Some(h) = &shared.config.attempt_header {
            parts.headers.insert(h.clone(), attempt_header_value(0));
        }
        let estimator = shared.delay.estimator(&parts);
        let cap = shared.config.replay_cap;
        let outer_report = parts.extensions.get::<EndReport>().cloned();
        Race {
            outer_report,
            shared,
            service,
            ready: true,
            phase: Phase::Buffering(ReplayBody::buffer(body, cap)),
            head: Head::Original(parts),
            body: None,
            record: Attempt::primary(),
            estimator,
            delay: None,
            hedge_at: None,
            timer: None,
            attempts: Slots::new(),
            sent: 0,
            pending_send: None,
            best: None,
            budget_exhausted: false,
        }
    }

    /// The request of attempt `index`. The first one takes the original head (keeping a copy
    /// for backups only when `keep_template`); later ones get a copy of the template.
    fn request(
        &mut self,
        index: u8,
        body: ReplayBody<B>,
        report: Option<&EndReport>,
        keep_template: bool,
    ) -> Request<ReplayBody<B>> {
        let mut req = if let Head::Template(t) = &self.head {
            t.request(body)
        } else {
            let head = match &self.head {
                Head::Original(parts) if keep_template => Head::Template(Template::of(parts)),
                _ => Head::Taken,
            };
            match std::mem::replace(&mut self.head, head) {
                Head::Original(parts) => Request::from_parts(parts, body),
                _ => Request::new(body),
            }
        };
        if index > 0
            && let Some(h) = &self.shared.config.attempt_header
        {
            req.headers_mut()
                .insert(h.clone(), attempt_header_value(index));
        }
        req.extensions_mut().insert(self.record.with_number(index));
        if let Some(r) = report {
            req.extensions_mut().insert(r.clone());
        }
        req
    }

    fn outcome(&self, winner: u8) -> HedgeOutcome {
        HedgeOutcome::new(self.sent, winner, self.delay)
            .with_budget_exhausted(self.budget_exhausted)
    }

    fn can_send(&self) -> bool {
        let pending = u8::from(self.pending_send.is_some());
        self.sent + pending < self.shared.config.max_attempts
    }

    /// Sends attempt number `self.sent` on the (ready) service.
    fn send(&mut self, trigger: Trigger, now: Instant) {
        let Some(body) = self.body.as_ref().and_then(ReplayBody::try_clone) else {
            return;
        };
        let index = self.sent;
        let report = self.outer_report.as_ref().map(|_| EndReport::new());
        let backups = self.sent + 1 < self.shared.config.max_attempts;
        let req = self.request(index, body, report.as_ref(), backups);
        let fut = self.service.call(req);
        self.ready = false;
        self.attempts.push(Slot {
            index,
            sent_at: now,
            report,
            state: SlotState::Head(Box::pin(fut)),
        });
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
        // The next delay-triggered attempt goes out `delay` after this one. The timer itself
        // is armed lazily, only if the race is still undecided when it would go to sleep.
        self.hedge_at = match self.delay {
            Some(d) if self.sent < self.shared.config.max_attempts => {
                // A delay too large to add is as good as none.
                Some(now.checked_add(d).unwrap_or_else(|| now + FAR_FUTURE))
            }
            _ => None,
        };
    }

    /// Polls the hedge timer (arming it first if needed); `true` when it fired.
    fn poll_timer(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(at) = self.hedge_at else {
            return false;
        };
        let timer = match &mut self.timer {
            Some(t) => {
                if t.deadline() != at {
                    t.as_mut().reset(at);
                }
                t
            }
            None => self.timer.insert(Box::pin(tokio::time::sleep_until(at))),
        };
        if timer.as_mut().poll(cx).is_ready() {
            self.hedge_at = None;
            true
        } else {
            false
        }
    }

    /// Decides to send another attempt, if the budget allows.
    fn want(&mut self, trigger: Trigger) {
        if !self.shared.budget.withdraw(Instant::now()) {
            self.budget_exhausted = true;
            metrics::counter!("tailguard_hedge_budget_exhausted_total").increment(1);
            tracing::debug!(
                trigger = trigger.as_str(),
                "tailguard-hedge: budget exhausted, no attempt sent"
            );
            return;
        }
        if trigger == Trigger::Delay
            && let Some(d) = self.delay
        {
            metrics::histogram!("tailguard_hedge_delay_used_seconds").record(d.as_secs_f64());
        }
        self.pending_send = Some(trigger);
    }

    fn keep_failure(
        &mut self,
        index: u8,
        failure: Failure<RB, S::Error>,
        report: Option<EndReport>,
    ) {
        tracing::debug!(
            attempt = index,
            failure = failure.kind().as_str(),
            "tailguard-hedge: attempt failed before its first token"
        );
        // Ties go to the later attempt: its information is the freshest.
        if self
            .best
            .as_ref()
            .is_none_or(|(_, b, _)| failure.rank() >= b.rank())
        {
            self.best = Some((index, failure, report));
        }
    }

    /// Drops every attempt still in flight, recording how long each had waited.
    fn cancel_all(&mut self, now: Instant) {
        for slot in self.attempts.drain() {
            let waited = now.saturating_duration_since(slot.sent_at);
            if let Some(e) = &self.estimator {
                e.record(waited, true, now);
            }
            tracing::debug!(
                attempt = slot.index,
                waited_ms = waited.as_millis() as u64,
                "tailguard-hedge: attempt cancelled"
            );
        }
        self.timer = None;
        self.hedge_at = None;
        self.pending_send = None;
    }

    fn forward(&self, report: Option<EndReport>) -> Option<Forward> {
        Some(Forward {
            inner: report?,
            outer: self.outer_report.clone()?,
        })
    }

    fn commit(
        &mut self,
        slot: Slot<S::Future, RB>,
        stream: Streaming<RB>,
        token: bool,
    ) -> Response<HedgeBody<RB>> {
        let (index, sent_at) = (slot.index, slot.sent_at);
        let now = Instant::now();
        self.cancel_all(now);
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
        let forward = self.forward(slot.report);
        let mut res = stream.into_response(None, forward);
        res.extensions_mut().insert(self.outcome(index));
        res
    }

    fn finalize(&mut self) -> Result<Response<HedgeBody<RB>>, BoxError> {
        self.phase = Phase::Done;
        self.timer = None;
        self.hedge_at = None;
        metrics::counter!("tailguard_hedge_all_failed_total").increment(1);
        let Some((index, failure, report)) = self.best.take() else {
            return Err("tailguard-hedge: no attempt completed".into());
        };
        // An inner layer's own reason for that attempt first, then ours.
        let forward = self.forward(report);
        if let Some(f) = &forward {
            f.apply();
        }
        if let Some(outer) = &self.outer_report {
            outer.report(EndReason::UpstreamError(failure.kind()));
        }
        tracing::debug!(
            attempt = index,
            attempts = self.sent,
            failure = failure.kind().as_str(),
            "tailguard-hedge: every attempt failed"
        );
        if self.shared.config.failures_as_errors {
            let kind = failure.kind();
            let message = match failure {
                Failure::Response { stream, .. } => format!(
                    "{} attempts failed before a first token; the best answer was {}",
                    self.sent,
                    stream.status()
                ),
                Failure::Service(e) => format!(
                    "{} attempts failed before a first token; the last error: {}",
                    self.sent,
                    e.into()
                ),
            };
            return Err(UpstreamError::new(kind, message).into());
        }
        match failure {
            Failure::Response { stream, error, .. } => {
                let mut res = stream.into_response(error, forward);
                res.extensions_mut().insert(self.outcome(index));
                Ok(res)
            }
            Failure::Service(e) => Err(e.into()),
        }
    }

    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<HedgeBody<RB>>, BoxError>> {
        loop {
            match &mut self.phase {
                Phase::Buffering(buffering) => {
                    let body = match ready!(Pin::new(buffering).poll(cx)) {
                        Ok(body) => body,
                        Err(e) => {
                            self.phase = Phase::Done;
                            return Poll::Ready(Err(RequestBodyError::new(e.into()).into()));
                        }
                    };
                    if body.is_replayable() {
                        self.body = Some(body);
                        self.phase = Phase::Racing;
                        let now = Instant::now();
                        self.delay = self.shared.delay.delay(self.estimator.as_deref(), now);
                        self.send(Trigger::Primary, now);
                    } else {
                        // Over the replay cap: one attempt, passed through as it is.
                        tracing::debug!("tailguard-hedge: request body over the replay cap");
                        let req = self.request(0, body, None, false);
                        self.sent = 1;
                        self.phase = Phase::Single(Box::pin(self.service.call(req)));
                    }
                }
                Phase::Single(fut) => {
                    let res = ready!(fut.as_mut().poll(cx));
                    self.phase = Phase::Done;
                    return Poll::Ready(match res {
                        Ok(res) => {
                            let mut res = res.map(HedgeBody::direct);
                            res.extensions_mut().insert(HedgeOutcome::new(1, 0, None));
                            Ok(res)
                        }
                        Err(e) => Err(e.into()),
                    });
                }
                Phase::Racing => return self.poll_race(cx),
                Phase::Done => return Poll::Pending,
            }
        }
    }

    fn poll_race(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<HedgeBody<RB>>, BoxError>> {
        loop {
            let mut progressed = false;

            if let Some(trigger) = self.pending_send {
                if !self.ready {
                    match self.service.poll_ready(cx) {
                        Poll::Pending => {}
                        Poll::Ready(Ok(())) => self.ready = true,
                        Poll::Ready(Err(e)) => {
                            self.pending_send = None;
                            let index = self.sent;
                            self.sent += 1;
                            self.keep_failure(index, Failure::Service(e), None);
                            if self.can_send() {
                                self.want(Trigger::Failure);
                            }
                            progressed = true;
                        }
                    }
                }
                if self.ready && self.pending_send.is_some() {
                    self.pending_send = None;
                    self.send(trigger, Instant::now());
                    progressed = true;
                }
            }

            let mut i = 0;
            while i < self.attempts.len() {
                let cfg = &self.shared.config;
                let slot = self.attempts.get_mut(i);
                match poll_slot(slot, cx, cfg) {
                    Step::Pending => i += 1,
                    Step::Commit(stream, token) => {
                        let slot = self.attempts.remove(i);
                        return Poll::Ready(Ok(self.commit(slot, stream, token)));
                    }
                    Step::Failed(failure) => {
                        let slot = self.attempts.remove(i);
                        self.keep_failure(slot.index, failure, slot.report);
                        if self.can_send() && self.pending_send.is_none() {
                            self.want(Trigger::Failure);
                        }
                        progressed = true;
                    }
                }
            }

            if self.poll_timer(cx) {
                if self.can_send() && self.pending_send.is_none() {
                    self.want(Trigger::Delay);
                }
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
}

impl<S, B, RB> Drop for Race<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    B: Body,
    RB: Body,
{
    fn drop(&mut self) {
        // The client went away during the race: every attempt in flight is cancelled (dropped
        // with this struct) and recorded as a censored sample.
        if self.attempts.is_empty() {
            return;
        }
        let now = Instant::now();
        for slot in self.attempts.iter() {
            let waited = now.saturating_duration_since(slot.sent_at);
            if let Some(e) = &self.estimator {
                e.record(waited, true, now);
            }
            tracing::debug!(
                attempt = slot.index,
                waited_ms = waited.as_millis() as u64,
                "tailguard-hedge: attempt cancelled, response dropped"
            );
        }
    }
}

/// Polls one attempt as far as it goes.
fn poll_slot<F, RB, E>(
    slot: &mut Slot<F, RB>,
    cx: &mut Context<'_>,
    cfg: &crate::layer::FirstTokenHedgeLayer,
) -> Step<RB, E>
where
    F: Future<Output = Result<Response<RB>, E>>,
    RB: Body,
{
    if let SlotState::Head(fut) = &mut slot.state {
        let res = match fut.as_mut().poll(cx) {
            Poll::Pending => return Step::Pending,
            Poll::Ready(Err(e)) => {
                slot.state = SlotState::Taken;
                return Step::Failed(Failure::Service(e));
            }
            Poll::Ready(Ok(res)) => res,
        };
        let (head, body) = res.into_parts();
        let status = head.status;
        // What the head alone says; the body is boxed (once) after, with its tracker.
        let early = if cfg.retryable.contains(&status) {
            Some(Err((UpstreamFailure::Status(status), RANK_STATUS)))
        } else {
            match grpc_status(&head.headers) {
                // A trailers-only gRPC response with an error status.
                Some(code) if code != 0 && cfg.retryable_grpc.contains(&code) => {
                    Some(Err((UpstreamFailure::InBand, RANK_IN_BAND)))
                }
                Some(code) if code != 0 => Some(Ok(())),
                // Not a success: an answer about the request itself, returned as it is.
                _ if !status.is_success() => Some(Ok(())),
                _ => None,
            }
        };
        if let Some(early) = early {
            slot.state = SlotState::Taken;
            let stream = Live::new(head, body, None);
            return match early {
                Ok(()) => Step::Commit(stream, false),
                Err((kind, rank)) => Step::Failed(Failure::Response {
                    kind,
                    rank,
                    stream,
                    error: None,
                }),
            };
        }
        let tracker = StreamTracker::new(&cfg.dialect, &head.headers);
        let stream = Live::new(head, body, Some(tracker));
        slot.state = SlotState::Body(stream);
    }

    let SlotState::Body(stream) = &mut slot.state else {
        return Step::Pending;
    };
    let verdict = read_until_token(stream, cx, cfg);
    match verdict {
        Verdict::Pending => Step::Pending,
        Verdict::Commit(token) => match std::mem::replace(&mut slot.state, SlotState::Taken) {
            SlotState::Body(stream) => Step::Commit(stream, token),
            _ => Step::Pending,
        },
        Verdict::Fail(kind, rank, error) => {
            match std::mem::replace(&mut slot.state, SlotState::Taken) {
                SlotState::Body(stream) => Step::Failed(Failure::Response {
                    kind,
                    rank,
                    stream,
                    error,
                }),
                _ => Step::Pending,
            }
        }
    }
}

enum Verdict<E> {
    Pending,
    Commit(bool),
    Fail(UpstreamFailure, u8, Option<E>),
}

/// Reads frames of an attempt's body until its first token, a failure, or `Pending`.
fn read_until_token<RB: Body>(
    st: &mut Streaming<RB>,
    cx: &mut Context<'_>,
    cfg: &crate::layer::FirstTokenHedgeLayer,
) -> Verdict<RB::Error> {
    let LiveProj {
        tracker,
        replay,
        replay_bytes,
        mut body,
        ..
    } = st.as_mut().project();
    let Some(tracker) = tracker.as_mut() else {
        return Verdict::Commit(false);
    };
    loop {
        let Some(inner) = body.as_mut().as_pin_mut() else {
            return ended(tracker);
        };
        let frame = match inner.poll_frame(cx) {
            Poll::Pending => return Verdict::Pending,
            Poll::Ready(None) => {
                body.set(None);
                return ended(tracker);
            }
            Poll::Ready(Some(Err(e))) => {
                body.set(None);
                return Verdict::Fail(UpstreamFailure::Transport, RANK_NO_TOKEN, Some(e));
            }
            Poll::Ready(Some(Ok(frame))) => frame,
        };
        let end_stream = body
            .as_ref()
            .get_ref()
            .as_ref()
            .is_some_and(Body::is_end_stream);
        if let Some(data) = frame.data_ref() {
            let obs = tracker.observe(data);
            *replay_bytes += data.remaining() as u64;
            replay.push_back(frame);
            if obs.first_token {
                return Verdict::Commit(true);
            }
            if obs.error {
                return Verdict::Fail(UpstreamFailure::InBand, RANK_IN_BAND, None);
            }
            if obs.scan_error.is_some() || *replay_bytes > cfg.pre_token_cap as u64 {
                // The stream can no longer be judged (an event over the scanner's cap) or held
                // (over the pre-token cap): fail open, commit to it.
                return Verdict::Commit(false);
            }
        } else if let Some(trailers) = frame.trailers_ref() {
            let obs = tracker.observe_trailers(trailers);
            let code = grpc_status(trailers);
            replay.push_back(frame);
            body.set(None);
            if obs.first_token {
                return Verdict::Commit(true);
            }
            return match code {
                Some(c) if c != 0 && !cfg.retryable_grpc.contains(&c) => Verdict::Commit(false),
                Some(c) if c != 0 => Verdict::Fail(UpstreamFailure::InBand, RANK_IN_BAND, None),
                _ if obs.error => Verdict::Fail(UpstreamFailure::InBand, RANK_IN_BAND, None),
                _ => Verdict::Fail(UpstreamFailure::Protocol, RANK_NO_TOKEN, None),
            };
        } else {
            replay.push_back(frame);
        }
        if end_stream {
            body.set(None);
            return ended(tracker);
        }
    }
}

/// The body ended: a last token may still be flushed (an NDJSON line with no line end).
fn ended<E>(tracker: &mut StreamTracker) -> Verdict<E> {
    let obs = tracker.finish();
    if obs.first_token {
        Verdict::Commit(true)
    } else if obs.error {
        Verdict::Fail(UpstreamFailure::InBand, RANK_IN_BAND, None)
    } else {
        Verdict::Fail(UpstreamFailure::Protocol, RANK_NO_TOKEN, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backup's head is the original one: method, URI, version, every header value in the
    /// original's order (several values of a name, sensitive values), extensions.
    #[test]
    fn a_template_request_has_the_original_head() {
        #[derive(Clone, Debug, PartialEq)]
        struct Tag(u32);
        let mut req = Request::builder()
            .method(Method::PUT)
            .uri("https://example.com:8443/v1/chat?x=1")
            .version(Version::HTTP_2)
            .header("x-b", "1")
            .header("content-type", "application/json")
            .header("x-b", "2")
            .header("accept", "text/event-stream")
            .header("x-b", "3")
            .body(())
            .unwrap();
        let mut secret = HeaderValue::from_static("Bearer k");
        secret.set_sensitive(true);
        req.headers_mut()
            .insert(http::header::AUTHORIZATION, secret);
        req.extensions_mut().insert(Tag(7));
        let (parts, ()) = req.into_parts();
        let copy = Template::of(&parts).request(5u8);
        assert_eq!(copy.method(), parts.method);
        assert_eq!(copy.uri(), &parts.uri);
        assert_eq!(copy.version(), parts.version);
        let pairs = |h: &HeaderMap| {
            h.iter()
                .map(|(n, v)| (n.clone(), v.clone(), v.is_sensitive()))
                .collect::<Vec<_>>()
        };
        assert_eq!(pairs(copy.headers()), pairs(&parts.headers));
        assert_eq!(copy.headers().len(), 6);
        assert_eq!(copy.extensions().get::<Tag>(), Some(&Tag(7)));
        assert_eq!(*copy.body(), 5);
    }
}
