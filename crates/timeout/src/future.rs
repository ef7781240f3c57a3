//! The response future of [`SseIdleTimeout`](crate::SseIdleTimeout).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;
use tailguard_core::progress::StreamProgress;
use tailguard_core::render::{self, RenderError};
use tailguard_core::{EndReport, Mode, Phase, Respond, TimeoutError};
use tokio::time::Instant;

use crate::body::SseIdleTimeoutBody;
use crate::layer::{Config, FirstTokenClock, Timeouts};
use crate::timers::Clock;

pin_project! {
    /// The response future of [`SseIdleTimeout`](crate::SseIdleTimeout).
    ///
    /// Runs the head timer, and the first-token and total timers where they start at `call`.
    /// The inner future is polled before the timer, so response headers that are ready when the
    /// future is polled win over a timer that expires at the same instant. On expiry the inner
    /// future is dropped at once, and the caller gets a rendered 504 (response mode,
    /// [`Respond`]) or a [`TimeoutError`] (error mode, [`Fail`](crate::Fail)).
    pub struct ResponseFuture<F, M = Respond> {
        #[pin]
        inner: Option<F>,
        #[pin]
        clock: Clock,
        phase: Phase,
        config: Arc<Config>,
        timeouts: Timeouts,
        start: Instant,
        report: Option<EndReport>,
        progress: StreamProgress,
        grpc: bool,
        _mode: PhantomData<fn() -> M>,
    }
}

impl<F, M> ResponseFuture<F, M> {
    pub(crate) fn new(
        inner: F,
        config: Arc<Config>,
        timeouts: Timeouts,
        start: Instant,
        report: Option<EndReport>,
        progress: StreamProgress,
        grpc: bool,
    ) -> Self {
        let (phase, clock) = head_clock(&timeouts, config.first_token_clock, start);
        ResponseFuture {
            inner: Some(inner),
            clock,
            phase,
            config,
            timeouts,
            start,
            report,
            progress,
            grpc,
            _mode: PhantomData,
        }
    }
}

impl<F, M> fmt::Debug for ResponseFuture<F, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("timeouts", &self.timeouts)
            .field("start", &self.start)
            .field("done", &self.inner.is_none())
            .finish_non_exhaustive()
    }
}

/// The clock before headers and the phase it belongs to: the earliest deadline of head, first
/// token (when it starts at `call`) and total; on a tie the more specific phase is named (head,
/// then first token, then total).
fn head_clock(t: &Timeouts, clock: FirstTokenClock, start: Instant) -> (Phase, Clock) {
    let first_token = t.first_token.filter(|_| clock == FirstTokenClock::FromCall);
    [
        (Phase::Head, t.head),
        (Phase::FirstToken, first_token),
        (Phase::Total, t.total),
    ]
    .into_iter()
    .map(|(phase, limit)| (phase, Clock::new(limit, start)))
    .filter_map(|(phase, clock)| Some((clock.running()?.0, phase, clock)))
    .min_by_key(|(at, _, _)| *at)
    .map_or(
        (Phase::Head, Clock::new(None, start)),
        |(_, phase, clock)| (phase, clock),
    )
}

/// Why the head phase ended without a response from the inner service.
enum Escape<E> {
    /// The inner service failed.
    Inner(E),
    /// A timer expired; `grpc` says whether the request was a gRPC one.
    Timeout(TimeoutError, bool),
}

impl<F, M> ResponseFuture<F, M> {
    /// Polls the inner future and the head clock: the response, the inner error, or an expiry.
    fn poll_head<B, E>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<SseIdleTimeoutBody<B>>, Escape<E>>>
    where
        F: Future<Output = Result<Response<B>, E>>,
        B: Body,
    {
        let mut this = self.project();
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            panic!("ResponseFuture polled after completion");
        };
        if let Poll::Ready(res) = inner.poll(cx) {
            this.inner.set(None);
            this.clock.stop();
            let (parts, body) = res.map_err(Escape::Inner)?.into_parts();
            let body = SseIdleTimeoutBody::streaming(
                body,
                &parts,
                this.config,
                this.timeouts,
                *this.start,
                this.report.take(),
                this.progress,
            );
            return Poll::Ready(Ok(Response::from_parts(parts, body)));
        }
        let limit = match this.clock.expired(Instant::now()) {
            Some(limit) => limit,
            None => ready!(this.clock.as_mut().poll_expired(cx)),
        };
        // Expired: cancel the upstream at once.
        this.inner.set(None);
        this.clock.stop();
        let phase = *this.phase;
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(*this.start);
        // Every limit before headers is measured from the request's start.
        let err = TimeoutError::new(phase, limit, elapsed).with_measured(elapsed);
        if let Some(report) = this.report.take() {
            report.report(phase.end_reason());
        }
        tracing::debug!(phase = phase.as_str(), limit = ?limit, "timeout before response headers");
        Poll::Ready(Err(Escape::Timeout(err, *this.grpc)))
    }
}

impl<F, B, E, M> Future for ResponseFuture<F, M>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
    M: Mode<E>,
{
    type Output = Result<Response<SseIdleTimeoutBody<B>>, M::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(match ready!(self.poll_head(cx)) {
            Ok(res) => Ok(res),
            Err(Escape::Inner(e)) => Err(M::inner(e)),
            Err(Escape::Timeout(err, grpc)) => M::own(err, |err| {
                render::respond(&err.error_info(), grpc, |json| {
                    SseIdleTimeoutBody::local(json.unwrap_or_default())
                })
            }),
        })
    }
}
