//! [`SseIdleTimeoutBody`]: the response body that runs the first-token, idle and total timers.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tailguard_core::render::{self, RenderError};
use tailguard_core::{BoxError, Chunk, EndReport, Phase, StreamTracker, TimeoutError, Wire};
use tokio::time::{Instant, Sleep};

use crate::layer::{Config, FirstTokenClock, OnExpiry, Timeouts};

/// Arms `sleep` for `deadline` lazily and polls it.
///
/// The sleep is created on first use and re-armed only when it would fire *after* `deadline`,
/// or when it already fired early; a sleep that will fire before `deadline` is left alone, and
/// the caller re-checks the real deadline when it fires. Moving a deadline later (every token
/// moves the idle deadline) therefore never touches the timer wheel.
pub(crate) fn arm(
    mut sleep: Pin<&mut Option<Sleep>>,
    deadline: Instant,
    cx: &mut Context<'_>,
) -> Poll<()> {
    match sleep.as_mut().as_pin_mut() {
        None => sleep.set(Some(tokio::time::sleep_until(deadline))),
        Some(s) => {
            let at = s.deadline();
            if at > deadline || (at < deadline && s.is_elapsed()) {
                s.reset(deadline);
            }
        }
    }
    match sleep.as_pin_mut() {
        Some(s) => s.poll(cx),
        None => Poll::Pending,
    }
}

/// The body timers of one response.
#[derive(Debug)]
struct Timers {
    start: Instant,
    /// Deadline and limit of the first-token timer; `None` once a token was seen.
    first_token: Option<(Instant, Duration)>,
    idle: Option<Duration>,
    total: Option<(Instant, Duration)>,
    /// When the gap since the last progress event started: the first time the body had to wait
    /// after that event (see `unstamped`).
    last_progress: Option<Instant>,
    /// A progress event was delivered and `last_progress` not yet stamped for it. Stamping
    /// lazily, when the body next waits (or at a flood check), keeps the clock off the per-frame
    /// path.
    unstamped: bool,
    first_token_seen: bool,
    keepalive_resets_idle: bool,
}

impl Timers {
    fn stamp(&mut self, now: Instant) {
        if self.unstamped {
            self.unstamped = false;
            self.last_progress = Some(now);
        }
    }

    fn active(&self) -> bool {
        self.first_token.is_some() || self.total.is_some() || self.idle.is_some()
    }

    /// The next deadline: first token (before it) or idle (after it), then total; on a tie the
    /// per-phase timer is named.
    fn next(&self) -> Option<(Instant, Phase, Duration)> {
        let phase = match (self.first_token_seen, self.first_token, self.idle) {
            (false, Some((at, limit)), _) => Some((at, Phase::FirstToken, limit)),
            (true, _, Some(limit)) => self
                .last_progress
                .and_then(|last| Some((last.checked_add(limit)?, Phase::Idle, limit))),
            _ => None,
        };
        match (phase, self.total) {
            (Some(p), Some((at, limit))) if at < p.0 => Some((at, Phase::Total, limit)),
            (Some(p), _) => Some(p),
            (None, Some((at, limit))) => Some((at, Phase::Total, limit)),
            (None, None) => None,
        }
    }
}

/// What the body yields once the inner body is gone.
enum End {
    /// The inner body is still being polled.
    Streaming,
    /// A rendered in-band error event, then the end.
    Local(Bytes),
    /// Trailers (the inner body's, or rendered gRPC ones), then the end.
    Trailers(HeaderMap),
    /// A body error, then the end.
    Error(BoxError),
    /// Nothing more.
    Finished,
}

impl fmt::Debug for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Streaming => f.write_str("Streaming"),
            End::Local(b) => f.debug_tuple("Local").field(&b.len()).finish(),
            End::Trailers(_) => f.write_str("Trailers"),
            End::Error(e) => f.debug_tuple("Error").field(e).finish(),
            End::Finished => f.write_str("Finished"),
        }
    }
}

pin_project! {
    /// The response body of [`SseIdleTimeout`](crate::SseIdleTimeout).
    ///
    /// Passes the inner body's frames through as [`Chunk::Inner`], runs the first-token, idle
    /// and total timers on the events it finds in them, and on expiry drops the inner body and
    /// ends as [`OnExpiry`] says. Error responses produced by the layer itself (a 504 before
    /// headers) are bodies of this type too, with [`Chunk::Local`] data.
    ///
    /// Forwards `size_hint` (plus any bytes it holds back), `is_end_stream` and trailers. A
    /// timeout ends the body earlier than the inner body's size hint said, as any timeout does.
    #[project = BodyProj]
    pub struct SseIdleTimeoutBody<B: Body> {
        #[pin]
        inner: Option<B>,
        #[pin]
        sleep: Option<Sleep>,
        // The waker `sleep` was last polled with.
        waker: Option<Waker>,
        tracker: Option<StreamTracker>,
        timers: Timers,
        // Bytes of an event not yet complete (when holding back), and how many bytes at the
        // front of `held` are released for sending.
        held: VecDeque<B::Data>,
        held_len: usize,
        release: usize,
        // Frames delivered in a row without waiting (for the flood check).
        streak: u8,
        hold_back: bool,
        // The tracker stopped scanning (an event over its cap).
        blind: bool,
        done: bool,
        on_expiry: OnExpiry,
        report: Option<EndReport>,
        end: End,
    }
}

impl<B: Body> fmt::Debug for SseIdleTimeoutBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseIdleTimeoutBody")
            .field("timers", &self.timers)
            .field("held_len", &self.held_len)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl<B: Body> SseIdleTimeoutBody<B> {
    /// A body that yields `bytes` and ends (the layer's own error responses).
    pub(crate) fn local(bytes: Bytes) -> Self {
        SseIdleTimeoutBody {
            inner: None,
            sleep: None,
            waker: None,
            tracker: None,
            timers: Timers {
                start: Instant::now(),
                first_token: None,
                idle: None,
                total: None,
                last_progress: None,
                unstamped: false,
                first_token_seen: false,
                keepalive_resets_idle: false,
            },
            held: VecDeque::new(),
            held_len: 0,
            release: 0,
            streak: 0,
            hold_back: false,
            blind: false,
            done: false,
            on_expiry: OnExpiry::Auto,
            report: None,
            end: if bytes.is_empty() {
                End::Finished
            } else {
                End::Local(bytes)
            },
        }
    }

    /// The body of a response whose headers arrived now.
    pub(crate) fn streaming(
        inner: B,
        headers: &HeaderMap,
        config: &Config,
        t: &Timeouts,
        start: Instant,
        report: Option<EndReport>,
    ) -> Self {
        let now = Instant::now();
        // A limit too far out to be an `Instant` is no limit (a header can carry any number).
        let first_token = t.first_token.and_then(|limit| {
            let from = match config.first_token_clock {
                FirstTokenClock::FromHeaders => now,
                _ => start,
            };
            Some((from.checked_add(limit)?, limit))
        });
        let timers = Timers {
            start,
            first_token,
            idle: t.idle,
            total: t
                .total
                .and_then(|limit| Some((start.checked_add(limit)?, limit))),
            last_progress: None,
            unstamped: false,
            first_token_seen: false,
            keepalive_resets_idle: config.keepalive_resets_idle,
        };
        let tracker = timers
            .active()
            .then(|| StreamTracker::new(&config.dialect, headers));
        SseIdleTimeoutBody {
            inner: Some(inner),
            sleep: None,
            waker: None,
            hold_back: tracker.is_some() && config.on_expiry != OnExpiry::BodyError,
            tracker,
            timers,
            held: VecDeque::new(),
            held_len: 0,
            release: 0,
            streak: 0,
            blind: false,
            done: false,
            on_expiry: config.on_expiry,
            report,
            end: End::Streaming,
        }
    }
}

impl<B> Body for SseIdleTimeoutBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Chunk<B::Data>;
    type Error = BoxError;

    #[inline(always)]
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.as_mut().project();
        // Pass-through (no body timer for this response): no tracker, nothing held back.
        if this.tracker.is_none()
            && matches!(this.end, End::Streaming)
            && let Some(inner) = this.inner.as_mut().as_pin_mut()
        {
            return match inner.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame.map_data(Chunk::Inner)))),
                // Without an inner body, `End::Streaming` reads as the end.
                Poll::Ready(Some(Err(e))) => {
                    this.inner.set(None);
                    Poll::Ready(Some(Err(e.into())))
                }
                Poll::Ready(None) => {
                    this.inner.set(None);
                    Poll::Ready(None)
                }
                Poll::Pending => Poll::Pending,
            };
        }
        // The steady state: nothing held back or to release, streaming, no flood check due: a
        // data frame that is ready goes out at once when it ends on an event boundary. Anything
        // else is left to the general path, with what was polled. (The projection is not
        // passed to anything out of line here, so that it never has to be built in memory.)
        let polled = if *this.release == 0
            && *this.streak < FLOOD_CHECK
            && matches!(this.end, End::Streaming)
            && this.tracker.is_some()
            && let Some(inner) = this.inner.as_mut().as_pin_mut()
        {
            let polled = inner.poll_frame(cx);
            // A data frame is observed where the inner body put it, before anything moves it
            // (moving it first would read it back while the inner body's stores are still in
            // flight); it is moved once, on its way out.
            let pass = match &polled {
                Poll::Ready(Some(Ok(frame))) => {
                    frame.data_ref().map(|data| on_data(&mut this, data))
                }
                _ => None,
            };
            match polled {
                Poll::Ready(Some(Ok(frame))) => {
                    *this.streak += 1;
                    match pass {
                        Some(Pass::Now) => {
                            return Poll::Ready(Some(Ok(frame.map_data(Chunk::Inner))));
                        }
                        Some(Pass::HoldBack(pending)) => {
                            if let Ok(data) = frame.into_data() {
                                hold(this.held, this.held_len, this.release, data, pending);
                            }
                            Polled::Nothing
                        }
                        None => Polled::NonData(frame),
                    }
                }
                Poll::Ready(Some(Err(e))) => Polled::Error(e),
                Poll::Ready(None) => Polled::End,
                Poll::Pending => Polled::Pending,
            }
        } else {
            Polled::Nothing
        };
        poll_general(self, cx, polled)
    }

    fn is_end_stream(&self) -> bool {
        if self.release > 0 || self.held_len > 0 {
            return false;
        }
        match &self.end {
            End::Finished => true,
            End::Streaming => self.inner.as_ref().is_none_or(Body::is_end_stream),
            _ => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        let queued = self.held_len as u64;
        let mut hint = match (&self.end, &self.inner) {
            (End::Streaming, Some(inner)) => inner.size_hint(),
            (End::Local(b), _) => SizeHint::with_exact(b.len() as u64),
            _ => SizeHint::with_exact(0),
        };
        if queued > 0 {
            let lower = hint.lower() + queued;
            let upper = hint.upper().map(|u| u + queued);
            hint = SizeHint::new();
            hint.set_lower(lower);
            if let Some(u) = upper {
                hint.set_upper(u);
            }
        }
        hint
    }
}

/// What `poll_frame` returns.
type PollFrame<D> = Poll<Option<Result<Frame<Chunk<D>>, BoxError>>>;

/// What the steady-state path of `poll_frame` polled from the inner body and left to the
/// general path.
enum Polled<B: Body> {
    /// Nothing polled (or a data frame already handled).
    Nothing,
    /// A frame that is not data.
    NonData(Frame<B::Data>),
    /// An error.
    Error(B::Error),
    /// The end of the inner body.
    End,
    /// `Pending`.
    Pending,
}

/// The general path of `poll_frame`: first what the steady-state path polled, then the loop.
#[inline(never)]
fn poll_general<B>(
    body: Pin<&mut SseIdleTimeoutBody<B>>,
    cx: &mut Context<'_>,
    polled: Polled<B>,
) -> PollFrame<B::Data>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut this = body.project();
    match polled {
        Polled::Nothing => {}
        Polled::NonData(frame) => on_non_data(&mut this, frame),
        Polled::Error(e) => return on_error(&mut this, e),
        Polled::End => on_end(&mut this),
        Polled::Pending => {
            *this.streak = 0;
            if let Some(ready) = wait(&mut this, cx) {
                return ready;
            }
        }
    }
    poll_tracked(&mut this, cx)
}

/// Deadlines are also checked after this many frames delivered in a row without waiting.
const FLOOD_CHECK: u8 = 32;

/// The body with a tracker, in general: hold-back queue, end states, flood check and timers.
fn poll_tracked<B>(this: &mut BodyProj<'_, B>, cx: &mut Context<'_>) -> PollFrame<B::Data>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    loop {
        // 1. Bytes released from the hold-back queue go out first, in order.
        if *this.release > 0 {
            let Some(front) = this.held.front_mut() else {
                *this.release = 0;
                continue;
            };
            let len = front.remaining();
            let chunk = if len <= *this.release {
                match this.held.pop_front() {
                    Some(d) => Chunk::Inner(d),
                    None => continue,
                }
            } else {
                Chunk::Local(front.copy_to_bytes(*this.release))
            };
            let n = chunk.remaining();
            *this.release -= n.min(*this.release);
            *this.held_len -= n.min(*this.held_len);
            if n == 0 && *this.release == 0 {
                continue;
            }
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }

        // 2. After the inner body: what is left to say.
        if !matches!(this.end, End::Streaming) {
            return Poll::Ready(match std::mem::replace(this.end, End::Finished) {
                End::Local(bytes) => Some(Ok(Frame::data(Chunk::Local(bytes)))),
                End::Trailers(t) => Some(Ok(Frame::trailers(t))),
                End::Error(e) => Some(Err(e)),
                End::Streaming | End::Finished => None,
            });
        }
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            *this.end = End::Finished;
            continue;
        };

        // 3. Flood check: deadlines are checked when the body has to wait, and also after
        //    every FLOOD_CHECK frames delivered in a row, so that an upstream that always has a
        //    frame ready (a flood of keepalives) cannot hold a timer off.
        if *this.streak >= FLOOD_CHECK {
            *this.streak = 0;
            if this.timers.active() {
                let now = Instant::now();
                this.timers.stamp(now);
                if let Some((deadline, phase, limit)) = this.timers.next()
                    && now >= deadline
                {
                    this.inner.set(None);
                    this.sleep.set(None);
                    *this.end = expire(this, phase, limit, now);
                    continue;
                }
            }
        }

        // 4. A frame that is ready wins over any timer.
        match inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                *this.streak = this.streak.saturating_add(1);
                match frame.data_ref().map(|data| on_data(this, data)) {
                    Some(Pass::Now) => return Poll::Ready(Some(Ok(frame.map_data(Chunk::Inner)))),
                    Some(Pass::HoldBack(pending)) => {
                        if let Ok(data) = frame.into_data() {
                            hold(this.held, this.held_len, this.release, data, pending);
                        }
                    }
                    None => on_non_data(this, frame),
                }
            }
            Poll::Ready(Some(Err(e))) => return on_error(this, e),
            Poll::Ready(None) => on_end(this),
            Poll::Pending => {
                *this.streak = 0;
                // 5. Nothing ready: the body waits.
                if let Some(ready) = wait(this, cx) {
                    return ready;
                }
            }
        }
    }
}

/// What to do with a data frame once observed.
enum Pass {
    /// It ends on an event boundary and nothing is held back: pass it on.
    Now,
    /// Queue it behind the bytes held back; its last `.0` bytes are part of an event not
    /// complete yet.
    HoldBack(usize),
}

/// A data frame from the inner body: runs the tracker and the timers' bookkeeping on it, and
/// says whether it may pass at once.
#[inline(always)]
fn on_data<B: Body>(this: &mut BodyProj<'_, B>, data: &B::Data) -> Pass {
    let Some(tracker) = this.tracker.as_mut() else {
        return Pass::Now;
    };
    let obs = tracker.observe(data);
    let t = &mut *this.timers;
    if obs.progress() || (t.keepalive_resets_idle && obs.keepalives > 0) {
        t.unstamped = true;
    }
    if obs.first_token {
        t.first_token_seen = true;
        t.first_token = None;
    }
    if obs.done {
        *this.done = true;
    }
    if obs.scan_error.is_some() {
        // An event over the scanner's cap: the tracker scans nothing more. Stop holding back
        // (what is held goes out below) and count any data as progress from now on.
        *this.hold_back = false;
        *this.blind = true;
    }
    if *this.blind {
        blind_progress(t, data);
    }
    let pending = if *this.hold_back {
        tracker.pending_bytes()
    } else {
        0
    };
    if *this.held_len == 0 && *this.release == 0 && pending == 0 {
        // The frame ends on an event boundary (what LLM servers send).
        Pass::Now
    } else {
        Pass::HoldBack(pending)
    }
}

/// Blind (after a scan error), any data is progress.
#[cold]
fn blind_progress<D: Buf>(t: &mut Timers, data: &D) {
    if data.remaining() > 0 {
        t.unstamped = true;
        t.first_token_seen = true;
        t.first_token = None;
    }
}

/// Queues `data` behind the bytes held back and releases all but the last `pending` bytes.
#[inline(never)]
fn hold<D: Buf>(
    held: &mut VecDeque<D>,
    held_len: &mut usize,
    release: &mut usize,
    data: D,
    pending: usize,
) {
    *held_len += data.remaining();
    held.push_back(data);
    *release = held_len.saturating_sub(pending);
}

/// A frame that is not data: trailers end the data (what was held back is released, then they
/// are sent); anything else is skipped.
#[inline(never)]
fn on_non_data<B: Body>(this: &mut BodyProj<'_, B>, frame: Frame<B::Data>) {
    let Ok(trailers) = frame.into_trailers() else {
        return;
    };
    if let Some(tracker) = this.tracker.as_mut() {
        tracker.observe_trailers(&trailers);
    }
    this.inner.set(None);
    this.sleep.set(None);
    *this.release = *this.held_len;
    *this.end = End::Trailers(trailers);
}

/// An error from the inner body: passed on, and the body ends.
#[inline(never)]
fn on_error<B>(this: &mut BodyProj<'_, B>, e: B::Error) -> PollFrame<B::Data>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    this.inner.set(None);
    this.sleep.set(None);
    this.held.clear();
    *this.held_len = 0;
    *this.end = End::Finished;
    Poll::Ready(Some(Err(e.into())))
}

/// The upstream ended: whatever it sent goes to the client, even a truncated event (the
/// upstream cut it, not this layer).
#[inline(never)]
fn on_end<B: Body>(this: &mut BodyProj<'_, B>) {
    if let Some(tracker) = this.tracker.as_mut() {
        tracker.finish();
    }
    this.inner.set(None);
    this.sleep.set(None);
    *this.release = *this.held_len;
    *this.end = End::Finished;
}

/// Nothing ready: the body waits. Stamps the start of the gap if a progress event was
/// delivered since the last wait, then checks the next deadline, arming the sleep lazily.
/// `Some(Pending)` to wait; `None` when the caller should loop (the sleep fired early, or a
/// timer expired and `end` says what follows).
#[inline(never)]
fn wait<B: Body>(this: &mut BodyProj<'_, B>, cx: &mut Context<'_>) -> Option<PollFrame<B::Data>> {
    if !this.timers.active() {
        return Some(Poll::Pending);
    }
    let registered = this.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
    if !this.timers.unstamped {
        // No progress since the last wait, so the deadline has not moved: if the sleep is
        // armed no later than it, has not fired and was registered with this task's waker,
        // there is nothing to do, not even a clock read (a wait after a keepalive).
        let Some((deadline, _, _)) = this.timers.next() else {
            return Some(Poll::Pending);
        };
        if registered
            && let Some(s) = this.sleep.as_mut().as_pin_mut()
            && s.deadline() <= deadline
            && !s.is_elapsed()
        {
            return Some(Poll::Pending);
        }
    }
    let now = Instant::now();
    this.timers.stamp(now);
    let Some((deadline, phase, limit)) = this.timers.next() else {
        return Some(Poll::Pending);
    };
    if now < deadline {
        // The sleep is armed no later than the deadline, has not fired and was registered
        // with this task's waker: no need to poll it again (a wait between tokens).
        if registered
            && let Some(s) = this.sleep.as_mut().as_pin_mut()
            && s.deadline() <= deadline
            && now < s.deadline()
        {
            return Some(Poll::Pending);
        }
        if arm(this.sleep.as_mut(), deadline, cx).is_pending() {
            if !registered {
                *this.waker = Some(cx.waker().clone());
            }
            return Some(Poll::Pending);
        }
        // The sleep fired: re-check against a fresh clock (it may have been armed for an
        // earlier deadline that has since moved).
        if Instant::now() < deadline {
            return None;
        }
    }
    this.inner.set(None);
    this.sleep.set(None);
    let now = Instant::now();
    *this.end = expire(this, phase, limit, now);
    None
}

/// Ends the stream for `phase`. The caller has dropped the inner body; this drops the
/// held-back bytes of the incomplete event, reports the end reason and returns what the client
/// gets.
fn expire<B: Body>(this: &mut BodyProj<'_, B>, phase: Phase, limit: Duration, now: Instant) -> End {
    this.held.clear();
    *this.held_len = 0;
    *this.release = 0;
    if *this.done {
        // The stream already said it was complete; anything after that would be noise.
        return End::Finished;
    }
    let events = this.tracker.as_ref().map_or(0, StreamTracker::events);
    let mut err = TimeoutError::new(
        phase,
        limit,
        now.saturating_duration_since(this.timers.start),
    )
    .with_events(events);
    if let Some(last) = this.timers.last_progress {
        err = err.with_since_last_event(now.saturating_duration_since(last));
    }
    if let Some(report) = this.report.take() {
        report.report(phase.end_reason());
    }
    tracing::debug!(phase = phase.as_str(), limit = ?limit, events, "stream timeout");
    let wire = this
        .tracker
        .as_ref()
        .map_or(Wire::Opaque, StreamTracker::wire);
    let info = err.error_info();
    let mode = match *this.on_expiry {
        // Blind, the client may hold part of an event: an in-band event would land inside it.
        OnExpiry::Auto | OnExpiry::InBand if *this.blind && wire != Wire::Grpc => {
            OnExpiry::BodyError
        }
        OnExpiry::Auto | OnExpiry::InBand => match render::in_band(wire, &info) {
            Some(bytes) => return End::Local(bytes),
            None if wire == Wire::Grpc => OnExpiry::GrpcTrailers,
            None => OnExpiry::BodyError,
        },
        other => other,
    };
    match mode {
        OnExpiry::GrpcTrailers => End::Trailers(render::grpc_trailers(info.grpc, &info.message)),
        _ => End::Error(Box::new(err)),
    }
}
