//! The timers: a [`Clock`] for the response head, and the body's first-token, idle, liveness
//! and total deadlines ([`Timers`]), which one expired and the phase it is named by.
//!
//! Every waiter has one [`Wake`]: a [`Sleep`] armed lazily the first time it waits, for the
//! earliest deadline it guards. Progress only records a new, later deadline; the sleep is left
//! alone, and when it fires the time is compared with the deadline and the sleep re-armed for
//! it if progress moved it. One sleep per body, rather than one per timer, is one timer-wheel
//! entry to register and poll per wait instead of up to four.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tailguard_core::{Observation, Phase};
use tokio::time::{Instant, Sleep};

use crate::layer::Timeouts;

/// A running timer: the instant it runs out and the limit that instant came from.
type Running = Option<(Instant, Duration)>;

pin_project! {
    /// A sleep for a deadline that may move, armed on the first wait.
    #[derive(Debug, Default)]
    pub(crate) struct Wake {
        #[pin]
        sleep: Option<Sleep>,
        // The waker the armed sleep was last polled with: until its deadline, polling it again
        // with the same one only registers that waker again. A body waits after almost every
        // frame; skipping that poll was ~9k instructions of a 50-token stream in the gateway.
        registered: Option<Waker>,
    }
}

impl Wake {
    /// `Ready` once `at` has passed (`now` is the current time).
    ///
    /// A sleep armed for an earlier instant is re-armed when it fires (progress moved the
    /// deadline); one armed for a later instant is re-armed at once (an earlier timer started).
    pub(crate) fn poll_until(
        self: Pin<&mut Self>,
        at: Instant,
        now: Instant,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        let mut this = self.project();
        match this.sleep.as_mut().as_pin_mut() {
            None => this.sleep.set(Some(tokio::time::sleep_until(at))),
            Some(sleep) if sleep.deadline() > at => sleep.reset(at),
            Some(sleep) => {
                let fresh = this
                    .registered
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()));
                if fresh && now < sleep.deadline() {
                    return Poll::Pending;
                }
            }
        }
        let Some(mut sleep) = this.sleep.as_pin_mut() else {
            return Poll::Pending;
        };
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                *this.registered = Some(cx.waker().clone());
                return Poll::Pending;
            }
            if Instant::now() >= at {
                return Poll::Ready(());
            }
            sleep.as_mut().reset(at);
        }
    }

    /// Drops the sleep.
    pub(crate) fn stop(self: Pin<&mut Self>) {
        let mut this = self.project();
        this.sleep.set(None);
        *this.registered = None;
    }
}

pin_project! {
    /// One timer: the deadline it runs to, the limit that deadline came from, and its sleep.
    #[derive(Debug)]
    pub(crate) struct Clock {
        running: Running,
        #[pin]
        wake: Wake,
    }
}

impl Clock {
    /// A clock of `limit` running from `from`; stopped without a limit, or with one too far out
    /// to be an [`Instant`] (a header can carry any number): that is no limit.
    pub(crate) fn new(limit: Option<Duration>, from: Instant) -> Self {
        Clock {
            running: deadline(limit, from),
            wake: Wake::default(),
        }
    }

    /// The deadline and its limit, while the clock runs.
    pub(crate) fn running(&self) -> Running {
        self.running
    }

    /// The limit, if the clock has run out at `now`.
    pub(crate) fn expired(&self, now: Instant) -> Option<Duration> {
        self.running
            .and_then(|(at, limit)| (now >= at).then_some(limit))
    }

    /// Stops the clock and drops its sleep.
    pub(crate) fn stop(self: Pin<&mut Self>) {
        let this = self.project();
        *this.running = None;
        this.wake.stop();
    }

    /// Waits for the deadline; `Ready` with the limit once it has passed.
    pub(crate) fn poll_expired(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Duration> {
        let this = self.project();
        let Some((at, limit)) = *this.running else {
            return Poll::Pending;
        };
        ready!(this.wake.poll_until(at, Instant::now(), cx));
        Poll::Ready(limit)
    }
}

fn deadline(limit: Option<Duration>, from: Instant) -> Running {
    let limit = limit?;
    Some((from.checked_add(limit)?, limit))
}

/// A timer that ran out: its phase, its limit, and when its clock started (the deadline less
/// the limit).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expired {
    pub(crate) phase: Phase,
    pub(crate) limit: Duration,
    pub(crate) since: Instant,
}

pin_project! {
    /// The timers of one response body.
    ///
    /// The first-token clock runs until the first token. The idle clock runs after it, over each
    /// gap between progress events; a gap starts the first time the body has to wait after a
    /// progress event, so time the client spends not reading never counts against it. The
    /// total clock runs from `call`. Keepalives are no progress unless configured so.
    #[derive(Debug)]
    pub(crate) struct Timers {
        start: Instant,
        idle_limit: Option<Duration>,
        liveness_limit: Option<Duration>,
        keepalive_resets_idle: bool,
        first_token_seen: bool,
        // A progress event was delivered and its gap has not started yet.
        progress: bool,
        // When the current gap between progress events started.
        last_progress: Option<Instant>,
        // Bytes were delivered and their gap has not started yet.
        bytes: bool,
        // When the current gap between any bytes started.
        last_bytes: Option<Instant>,
        first_token: Running,
        idle: Running,
        liveness: Running,
        total: Running,
        // Armed for the earliest of the four deadlines.
        #[pin]
        wake: Wake,
    }
}

impl Timers {
    /// The timers `t` of a request that started at `start` and whose headers arrived at
    /// `headers_at` (the liveness clock runs from there), the first-token clock running from
    /// `first_token_from`.
    pub(crate) fn new(
        t: &Timeouts,
        (start, headers_at): (Instant, Instant),
        first_token_from: Instant,
        keepalive_resets_idle: bool,
    ) -> Self {
        Timers {
            start,
            idle_limit: t.idle,
            liveness_limit: t.liveness,
            keepalive_resets_idle,
            first_token_seen: false,
            progress: false,
            last_progress: None,
            bytes: false,
            last_bytes: None,
            first_token: deadline(t.first_token, first_token_from),
            idle: None,
            liveness: deadline(t.liveness, headers_at),
            total: deadline(t.total, start),
            wake: Wake::default(),
        }
    }

    /// When the request started (`call`).
    pub(crate) fn start(&self) -> Instant {
        self.start
    }

    /// When the current gap guarded by `phase` started: between any bytes for the liveness
    /// timer, between progress events otherwise.
    pub(crate) fn last_activity(&self, phase: Phase) -> Option<Instant> {
        match phase {
            Phase::Liveness => self.last_bytes,
            _ => self.last_progress,
        }
    }

    /// Whether any timer can still expire.
    pub(crate) fn active(&self) -> bool {
        self.first_token.is_some()
            || self.idle_limit.is_some()
            || self.liveness.is_some()
            || self.total.is_some()
    }

    /// Records what the tracker found in a data frame of `bytes` bytes.
    pub(crate) fn observe(self: Pin<&mut Self>, obs: &Observation, bytes: usize) {
        let progress = obs.progress() || (self.keepalive_resets_idle && obs.keepalives > 0);
        self.record(progress, obs.first_token, bytes > 0);
    }

    fn record(self: Pin<&mut Self>, progress: bool, first_token: bool, bytes: bool) {
        let this = self.project();
        *this.progress |= progress;
        *this.bytes |= bytes;
        if first_token && !*this.first_token_seen {
            *this.first_token_seen = true;
            *this.first_token = None;
        }
    }

    /// Starts the gap after a progress event delivered since the last check, then names the
    /// timer that has run out at `now`, if any: the one with the earliest deadline, and on a tie
    /// the first of first token, idle, liveness and total. Bytes delivered since the last check
    /// restart the liveness clock the same way.
    pub(crate) fn check(self: Pin<&mut Self>, now: Instant) -> Option<Expired> {
        self.next(now).ok()?
    }

    /// [`check`](Self::check)'s work: `Ok` with the timer run out at `now`, if any, else `Err`
    /// with the earliest deadline still to come.
    fn next(mut self: Pin<&mut Self>, now: Instant) -> Result<Option<Expired>, Instant> {
        let this = self.as_mut().project();
        if std::mem::take(this.progress) {
            *this.last_progress = Some(now);
            if *this.first_token_seen {
                *this.idle = deadline(*this.idle_limit, now);
            }
        }
        if std::mem::take(this.bytes) {
            *this.last_bytes = Some(now);
            *this.liveness = deadline(*this.liveness_limit, now);
        }
        match self.earliest() {
            Some((phase, (at, limit))) if now >= at => Ok(Some(Expired {
                phase,
                limit,
                since: at.checked_sub(limit).unwrap_or(at),
            })),
            Some((_, (at, _))) => Err(at),
            None => Ok(None),
        }
    }

    /// The running timer with the earliest deadline; on a tie the first of first token, idle,
    /// liveness and total.
    fn earliest(&self) -> Option<(Phase, (Instant, Duration))> {
        [
            (Phase::FirstToken, self.first_token),
            (Phase::Idle, self.idle),
            (Phase::Liveness, self.liveness),
            (Phase::Total, self.total),
        ]
        .into_iter()
        .filter_map(|(phase, running)| Some((phase, running?)))
        .min_by_key(|(_, (at, _))| *at)
    }

    /// The body has to wait: checks the timers at the current time, then waits for the
    /// earliest deadline.
    pub(crate) fn poll_expired(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Expired> {
        if !self.active() {
            return Poll::Pending;
        }
        loop {
            let now = Instant::now();
            let at = match self.as_mut().next(now) {
                Ok(Some(expired)) => return Poll::Ready(expired),
                Ok(None) => return Poll::Pending,
                Err(at) => at,
            };
            ready!(self.as_mut().project().wake.poll_until(at, now, cx));
        }
    }

    /// Stops every timer (the inner body is gone).
    pub(crate) fn stop(self: Pin<&mut Self>) {
        let this = self.project();
        *this.first_token = None;
        *this.idle = None;
        *this.liveness = None;
        *this.total = None;
        this.wake.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn token() -> Observation {
        let mut obs = Observation::default();
        obs.events = 1;
        obs.tokens = 1;
        obs.first_token = true;
        obs
    }

    fn keepalive() -> Observation {
        let mut obs = Observation::default();
        obs.events = 1;
        obs.keepalives = 1;
        obs
    }

    #[tokio::test(start_paused = true)]
    async fn a_tie_names_the_per_phase_timer_and_the_earlier_deadline_wins() {
        let t0 = Instant::now();
        let t = Timeouts::new()
            .with_first_token(secs(5))
            .with_total(secs(5));
        let mut timers = std::pin::pin!(Timers::new(&t, (t0, t0), t0, false));
        assert!(timers.as_mut().check(t0 + secs(4)).is_none());
        let e = timers.as_mut().check(t0 + secs(5)).unwrap();
        assert_eq!((e.phase, e.limit), (Phase::FirstToken, secs(5)));

        let t = Timeouts::new().with_idle(secs(3)).with_total(secs(10));
        let mut timers = std::pin::pin!(Timers::new(&t, (t0, t0), t0, false));
        timers.as_mut().observe(&token(), 1);
        assert!(
            timers.as_mut().check(t0 + secs(8)).is_none(),
            "gap starts at 8 s"
        );
        let e = timers.as_mut().check(t0 + secs(12)).unwrap();
        assert_eq!(e.phase, Phase::Total, "10 s is before 8 s + 3 s");
    }

    #[tokio::test(start_paused = true)]
    async fn keepalives_start_no_gap_unless_configured() {
        let t0 = Instant::now();
        let t = Timeouts::new().with_idle(secs(2));
        for (resets, fires_at) in [(false, 3), (true, 4)] {
            let mut timers = std::pin::pin!(Timers::new(&t, (t0, t0), t0, resets));
            timers.as_mut().observe(&token(), 1);
            assert!(timers.as_mut().check(t0 + secs(1)).is_none());
            timers.as_mut().observe(&keepalive(), 1);
            assert!(timers.as_mut().check(t0 + secs(2)).is_none());
            let phase = timers.as_mut().check(t0 + secs(fires_at)).map(|e| e.phase);
            assert_eq!(phase, Some(Phase::Idle), "resets: {resets}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn any_bytes_reset_the_liveness_clock_but_not_the_idle_one() {
        let t0 = Instant::now();
        let t = Timeouts::new().with_idle(secs(10)).with_liveness(secs(2));
        // Headers at 1 s: the liveness clock runs from there.
        let mut timers = std::pin::pin!(Timers::new(&t, (t0, t0 + secs(1)), t0, false));
        assert!(timers.as_mut().check(t0 + secs(2)).is_none());
        timers.as_mut().observe(&token(), 1);
        assert!(timers.as_mut().check(t0 + secs(3)).is_none());
        // A keepalive at 4 s is no progress, but it is bytes: liveness now runs to 6 s.
        timers.as_mut().observe(&keepalive(), 12);
        assert!(timers.as_mut().check(t0 + secs(4)).is_none());
        // Half an event is bytes too (no event completed).
        timers.as_mut().observe(&Observation::default(), 5);
        assert!(timers.as_mut().check(t0 + secs(6)).is_none());
        let e = timers.as_mut().check(t0 + secs(8)).unwrap();
        assert_eq!((e.phase, e.limit), (Phase::Liveness, secs(2)));
        assert_eq!(timers.last_activity(Phase::Liveness), Some(t0 + secs(6)));
        assert_eq!(timers.last_activity(Phase::Idle), Some(t0 + secs(3)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleep_armed_for_an_old_deadline_is_re_armed_when_it_fires() {
        let t0 = Instant::now();
        let t = Timeouts::new().with_idle(secs(2));
        let mut timers = Box::pin(Timers::new(&t, (t0, t0), t0, false));
        let mut cx = Context::from_waker(Waker::noop());
        let armed = |timers: &Pin<Box<Timers>>| timers.wake.sleep.as_ref().map(Sleep::deadline);

        // A gap from 0 s: the sleep is armed for 2 s.
        timers.as_mut().observe(&token(), 1);
        assert!(timers.as_mut().poll_expired(&mut cx).is_pending());
        assert_eq!(armed(&timers), Some(t0 + secs(2)));
        // Progress at 1 s moves the deadline to 3 s and leaves the sleep alone.
        tokio::time::sleep(secs(1)).await;
        timers.as_mut().observe(&token(), 1);
        assert!(timers.as_mut().poll_expired(&mut cx).is_pending());
        assert_eq!(armed(&timers), Some(t0 + secs(2)));
        // It fires at 2 s, is re-armed for 3 s, and the clock runs out then.
        let e = std::future::poll_fn(|cx| timers.as_mut().poll_expired(cx)).await;
        assert_eq!((e.phase, Instant::now()), (Phase::Idle, t0 + secs(3)));
        assert_eq!(armed(&timers), Some(t0 + secs(3)));
        assert_eq!(timers.last_activity(Phase::Idle), Some(t0 + secs(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn one_sleep_is_re_armed_at_once_for_an_earlier_deadline() {
        let t0 = Instant::now();
        let t = Timeouts::new()
            .with_first_token(secs(10))
            .with_idle(secs(1))
            .with_total(secs(60));
        let mut timers = Box::pin(Timers::new(&t, (t0, t0), t0, false));
        let mut cx = Context::from_waker(Waker::noop());
        let armed = |timers: &Pin<Box<Timers>>| timers.wake.sleep.as_ref().map(Sleep::deadline);

        // Waiting for the first token: the one sleep is armed for its deadline, not the total's.
        assert!(timers.as_mut().poll_expired(&mut cx).is_pending());
        assert_eq!(armed(&timers), Some(t0 + secs(10)));
        // The first token at 2 s: the idle gap runs to 3 s, before the armed 10 s.
        tokio::time::sleep(secs(2)).await;
        timers.as_mut().observe(&token(), 1);
        assert!(timers.as_mut().poll_expired(&mut cx).is_pending());
        assert_eq!(armed(&timers), Some(t0 + secs(3)));
        let e = std::future::poll_fn(|cx| timers.as_mut().poll_expired(cx)).await;
        assert_eq!((e.phase, e.limit), (Phase::Idle, secs(1)));
        assert_eq!(Instant::now(), t0 + secs(3));
    }

    /// A waker that counts its wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl Count {
        fn waker() -> (Waker, std::sync::Arc<Count>) {
            let count = std::sync::Arc::new(Count(Default::default()));
            (Waker::from(count.clone()), count)
        }

        fn wakes(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_sleep_wakes_the_task_that_waited_last() {
        let t0 = Instant::now();
        let t = Timeouts::new().with_idle(secs(2));
        let mut timers = Box::pin(Timers::new(&t, (t0, t0), t0, false));
        let ((first, a), (second, b)) = (Count::waker(), Count::waker());
        timers.as_mut().observe(&token(), 1);
        // Waiting again in the same task registers nothing new; in another task, that task.
        for waker in [&first, &first, &second] {
            let mut cx = Context::from_waker(waker);
            assert!(timers.as_mut().poll_expired(&mut cx).is_pending());
        }
        tokio::time::sleep(secs(3)).await;
        assert_eq!((a.wakes(), b.wakes()), (0, 1));
        let e = std::future::poll_fn(|cx| timers.as_mut().poll_expired(cx)).await;
        assert_eq!((e.phase, e.since), (Phase::Idle, t0));
    }
}
