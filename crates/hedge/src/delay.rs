//! The hedge delay: fixed, or a percentile of recent times to first token.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::request::Parts;
use tailguard_core::{Deadlines, RequestFacts};
use tokio::time::Instant;

mod estimator;

pub(crate) use estimator::Estimator;

/// How long `FirstTokenHedge` waits for the first token of an attempt before it sends the next.
///
/// Whatever the source, a request whose extensions carry core's
/// [`Deadlines`] (set by a timeout layer outside the hedge) waits at most half of the
/// first-token time it has left: a backup sent at `now` goes out no later than halfway to the
/// first-token deadline, so it has at least as long as the attempt before it had on its own;
/// once that time is gone no backup is sent for the delay. The delay a request used is that
/// capped one ([`HedgeOutcome::delay`](tailguard_core::HedgeOutcome)).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum HedgeDelay {
    /// Always the same delay.
    Fixed(Duration),
    /// A percentile of recent times to first token (see [`AdaptiveDelay`]).
    Adaptive(AdaptiveDelay),
}

impl HedgeDelay {
    /// A fixed delay.
    pub fn fixed(delay: Duration) -> Self {
        HedgeDelay::Fixed(delay)
    }

    /// An adaptive delay with the defaults of [`AdaptiveDelay::new`].
    pub fn adaptive() -> Self {
        HedgeDelay::Adaptive(AdaptiveDelay::new())
    }
}

impl Default for HedgeDelay {
    /// [`HedgeDelay::adaptive`]: a fixed delay is right for one upstream and one load level
    /// only; a percentile follows both.
    fn default() -> Self {
        HedgeDelay::adaptive()
    }
}

impl From<AdaptiveDelay> for HedgeDelay {
    fn from(a: AdaptiveDelay) -> Self {
        HedgeDelay::Adaptive(a)
    }
}

impl From<Duration> for HedgeDelay {
    fn from(d: Duration) -> Self {
        HedgeDelay::Fixed(d)
    }
}

type KeyFn = dyn for<'a> Fn(&'a Parts) -> Option<Cow<'a, str>> + Send + Sync;

/// Which requests share one TTFT estimate.
///
/// The first [`max_keys`](AdaptiveDelay::with_max_keys) distinct keys get an estimate (and a
/// value of the `key` label of `tailguard_hedge_delay_seconds`) of their own; later keys share
/// the global one. When keys come from client input (a path, a model name), prefer
/// [`DelayKey::custom`] mapping them onto a known list, so that clients cannot take the slots.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum DelayKey {
    /// One estimate for every request through the layer.
    #[default]
    Global,
    /// One estimate per request path (`/v1/chat/completions`, a gRPC method path).
    Route,
    /// One estimate per [`RequestFacts::model`] found in the request extensions; requests
    /// without facts share the global estimate.
    Model,
    /// One estimate per key the function returns (`None`: the global estimate).
    Custom(Arc<KeyFn>),
}

impl DelayKey {
    /// A key computed by `f` from the request head.
    pub fn custom<F>(f: F) -> Self
    where
        F: for<'a> Fn(&'a Parts) -> Option<Cow<'a, str>> + Send + Sync + 'static,
    {
        DelayKey::Custom(Arc::new(f))
    }

    fn key<'a>(&self, parts: &'a Parts) -> Option<Cow<'a, str>> {
        match self {
            DelayKey::Global => None,
            DelayKey::Route => Some(Cow::Borrowed(parts.uri.path())),
            DelayKey::Model => parts
                .extensions
                .get::<RequestFacts>()
                .and_then(|f| f.model.as_deref())
                .map(Cow::Borrowed),
            DelayKey::Custom(f) => f(parts),
        }
    }
}

impl fmt::Debug for DelayKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DelayKey::Global => f.write_str("Global"),
            DelayKey::Route => f.write_str("Route"),
            DelayKey::Model => f.write_str("Model"),
            DelayKey::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// A hedge delay that follows a percentile of recent times to first token (TTFT).
///
/// Every attempt that produces a first token records its TTFT (from the moment it was sent).
/// Every attempt still waiting when another attempt of its request produced the first token
/// (the loser of a race) records a *censored* sample: its true TTFT is at least the time it
/// waited. Attempts of a race nobody won (every attempt failed, the client went away, a timeout
/// outside the hedge dropped the request) record nothing: when every replica is stuck their
/// waits say how long the request was allowed to wait, not how slow first tokens are, and
/// would hold the estimate at that limit for a whole window after the outage. The percentile is computed with the Kaplan–Meier estimator over a log-scale
/// histogram (4% wide buckets), so losers do not bias the estimate low, which a plain
/// percentile of winners would (a hedge only wins when the primary was slow).
///
/// Samples live in a rotating window: a current and a previous histogram, the previous one
/// dropped every [`window`](AdaptiveDelay::with_window), so the estimate covers the last one to
/// two windows.
///
/// Hedging works from the first request: while the window holds fewer than
/// [`min_samples`](AdaptiveDelay::with_min_samples), the delay in force is the last estimate
/// made (kept through quiet periods, since a quiet minute says nothing about how slow first
/// tokens are), or before any estimate the [`initial`](AdaptiveDelay::with_initial) delay, or
/// four times the slowest sample the window holds when that is sooner (a few samples cannot
/// place a percentile, but a first token that far past all of them is in the tail).
/// `tailguard_hedge_delay_seconds` always reads the delay in force.
#[derive(Clone, Debug)]
pub struct AdaptiveDelay {
    pub(crate) percentile: f64,
    pub(crate) window: Duration,
    pub(crate) min_samples: u32,
    pub(crate) initial: Duration,
    pub(crate) min: Duration,
    pub(crate) max: Duration,
    pub(crate) key: DelayKey,
    pub(crate) max_keys: usize,
}

impl Default for AdaptiveDelay {
    fn default() -> Self {
        Self::new()
    }
}

impl AdaptiveDelay {
    /// The defaults:
    ///
    /// * percentile **0.9**: hedge the slowest 10% of first tokens, which bounds the extra load
    ///   of delay-triggered hedges to about 10% (the budget's default ratio);
    /// * window **30 s**: long enough for hundreds of samples on a busy route, short enough to
    ///   follow a load change within a minute;
    /// * min samples **20**: below that a p90 is one or two samples, too noisy to act on; the
    ///   last estimate stays in force until then, or the initial delay before any;
    /// * initial delay **500 ms**: before any estimate, a first token later than half a second
    ///   (or than four times the slowest seen, when sooner) is worth a backup (an LLM server's
    ///   first token on a short prompt takes well under that unless it queues: a fresh
    ///   gateway's first request placed on a busy replica should not wait longer), and the
    ///   budget bounds what the guess costs; a route of long prompts
    ///   sets its own ([`with_initial`](Self::with_initial)). Without it a route at a few
    ///   requests a minute never hedged, and a stuck primary ended at the first-token timeout;
    /// * min delay **50 ms**: hedging sooner doubles prefill work for gains below what a
    ///   person notices;
    /// * max delay **10 s**: beyond that a hedge is sent anyway, since a first token that late
    ///   is a stuck replica, not a slow one;
    /// * key [`DelayKey::Global`], at most **64** keys (requests with more keys share the
    ///   global estimate, so a metric label stays bounded).
    pub fn new() -> Self {
        AdaptiveDelay {
            percentile: 0.9,
            window: Duration::from_secs(30),
            min_samples: 20,
            initial: Duration::from_millis(500),
            min: Duration::from_millis(50),
            max: Duration::from_secs(10),
            key: DelayKey::Global,
            max_keys: 64,
        }
    }

    /// Sets the percentile, in `(0, 1)` (clamped to `0.01..=0.999`).
    pub fn with_percentile(mut self, percentile: f64) -> Self {
        self.percentile = if percentile.is_nan() {
            0.9
        } else {
            percentile.clamp(0.01, 0.999)
        };
        self
    }

    /// Sets the rotation period of the sample window (at least 1 ms).
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window = window.max(Duration::from_millis(1));
        self
    }

    /// Sets how many samples the window must hold before any delay-triggered hedge is sent.
    pub fn with_min_samples(mut self, n: u32) -> Self {
        self.min_samples = n;
        self
    }

    /// Sets the delay in force before the first estimate (clamped to the bounds when used).
    pub fn with_initial(mut self, delay: Duration) -> Self {
        self.initial = delay;
        self
    }

    /// Sets the clamps of the estimate.
    pub fn with_bounds(mut self, min: Duration, max: Duration) -> Self {
        self.min = min.min(max);
        self.max = max.max(min);
        self
    }

    /// Keeps one estimate per key.
    pub fn with_key(mut self, key: DelayKey) -> Self {
        self.key = key;
        self
    }

    /// Sets the maximum number of keyed estimates.
    pub fn with_max_keys(mut self, n: usize) -> Self {
        self.max_keys = n;
        self
    }
}

/// The delay a backup waits when the previous attempt was sent at `now`: `delay`, at most half
/// of the first-token time `deadlines` leave; `None` (no delay-triggered backup) once that time
/// is gone.
pub(crate) fn within(
    delay: Duration,
    deadlines: Option<&Deadlines>,
    now: Instant,
) -> Option<Duration> {
    match deadlines.and_then(|d| d.first_token_left(now)) {
        None => Some(delay),
        Some(left) if left.is_zero() => None,
        Some(left) => Some(delay.min(left / 2)),
    }
}

/// When a primary its placer marked a probe against an `alternative` (core's
/// `Attempt::mark_probe_against`: the first token expected on the replica it would otherwise
/// have chosen) is backed up, and after what wait: twice the alternative, at least 50 ms (the
/// adaptive delay's default floor). A probe that has not answered by then is no faster than
/// the alternative, which is what its placer wanted to learn; the request need not wait the
/// whole delay for that lesson (issue 29: probes of a replica busy with traffic nobody sees
/// each cost a request 1-1.5 s of the delay in the real bench's queue mode). It only brings
/// the backup forward; the budget decides as for any probe. `None`: too far to add.
pub(crate) fn probe_due(sent_at: Instant, alternative: Duration) -> Option<(Instant, Duration)> {
    let wait = alternative.saturating_mul(2).max(Duration::from_millis(50));
    sent_at.checked_add(wait).map(|due| (due, wait))
}

/// Until when a delay's backup is held, and after what wait, when its placer knows a backup
/// would wait at least `wait` for a first token (core's `Attempt::backup_wait`: every replica
/// not tried is known to be slow): until the attempt it backs up, sent at `sent_at`, has
/// waited as long. `None`: that is past, the backup goes now.
pub(crate) fn held_until(
    sent_at: Instant,
    wait: Duration,
    now: Instant,
) -> Option<(Instant, Duration)> {
    sent_at
        .checked_add(wait)
        .filter(|due| *due > now)
        .map(|due| (due, wait))
}

/// Whether a backup sent at `now` could still win: not when the first-token time `deadlines`
/// leave is shorter than the `expected` time to first token (the median of the estimate);
/// always without either.
pub(crate) fn could_win(
    deadlines: Option<&Deadlines>,
    expected: Option<Duration>,
    now: Instant,
) -> bool {
    match (deadlines.and_then(|d| d.first_token_left(now)), expected) {
        (Some(left), Some(expected)) => left >= expected,
        _ => true,
    }
}

/// The delay source of one layer: fixed, or one or more estimators.
#[derive(Debug)]
pub(crate) enum DelaySource {
    Fixed(Duration),
    Adaptive(Estimators),
}

pub(crate) struct Estimators {
    config: AdaptiveDelay,
    global: Arc<Estimator>,
    keyed: Mutex<HashMap<Box<str>, Arc<Estimator>>>,
}

impl fmt::Debug for Estimators {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Estimators")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl DelaySource {
    pub(crate) fn new(delay: &HedgeDelay) -> Self {
        match delay {
            HedgeDelay::Fixed(d) => {
                metrics::gauge!("tailguard_hedge_delay_seconds", "key" => "fixed")
                    .set(d.as_secs_f64());
                DelaySource::Fixed(*d)
            }
            HedgeDelay::Adaptive(a) => DelaySource::Adaptive(Estimators {
                config: a.clone(),
                global: Arc::new(Estimator::new(a.clone(), Arc::from("global"))),
                keyed: Mutex::default(),
            }),
        }
    }

    /// The estimator a request records into (`None` for a fixed delay): its key's, or the
    /// global one for a request without a key or once every keyed slot is taken.
    pub(crate) fn estimator(&self, parts: &Parts) -> Option<Arc<Estimator>> {
        let DelaySource::Adaptive(e) = self else {
            return None;
        };
        let Some(key) = e.config.key.key(parts) else {
            return Some(e.global.clone());
        };
        let mut keyed = e.keyed.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(est) = keyed.get(key.as_ref()) {
            return Some(est.clone());
        }
        if keyed.len() >= e.config.max_keys {
            return Some(e.global.clone());
        }
        let est = Arc::new(Estimator::new(e.config.clone(), Arc::from(key.as_ref())));
        keyed.insert(Box::from(key.as_ref()), est.clone());
        Some(est)
    }

    /// The delay in force for a request that records into `estimator`.
    pub(crate) fn delay(&self, estimator: Option<&Estimator>, now: Instant) -> Option<Duration> {
        match (self, estimator) {
            (DelaySource::Fixed(d), _) => Some(*d),
            (DelaySource::Adaptive(_), Some(e)) => Some(e.current(now)),
            (DelaySource::Adaptive(e), None) => Some(e.global.current(now)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::estimator::{bucket_of, bucket_value};
    use super::*;

    fn est(p: f64) -> Estimator {
        Estimator::new(
            AdaptiveDelay::new()
                .with_percentile(p)
                .with_min_samples(10)
                .with_initial(Duration::from_secs(1))
                .with_bounds(Duration::ZERO, Duration::from_secs(600)),
            Arc::from("t"),
        )
    }

    #[test]
    fn buckets_are_monotonic_and_close() {
        let mut prev = 0;
        for ms in [
            0u64, 1, 2, 5, 10, 99, 100, 101, 1000, 30_000, 600_000, 10_000_000,
        ] {
            let k = bucket_of(Duration::from_millis(ms));
            assert!(k >= prev);
            prev = k;
            if (1..600_000).contains(&ms) {
                let v = bucket_value(k).as_secs_f64() * 1000.0;
                assert!((v / ms as f64 - 1.0).abs() < 0.04, "{ms} -> {v}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_initial_delay_until_min_samples() {
        let e = est(0.5);
        let now = Instant::now();
        assert_eq!(
            AdaptiveDelay::new().initial,
            Duration::from_millis(500),
            "the default"
        );
        assert_eq!(e.current(now), Duration::from_secs(1), "the initial delay");
        for i in 0..9 {
            e.record(Duration::from_millis(100 + 10 * i), false, now);
            // Four times the slowest seen, when sooner than the initial delay.
            let d = e.current(now).as_secs_f64();
            let slowest = (100 + 10 * i) as f64 / 1000.0;
            assert!((d / (4.0 * slowest) - 1.0).abs() < 0.03, "{d} {slowest}");
        }
        e.record(Duration::from_millis(100), false, now);
        let d = e.current(now).as_millis();
        assert!((125..=136).contains(&d), "the estimate: {d} ms");
        // A censored wait counts as seen: no sooner than four times it.
        let e = est(0.5);
        e.record(Duration::from_millis(100), true, now);
        let d = e.current(now).as_millis();
        assert!((390..=410).contains(&d), "{d} ms");
        e.record(Duration::from_millis(400), true, now);
        assert_eq!(e.current(now), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn percentile_of_uniform_samples() {
        let e = est(0.9);
        let now = Instant::now();
        for ms in 1..=1000u64 {
            e.record(Duration::from_millis(ms), false, now);
        }
        let d = e.current(now).as_secs_f64() * 1000.0;
        assert!((d - 900.0).abs() < 900.0 * 0.03, "{d}");
    }

    #[tokio::test(start_paused = true)]
    async fn censored_samples_push_the_estimate_up() {
        // 80 fast samples at 100 ms; 20 attempts cancelled after 500 ms (their true TTFT is
        // unknown but at least 500 ms). A p90 must lie beyond 500 ms, not at 100 ms.
        let e = est(0.9);
        let now = Instant::now();
        for _ in 0..80 {
            e.record(Duration::from_millis(100), false, now);
        }
        for _ in 0..20 {
            e.record(Duration::from_millis(500), true, now);
        }
        let d = e.current(now);
        assert!(d >= Duration::from_millis(480), "{d:?}");
        // Ignoring them would have said ~100 ms.
        let naive = est(0.9);
        for _ in 0..80 {
            naive.record(Duration::from_millis(100), false, now);
        }
        assert!(naive.current(now) < Duration::from_millis(105));
    }

    #[tokio::test(start_paused = true)]
    async fn window_rotates_old_samples_out() {
        let e = Estimator::new(
            AdaptiveDelay::new()
                .with_min_samples(5)
                .with_window(Duration::from_secs(10))
                .with_bounds(Duration::ZERO, Duration::from_secs(600)),
            Arc::from("t"),
        );
        let t0 = Instant::now();
        for _ in 0..50 {
            e.record(Duration::from_millis(1000), false, t0);
        }
        let t1 = t0 + Duration::from_secs(11);
        for _ in 0..50 {
            e.record(Duration::from_millis(100), false, t1);
        }
        // Both windows: p90 is the slow mode.
        assert!(e.current(t1) > Duration::from_millis(900));
        // After another window the slow samples are gone.
        let t2 = t1 + Duration::from_secs(10);
        for _ in 0..50 {
            e.record(Duration::from_millis(100), false, t2);
        }
        let fast = e.current(t2);
        assert!(fast < Duration::from_millis(110));
        // Silence for two windows drops every sample; the last estimate stays in force.
        assert_eq!(e.current(t2 + Duration::from_secs(25)), fast);
    }

    #[tokio::test(start_paused = true)]
    async fn clamps_apply() {
        let e = Estimator::new(
            AdaptiveDelay::new()
                .with_min_samples(1)
                .with_bounds(Duration::from_millis(200), Duration::from_secs(1)),
            Arc::from("t"),
        );
        let now = Instant::now();
        e.record(Duration::from_millis(5), false, now);
        assert_eq!(e.current(now), Duration::from_millis(200));
        for _ in 0..10 {
            e.record(Duration::from_secs(50), false, now);
        }
        assert_eq!(e.current(now), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_delay_is_at_most_half_the_first_token_time_left() {
        let now = Instant::now();
        let d = Duration::from_secs(5);
        assert_eq!(within(d, None, now), Some(d));
        let none = Deadlines::default();
        assert_eq!(within(d, Some(&none), now), Some(d));
        let three = Deadlines {
            first_token: Some(now + Duration::from_secs(3)),
            total: None,
        };
        assert_eq!(
            within(d, Some(&three), now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            within(Duration::from_millis(200), Some(&three), now),
            Some(Duration::from_millis(200))
        );
        // Later in the request, half of what is left then.
        let later = now + Duration::from_secs(2);
        assert_eq!(
            within(d, Some(&three), later),
            Some(Duration::from_millis(500))
        );
        // The total deadline counts when it is the earlier one.
        let total = Deadlines {
            first_token: Some(now + Duration::from_secs(3)),
            total: Some(now + Duration::from_secs(1)),
        };
        assert_eq!(
            within(d, Some(&total), now),
            Some(Duration::from_millis(500))
        );
        // Past the deadline: no backup for the delay.
        assert_eq!(within(d, Some(&three), now + Duration::from_secs(3)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_backup_could_win_only_with_the_expected_ttft_left() {
        let now = Instant::now();
        let e = Estimator::new(AdaptiveDelay::new().with_min_samples(3), Arc::from("t"));
        assert_eq!(e.expected(now), None, "too few samples");
        for ms in [1000, 1500, 4000] {
            e.record(Duration::from_millis(ms), false, now);
        }
        let expected = e.expected(now).unwrap();
        let ms = expected.as_millis();
        assert!((1440..=1560).contains(&ms), "the median, {ms} ms");
        let left = |s: u64| Deadlines {
            first_token: None,
            total: Some(now + Duration::from_secs(s)),
        };
        assert!(could_win(Some(&left(2)), Some(expected), now));
        assert!(!could_win(Some(&left(1)), Some(expected), now));
        assert!(could_win(Some(&left(1)), None, now), "no estimate");
        assert!(could_win(None, Some(expected), now), "no deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn keyed_estimators_are_separate_and_bounded() {
        let src = DelaySource::new(&HedgeDelay::Adaptive(
            AdaptiveDelay::new()
                .with_key(DelayKey::Route)
                .with_max_keys(1),
        ));
        let parts = |path: &str| http::Request::post(path).body(()).unwrap().into_parts().0;
        let a1 = src.estimator(&parts("/a")).unwrap();
        let a2 = src.estimator(&parts("/a")).unwrap();
        let b = src.estimator(&parts("/b")).unwrap();
        assert!(Arc::ptr_eq(&a1, &a2));
        assert!(!Arc::ptr_eq(&a1, &b));
        assert_eq!(&*b.label, "global");
    }
}
