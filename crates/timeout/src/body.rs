//! [`SseIdleTimeoutBody`]: the response body that runs the first-token, idle and total timers.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tailguard_core::render::{self, RenderError};
use tailguard_core::{BoxError, Chunk, EndReport, StreamTracker, TimeoutError, Wire};
use tokio::time::Instant;

use crate::held::HeldBack;
use crate::layer::{Config, FirstTokenClock, OnExpiry, Timeouts};
use crate::timers::{Expired, Timers};

/// Deadlines are also checked after this many frames delivered in a row without waiting, so
/// that an upstream that always has a frame ready (a flood of keepalives) cannot hold a timer
/// off.
const FLOOD_CHECK: u8 = 32;

/// What the body yields once the inner body is gone.
#[derive(Debug)]
enum End {
    /// A rendered in-band error event, then the end.
    Local(Bytes),
    /// Trailers (the inner body's, or rendered gRPC ones), then the end.
    Trailers(HeaderMap),
    /// A body error, then the end.
    Error(BoxError),
    /// Nothing more.
    Finished,
}

impl End {
    /// The next frame, leaving `Finished`.
    fn take<D: Buf>(&mut self) -> Option<Result<Frame<Chunk<D>>, BoxError>> {
        match std::mem::replace(self, End::Finished) {
            End::Local(bytes) => Some(Ok(Frame::data(Chunk::Local(bytes)))),
            End::Trailers(t) => Some(Ok(Frame::trailers(t))),
            End::Error(e) => Some(Err(e)),
            End::Finished => None,
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
        // The inner body, until it ends or a timer expires; then `end` says what follows.
        #[pin]
        inner: Option<B>,
        #[pin]
        timers: Timers,
        tracker: Option<StreamTracker>,
        held: HeldBack<B::Data>,
        // Frames delivered in a row without waiting (for the flood check).
        streak: u8,
        hold_back: bool,
        // The tracker stopped scanning (an event over its cap).
        blind: bool,
        // The stream said it was complete.
        done: bool,
        on_expiry: OnExpiry,
        report: Option<EndReport>,
        end: End,
    }
}

impl<B: Body> std::fmt::Debug for SseIdleTimeoutBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SseIdleTimeoutBody")
            .field("timers", &self.timers)
            .field("held", &self.held.len())
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl<B: Body> SseIdleTimeoutBody<B> {
    fn new(inner: Option<B>, timers: Timers, tracker: Option<StreamTracker>, end: End) -> Self {
        SseIdleTimeoutBody {
            inner,
            timers,
            tracker,
            held: HeldBack::new(),
            streak: 0,
            hold_back: false,
            blind: false,
            done: false,
            on_expiry: OnExpiry::Auto,
            report: None,
            end,
        }
    }

    /// A body that yields `bytes` and ends (the layer's own error responses).
    pub(crate) fn local(bytes: Bytes) -> Self {
        let now = Instant::now();
        let timers = Timers::new(&Timeouts::new(), now, now, false);
        let end = if bytes.is_empty() {
            End::Finished
        } else {
            End::Local(bytes)
        };
        Self::new(None, timers, None, end)
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
        let first_token_from = match config.first_token_clock {
            FirstTokenClock::FromHeaders => Instant::now(),
            _ => start,
        };
        let timers = Timers::new(t, start, first_token_from, config.keepalive_resets_idle);
        let tracker = timers
            .active()
            .then(|| StreamTracker::new(&config.dialect, headers));
        let mut body = Self::new(Some(inner), timers, tracker, End::Finished);
        body.hold_back = body.tracker.is_some() && config.on_expiry != OnExpiry::BodyError;
        body.on_expiry = config.on_expiry;
        body.report = report;
        body
    }
}

impl<B> Body for SseIdleTimeoutBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Chunk<B::Data>;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        loop {
            // Bytes released from the hold-back queue go out first, in order.
            if let Some(chunk) = this.held.next_released() {
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            // After the inner body: what is left to say.
            if this.inner.is_none() {
                return Poll::Ready(this.end.take());
            }
            if *this.streak >= FLOOD_CHECK {
                *this.streak = 0;
                if this.timers.active()
                    && let Some(expired) = this.timers.as_mut().check(Instant::now())
                {
                    expire(&mut this, expired);
                    continue;
                }
            }
            let Some(inner) = this.inner.as_mut().as_pin_mut() else {
                continue;
            };
            // A frame that is ready wins over any timer; the timers act when the body waits.
            match inner.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    *this.streak = this.streak.saturating_add(1);
                    match frame.into_data() {
                        Ok(data) => {
                            if let Some(data) = on_data(&mut this, data) {
                                return Poll::Ready(Some(Ok(Frame::data(Chunk::Inner(data)))));
                            }
                        }
                        Err(frame) => on_non_data(&mut this, frame),
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    this.held.clear();
                    finish(&mut this, End::Finished);
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Ready(None) => on_end(&mut this),
                Poll::Pending => {
                    *this.streak = 0;
                    let expired = ready!(this.timers.as_mut().poll_expired(cx));
                    expire(&mut this, expired);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if !self.held.is_empty() {
            return false;
        }
        match &self.inner {
            Some(inner) => inner.is_end_stream(),
            None => matches!(self.end, End::Finished),
        }
    }

    fn size_hint(&self) -> SizeHint {
        let hint = match (&self.inner, &self.end) {
            (Some(inner), _) => inner.size_hint(),
            (None, End::Local(b)) => SizeHint::with_exact(b.len() as u64),
            (None, _) => SizeHint::with_exact(0),
        };
        let queued = self.held.len() as u64;
        if queued == 0 {
            return hint;
        }
        let mut with_queued = SizeHint::new();
        with_queued.set_lower(hint.lower().saturating_add(queued));
        if let Some(upper) = hint.upper() {
            with_queued.set_upper(upper.saturating_add(queued));
        }
        with_queued
    }
}

/// A data frame from the inner body: runs the tracker and the timers' bookkeeping on it, and
/// returns it when it may pass at once (it ends on an event boundary and nothing is held back,
/// what LLM servers send); otherwise it is queued behind the bytes held back.
fn on_data<B: Body>(this: &mut BodyProj<'_, B>, data: B::Data) -> Option<B::Data> {
    let Some(tracker) = this.tracker.as_mut() else {
        return Some(data);
    };
    let obs = tracker.observe(&data);
    this.timers.as_mut().observe(&obs);
    *this.done |= obs.done;
    if obs.scan_error.is_some() {
        // An event over the scanner's cap: the tracker scans nothing more. Stop holding back
        // (what is held goes out now) and count any data as progress from now on.
        *this.hold_back = false;
        *this.blind = true;
    }
    if *this.blind && data.remaining() > 0 {
        this.timers.as_mut().observe_unscanned();
    }
    let pending = if *this.hold_back {
        tracker.pending_bytes()
    } else {
        0
    };
    if this.held.is_empty() && pending == 0 {
        return Some(data);
    }
    this.held.push(data, pending);
    None
}

/// A frame that is not data: trailers end the data (what was held back is released, then they
/// are sent); anything else is skipped.
fn on_non_data<B: Body>(this: &mut BodyProj<'_, B>, frame: Frame<B::Data>) {
    let Ok(trailers) = frame.into_trailers() else {
        return;
    };
    if let Some(tracker) = this.tracker.as_mut() {
        tracker.observe_trailers(&trailers);
    }
    this.held.release_all();
    finish(this, End::Trailers(trailers));
}

/// The upstream ended: whatever it sent goes to the client, even a truncated event (the
/// upstream cut it, not this layer).
fn on_end<B: Body>(this: &mut BodyProj<'_, B>) {
    if let Some(tracker) = this.tracker.as_mut() {
        tracker.finish();
    }
    this.held.release_all();
    finish(this, End::Finished);
}

/// Drops the inner body (which cancels the upstream request) and its timers; `end` follows
/// whatever is released from the hold-back queue.
fn finish<B: Body>(this: &mut BodyProj<'_, B>, end: End) {
    this.inner.set(None);
    this.timers.as_mut().stop();
    *this.end = end;
}

/// Ends the stream for the timer that expired: drops the inner body (first, as for any end)
/// and the held-back bytes of the incomplete event, reports the end reason and sets what the
/// client gets.
fn expire<B: Body>(this: &mut BodyProj<'_, B>, expired: Expired) {
    finish(this, End::Finished);
    this.held.clear();
    if *this.done {
        // The stream already said it was complete; anything after that would be noise.
        return;
    }
    let Expired { phase, limit } = expired;
    let now = Instant::now();
    let events = this.tracker.as_ref().map_or(0, StreamTracker::events);
    let elapsed = now.saturating_duration_since(this.timers.start());
    let mut err = TimeoutError::new(phase, limit, elapsed).with_events(events);
    if let Some(last) = this.timers.last_progress() {
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
    *this.end = ending(err, wire, *this.on_expiry, *this.blind);
}

/// How a stream of `wire` ends on `err`, per `on_expiry`. `blind`: the tracker stopped
/// scanning, so the client may hold part of an event and an in-band event could land inside
/// it.
fn ending(err: TimeoutError, wire: Wire, on_expiry: OnExpiry, blind: bool) -> End {
    let info = err.error_info();
    let mode = match on_expiry {
        OnExpiry::Auto | OnExpiry::InBand if blind && wire != Wire::Grpc => OnExpiry::BodyError,
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
