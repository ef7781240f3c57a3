//! [`SseIdleTimeoutBody`]: the response body that runs the first-token, idle and total timers
//! and sees that the stream ends cleanly.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::response::Parts;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tailguard_core::headers::grpc_status;
use tailguard_core::progress::{Reading, StreamProgress};
use tailguard_core::{BoxError, Dialect, EndReport, Framing, TimeoutError, Wire};
use tokio::time::Instant;

use crate::ending::{End, Failure};
use crate::held::HeldBack;
use crate::layer::{Config, FirstTokenClock, OnExpiry, Timeouts};
use crate::shutdown::Shutdown;
use crate::timers::{Expired, Timers};

/// Deadlines are also checked after this many frames delivered in a row without waiting, so
/// that an upstream that always has a frame ready (a flood of keepalives) cannot hold a timer
/// off.
const FLOOD_CHECK: u8 = 32;

pin_project! {
    /// The response body of [`SseIdleTimeout`](crate::SseIdleTimeout).
    ///
    /// Passes the inner body's frames through untouched, runs the first-token, idle
    /// and total timers on the events it finds in them, and when a timer expires or the upstream
    /// fails (a body error, a stream cut short of its terminal event, an event over the
    /// scanner's cap, junk its dialect cannot carry: see
    /// [`Class::Malformed`](tailguard_core::Class::Malformed)) drops the inner body and ends as
    /// [`OnExpiry`] says; the frame with the junk is not passed on. Error responses
    /// produced by the layer itself (a 504 before headers) are bodies of this type too. The data
    /// type is the inner body's: bytes the layer produces itself (an in-band error event, the
    /// released part of a held-back frame) are `B::Data::from(bytes)`, so `B::Data` must be
    /// `From<Bytes>`, which every hyper, axum and tonic body's data is.
    ///
    /// Forwards `size_hint` (plus any bytes it holds back), `is_end_stream` (except that a
    /// stream cut short is not at its end until the layer has ended it) and trailers. A
    /// timeout ends the body earlier than the inner body's size hint said, as any timeout does.
    #[project = BodyProj]
    pub struct SseIdleTimeoutBody<B: Body> {
        // The inner body, until it ends or the layer ends the stream; then `end` says what
        // follows.
        #[pin]
        inner: Option<B>,
        #[pin]
        timers: Timers,
        tracker: Option<Reading>,
        held: HeldBack<B::Data>,
        // Frames delivered in a row without waiting (for the flood check).
        streak: u8,
        hold_back: bool,
        // The stream must end with its terminal event.
        require_terminal: bool,
        // The stream said it ended: its terminal event (`[DONE]`, `message_stop`, a gRPC
        // status), or an in-band error event of the upstream's own.
        terminal: bool,
        on_expiry: OnExpiry,
        report: Option<EndReport>,
        // The layer's shutdown signal, when it has one.
        shutdown: Option<Shutdown>,
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
    fn new(inner: Option<B>, timers: Timers, tracker: Option<Reading>, end: End) -> Self {
        SseIdleTimeoutBody {
            inner,
            timers,
            tracker,
            held: HeldBack::new(),
            streak: 0,
            hold_back: false,
            require_terminal: false,
            terminal: false,
            on_expiry: OnExpiry::Auto,
            report: None,
            shutdown: None,
            end,
        }
    }

    /// A body that yields `bytes` and ends (the layer's own error responses).
    pub(crate) fn local(bytes: Bytes) -> Self {
        let now = Instant::now();
        let timers = Timers::new(&Timeouts::new(), (now, now), now, false);
        let end = if bytes.is_empty() {
            End::Finished
        } else {
            End::Local(bytes)
        };
        Self::new(None, timers, None, end)
    }

    /// The body of a response whose head (`parts`) arrived now; a watched stream is read
    /// through the request's `progress` record (this layer reads it, unless a layer inside
    /// already does).
    ///
    /// The stream is watched when a timer runs, or when the response is a stream (a 2xx whose
    /// `content-type` says SSE, NDJSON or gRPC) whose ending can be checked; a non-streamed
    /// answer or an error document without timers passes through untouched.
    pub(crate) fn streaming(
        inner: B,
        parts: &Parts,
        config: &Config,
        t: &Timeouts,
        start: Instant,
        report: Option<EndReport>,
        progress: &StreamProgress,
    ) -> Self {
        let now = Instant::now();
        let first_token_from = match config.first_token_clock {
            FirstTokenClock::FromHeaders => now,
            _ => start,
        };
        let clocks = (start, now);
        let timers = Timers::new(t, clocks, first_token_from, config.keepalive_resets_idle);
        let headers = &parts.headers;
        let dialect = config.dialect.resolve(headers);
        let stream = parts.status.is_success() && Dialect::Auto.resolve_stream(headers).is_some();
        let watch = timers.active() || (stream && dialect.framing() != Some(Framing::Bytes));
        let tracker = watch.then(|| progress.reading(&dialect, headers));
        let grpc = tracker.as_ref().is_some_and(|t| t.wire() == Wire::Grpc);
        let mut body = Self::new(Some(inner), timers, tracker, End::Finished);
        body.hold_back = body.tracker.is_some() && config.on_expiry != OnExpiry::BodyError;
        body.require_terminal =
            body.tracker.is_some() && stream && config.require_terminal_event(&dialect);
        // A trailers-only gRPC response carries its status in the headers.
        body.terminal = grpc && grpc_status(headers).is_some();
        body.on_expiry = config.on_expiry;
        body.report = report;
        body.shutdown = config.shutdown.as_ref().map(Shutdown::new);
        body
    }

    /// The stream must end with its terminal event and has not said it ended (yet).
    fn cut_short(&self) -> bool {
        self.require_terminal && !self.terminal
    }
}

impl<B> Body for SseIdleTimeoutBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
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
                if this.shutdown.as_ref().is_some_and(Shutdown::now) {
                    fail(&mut this, Failure::shutdown());
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
                                return Poll::Ready(Some(Ok(Frame::data(data))));
                            }
                        }
                        Err(frame) => on_non_data(&mut this, frame),
                    }
                }
                Poll::Ready(Some(Err(e))) => on_error(&mut this, e.into()),
                Poll::Ready(None) => on_end(&mut this, End::Finished),
                Poll::Pending => {
                    *this.streak = 0;
                    if let Poll::Ready(expired) = this.timers.as_mut().poll_expired(cx) {
                        expire(&mut this, expired);
                    } else if this.shutdown.as_mut().is_some_and(|s| s.poll_fired(cx)) {
                        fail(&mut this, Failure::shutdown());
                    } else {
                        return Poll::Pending;
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if !self.held.is_empty() {
            return false;
        }
        match &self.inner {
            // A stream cut short is not at its end: the layer still has its ending to send.
            Some(inner) => inner.is_end_stream() && !self.cut_short(),
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
fn on_data<B: Body>(this: &mut BodyProj<'_, B>, data: B::Data) -> Option<B::Data>
where
    B::Data: From<Bytes>,
{
    let Some(tracker) = this.tracker.as_mut() else {
        return Some(data);
    };
    let obs = tracker.observe(&data);
    this.timers.as_mut().observe(&obs, data.remaining());
    if obs.malformed {
        // Junk the dialect cannot carry (data that is not a JSON object): a client would fail
        // to decode it. The frame that carried it is dropped whole, with whatever else it held
        // (whole events before the junk: the scanner reports events, not their offsets, and
        // upstreams send about one event per frame; a terminal event after it, which the
        // client must not take for a clean end), and the stream ends in-band, unless an
        // earlier frame already said it ended.
        let failure = Failure::malformed(tracker.events());
        fail(this, failure);
        return None;
    }
    if obs.done
        && !obs.error
        && *this.require_terminal
        && !*this.terminal
        && tracker.finish_missing()
    {
        // A terminal event with no finish reason before it: the answer was cut short (an
        // interrupting server ends the running stream with a bare `[DONE]`), and an SDK would
        // return it as whole. What the frame holds before the terminal event goes on (when the
        // frame is one piece and nothing is held back; else the frame is dropped whole, as
        // junk is), and the stream ends in-band.
        let failure = Failure::interrupted(tracker.events());
        let whole = data.chunk().len() == data.remaining() && this.held.is_empty();
        let before = whole
            .then(|| terminal_start(tracker.wire(), data.chunk()))
            .flatten();
        fail(this, failure);
        let mut data = data;
        return before
            .filter(|&n| n > 0)
            .map(|n| B::Data::from(data.copy_to_bytes(n)));
    }
    *this.terminal |= obs.done || obs.error;
    if let Some(err) = obs.scan_error {
        // An event over the scanner's cap: the stream cannot be followed any further. The
        // frame that crossed the cap is dropped with the rest of the oversized event (it is
        // all part of it, unless one frame carries more than the cap).
        let failure = Failure::protocol(err, tracker.events());
        fail(this, failure);
        return None;
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

/// Where the terminal event (`[DONE]`, `message_stop`) starts in `bytes`: after the blank line
/// before its last mention, or at 0. Runs only on the frame that ends a stream cut short.
fn terminal_start(wire: Wire, bytes: &[u8]) -> Option<usize> {
    let needle: &[u8] = match wire {
        Wire::AnthropicSse => b"message_stop",
        _ => b"[DONE]",
    };
    let at = bytes.windows(needle.len()).rposition(|w| w == needle)?;
    let head = &bytes[..at];
    let after = |sep: &[u8]| {
        head.windows(sep.len())
            .rposition(|w| w == sep)
            .map(|i| i + sep.len())
    };
    Some(
        [&b"\n\n"[..], b"\r\r", b"\r\n\r\n"]
            .into_iter()
            .filter_map(after)
            .max()
            .unwrap_or(0),
    )
}

/// A frame that is not data: trailers end the data (a gRPC status in them, after whole
/// messages, is the stream's terminal event); anything else is skipped.
fn on_non_data<B: Body>(this: &mut BodyProj<'_, B>, frame: Frame<B::Data>) {
    let Ok(trailers) = frame.into_trailers() else {
        return;
    };
    let whole = this.tracker.as_ref().is_none_or(|t| t.pending_bytes() == 0);
    *this.terminal |= whole && grpc_status(&trailers).is_some();
    on_end(this, End::Trailers(trailers));
}

/// The upstream ended the data, followed by `end` (its trailers, or nothing). A stream that
/// must end with its terminal event and did not ends as a truncated one, without the bytes of
/// an unfinished event; one that did drops a fragment after it. A stream whose ending is not
/// checked goes to the client as the upstream sent it.
fn on_end<B: Body>(this: &mut BodyProj<'_, B>, end: End) {
    if let Some(tracker) = this.tracker.as_mut() {
        // Flushes what the framing allows (an NDJSON last line with no line end).
        let obs = tracker.finish();
        *this.terminal |= obs.done || obs.error;
    }
    if !*this.require_terminal {
        this.held.release_all();
    } else if !*this.terminal {
        let events = this.tracker.as_ref().map_or(0, Reading::events);
        fail(this, Failure::truncated(events));
        return;
    } else {
        this.held.clear();
    }
    finish(this, end);
}

/// The inner body failed. A watched stream ends with an in-band error (the client holds whole
/// events only, so it is always at an event boundary); otherwise the error passes through.
fn on_error<B: Body>(this: &mut BodyProj<'_, B>, err: BoxError) {
    match this.tracker.as_ref().map(Reading::events) {
        Some(events) => fail(this, Failure::transport(err, events)),
        None => finish(this, End::Error(err)),
    }
}

/// Drops the inner body (which cancels the upstream request) and its timers; `end` follows
/// whatever is released from the hold-back queue.
fn finish<B: Body>(this: &mut BodyProj<'_, B>, end: End) {
    this.inner.set(None);
    this.timers.as_mut().stop();
    *this.end = end;
}

/// A timer expired: ends the stream with a [`TimeoutError`] carrying the phase, the events seen
/// and the time since the last progress event.
fn expire<B: Body>(this: &mut BodyProj<'_, B>, expired: Expired) {
    let Expired {
        phase,
        limit,
        since,
    } = expired;
    let now = Instant::now();
    let events = this.tracker.as_ref().map_or(0, Reading::events);
    let elapsed = now.saturating_duration_since(this.timers.start());
    let mut err = TimeoutError::new(phase, limit, elapsed)
        .with_events(events)
        .with_measured(now.saturating_duration_since(since));
    if let Some(last) = this.timers.last_activity(phase) {
        err = err.with_since_last_event(now.saturating_duration_since(last));
    }
    fail(this, Failure::timeout(err));
}

/// Ends the stream for `failure`: drops the inner body (first, as for any end) and the
/// held-back bytes of the incomplete event, reports the end reason and sets what the client
/// gets. After the stream said it ended, it ends quietly instead: the client already has the
/// whole answer (or the upstream's own error).
fn fail<B: Body>(this: &mut BodyProj<'_, B>, failure: Failure) {
    finish(this, End::Finished);
    this.held.clear();
    if *this.terminal {
        return;
    }
    if let Some(report) = this.report.take() {
        report.report(failure.reason);
    }
    tracing::debug!(reason = %failure.reason, message = failure.message(), "stream ended");
    let wire = this.tracker.as_ref().map_or(Wire::Opaque, Reading::wire);
    *this.end = failure.into_end(wire, *this.on_expiry);
}
