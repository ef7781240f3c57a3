//! The controller of an adaptive limit ([`crate::adaptive`] documents the algorithm): samples,
//! windows, probes and the update, under the gate's lock.

use std::hash::BuildHasher;
use std::time::Duration;

use metrics::Gauge;
use tokio::time::Instant;

use crate::adaptive::AdaptiveLimit;

/// The gradient's clamp (see [`crate::adaptive`]).
const GRADIENT: (f64, f64) = (0.5, 1.0);
/// The longest hold, in windows, below a knee that raises kept finding (see [`Knee`]).
const MAX_HOLD: u32 = 16;
/// Windows after a raise in which queueing is blamed on it: a server's queue shows in TTFT
/// once the streams admitted into it reach their prefill, up to a window later.
const RAISE_BLAME: u32 = 2;

/// One TTFT sample.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    /// When the request's permit (or lease) was granted.
    pub(crate) granted: Instant,
    pub(crate) ttft: Duration,
    /// The request ended before its first token: the TTFT is at least `ttft`.
    pub(crate) censored: bool,
}

/// A permit's TTFT clock: running from its grant until its first token, with an adaptive
/// limit; stopped (and free) otherwise.
#[derive(Debug)]
pub(crate) struct TtftClock(Option<Instant>);

impl TtftClock {
    /// A clock started at `now` when `on`, else a stopped one.
    pub(crate) fn new(on: bool, now: Instant) -> Self {
        TtftClock(on.then_some(now))
    }

    pub(crate) fn running(&self) -> bool {
        self.0.is_some()
    }

    /// Stops the clock without a sample.
    pub(crate) fn stop(&mut self) {
        self.0 = None;
    }

    /// Stops the clock; its sample (`censored`: the request ended without a token).
    pub(crate) fn take(&mut self, censored: bool) -> Option<Sample> {
        let granted = self.0.take()?;
        Some(Sample {
            granted,
            ttft: Instant::now().saturating_duration_since(granted),
            censored,
        })
    }
}

/// The gauges of one adaptive gate.
struct Gauges {
    limit: Gauge,
    baseline: Gauge,
    gradient: Gauge,
}

impl Gauges {
    fn new() -> Self {
        use metrics::{Unit, describe_gauge};
        describe_gauge!(
            "tailguard_admission_limit",
            Unit::Count,
            "Current adaptive admission limit in capacity units"
        );
        describe_gauge!(
            "tailguard_admission_baseline_ttft_seconds",
            Unit::Seconds,
            "Adaptive admission's estimate of the upstream's no-load time to first token"
        );
        describe_gauge!(
            "tailguard_admission_gradient",
            Unit::Count,
            "Adaptive admission's last gradient (baseline over window TTFT, clamped)"
        );
        Gauges {
            limit: metrics::gauge!("tailguard_admission_limit"),
            baseline: metrics::gauge!("tailguard_admission_baseline_ttft_seconds"),
            gradient: metrics::gauge!("tailguard_admission_gradient"),
        }
    }
}

/// The controller of one gate; lives under the gate's lock.
pub(crate) struct Controller {
    cfg: AdaptiveLimit,
    max: u32,
    /// The running limit (held at `min` while probing).
    limit: f64,
    /// When the current probe started; `None` while running.
    probe: Option<Instant>,
    baseline: Option<f64>,
    /// The last window's statistic: the reference for a window with no uncensored sample.
    last: Option<f64>,
    window_start: Instant,
    samples: Vec<f64>,
    censored: Vec<f64>,
    peak_in_use: u32,
    next_probe: Instant,
    probes: u64,
    logged: u32,
    gradient: f64,
    knee: Knee,
    gauges: Gauges,
}

/// What the raises of the limit found (see "The knee" in [`crate::adaptive`]).
#[derive(Debug, Default)]
struct Knee {
    /// The limit the last failed raise reached: TTFT showed queueing right after it.
    at: Option<u32>,
    /// Windows left before the limit may reach `at` again.
    hold: u32,
    /// The hold the next failed raise gets (doubling, up to [`MAX_HOLD`]).
    backoff: u32,
    /// The last raise, while queueing may still be blamed on it.
    raise: Option<Raise>,
}

#[derive(Debug)]
struct Raise {
    /// The limit it reached.
    to: u32,
    /// When, and the windows ended since.
    at: Instant,
    windows: u32,
}

impl Knee {
    /// Notes a window's verdict (`queued`: its statistic was above the tolerance); returns the
    /// highest limit allowed while a hold lasts.
    fn window(&mut self, queued: bool) -> Option<u32> {
        match self.raise.as_mut() {
            Some(r) if queued => {
                let to = r.to;
                self.failed(to);
            }
            Some(r) => {
                // A clean window at or past the knee: it has moved up (or was never there).
                if self.at.is_some_and(|k| r.to >= k) {
                    self.at = None;
                    self.backoff = 0;
                }
                r.windows += 1;
                if r.windows >= RAISE_BLAME {
                    self.raise = None;
                }
            }
            None if !queued => self.hold = self.hold.saturating_sub(1),
            None => {}
        }
        self.cap()
    }

    /// Notes a sample above the tolerance from a request granted at `granted`: a raise back to
    /// the knee fails at the first one admitted after it, before a window shows it. Returns
    /// the limit to fall back to.
    fn queued(&mut self, granted: Instant) -> Option<u32> {
        let k = self.at?;
        let r = self
            .raise
            .as_ref()
            .filter(|r| r.to >= k && granted >= r.at)?;
        let to = r.to;
        self.failed(to);
        self.cap()
    }

    /// A raise to `to` found queueing: `to` is the knee now, held off for a doubled backoff.
    fn failed(&mut self, to: u32) {
        self.raise = None;
        self.at = Some(to);
        self.backoff = (self.backoff * 2).clamp(1, MAX_HOLD);
        self.hold = self.backoff;
    }

    fn cap(&self) -> Option<u32> {
        self.at.filter(|_| self.hold > 0).map(|k| k - 1)
    }

    /// Notes the limit before and after a window's update at `now`.
    fn updated(&mut self, before: u32, after: u32, now: Instant) {
        if after > before {
            self.raise = Some(Raise {
                to: after,
                at: now,
                windows: 0,
            });
        }
    }
}

impl Controller {
    /// A controller under a ceiling of `capacity`, starting with the seed probe at `now`.
    pub(crate) fn new(cfg: AdaptiveLimit, capacity: u32, now: Instant) -> Self {
        let max = cfg.max.map_or(capacity, |m| m.min(capacity)).max(1);
        let min = cfg.min.min(max);
        let initial = cfg.initial.unwrap_or(max).clamp(min, max);
        let c = Controller {
            cfg: AdaptiveLimit { min, ..cfg },
            max,
            limit: f64::from(initial),
            probe: Some(now),
            baseline: None,
            last: None,
            window_start: now,
            samples: Vec::new(),
            censored: Vec::new(),
            peak_in_use: 0,
            next_probe: now,
            probes: 0,
            logged: initial,
            gradient: 1.0,
            knee: Knee::default(),
            gauges: Gauges::new(),
        };
        c.gauges.limit.set(f64::from(c.limit()));
        c
    }

    /// The limit the gate admits up to now.
    pub(crate) fn limit(&self) -> u32 {
        if self.probe.is_some() {
            return self.cfg.min;
        }
        (self.limit.round() as u32).clamp(self.cfg.min, self.max)
    }

    /// The baseline TTFT estimate, once measured.
    pub(crate) fn baseline(&self) -> Option<Duration> {
        self.baseline
            .and_then(|b| Duration::try_from_secs_f64(b).ok())
    }

    /// Notes the units in use after an admission (the window's peak).
    pub(crate) fn note_in_use(&mut self, in_use: u32) {
        self.peak_in_use = self.peak_in_use.max(in_use);
    }

    /// Takes one sample at `now`; may end a window or a probe, or start a probe.
    /// `None` (an arrival) only ends a probe that ran out of time.
    pub(crate) fn observe(&mut self, s: Option<Sample>, now: Instant) {
        let Some(s) = s else {
            let timeout = self.cfg.probe_timeout;
            if self
                .probe
                .is_some_and(|p| now.saturating_duration_since(p) >= timeout)
            {
                self.end_probe(now);
            }
            return;
        };
        if self.probe.is_some_and(|start| s.granted < start) {
            // Admitted before the probe: it ran with more than `min` in flight.
            return;
        }
        let secs = s.ttft.as_secs_f64();
        let queued = self.baseline.is_some_and(|b| secs > self.no_queueing(b));
        if queued
            && self.probe.is_none()
            && let Some(cap) = self.knee.queued(s.granted)
        {
            self.limit = self.limit.min(f64::from(cap.max(self.cfg.min)));
            self.limit_changed();
        }
        if s.censored {
            self.censored.push(secs);
        } else {
            self.samples.push(secs);
        }
        let count = self.samples.len() + self.censored.len();
        match self.probe {
            Some(_) if count >= self.probe_samples() => self.end_probe(now),
            Some(_) => {}
            None if count >= self.cfg.window_samples
                && now.saturating_duration_since(self.window_start) >= self.cfg.window =>
            {
                self.end_window(now);
                if now >= self.next_probe {
                    self.probe = Some(now);
                    tracing::debug!("tailguard-admission: adaptive limit probing the baseline");
                }
            }
            None => {}
        }
    }

    /// The statistic of the collected samples against `reference` (see the censoring rule in
    /// [`crate::adaptive`]); clears them.
    fn take_statistic(&mut self, reference: Option<f64>) -> Option<f64> {
        let own = p75(&mut self.samples);
        let reference = own.or(reference).unwrap_or(f64::INFINITY);
        let above = self.censored.iter().filter(|&&t| t > reference);
        self.samples.extend(above);
        let stat = p75(&mut self.samples);
        self.samples.clear();
        self.censored.clear();
        stat
    }

    /// The samples that end the current probe: the seed needs one round at `min` (see
    /// [`crate::adaptive`]).
    fn probe_samples(&self) -> usize {
        match self.probes {
            0 => self.cfg.probe_samples.min(self.cfg.min as usize),
            _ => self.cfg.probe_samples,
        }
    }

    fn end_probe(&mut self, now: Instant) {
        let previous = self.baseline;
        if let Some(b) = self.take_statistic(previous).filter(|b| *b > 0.0) {
            self.baseline = Some(b);
            self.gauges.baseline.set(b);
        }
        self.probe = None;
        self.restart_window(now);
        self.probes += 1;
        let jitter = match self.cfg.probe_jitter {
            0.0 => 0.0,
            j => j * jitter(self.probes),
        };
        self.next_probe = now + self.cfg.probe_interval.mul_f64(1.0 + jitter);
        self.limit_changed();
    }

    fn end_window(&mut self, now: Instant) {
        let stat = self.take_statistic(self.last);
        let peak = self.peak_in_use;
        self.restart_window(now);
        let Some(s) = stat.filter(|s| *s > 0.0) else {
            return;
        };
        self.last = Some(s);
        let Some(b) = self.baseline.map(|b| b.min(s)) else {
            return;
        };
        self.baseline = Some(b);
        self.gauges.baseline.set(b);
        let (lo, hi) = GRADIENT;
        let gradient = (self.no_queueing(b) / s).clamp(lo, hi);
        let queued = gradient < hi;
        // Headroom only when the window showed no queueing: added to a queueing window it
        // would hold a standing queue of about √limit inside the upstream.
        let headroom = if queued { 0.0 } else { self.limit.sqrt() };
        let mut target = self.limit * gradient + headroom;
        if f64::from(peak) < self.limit / 2.0 {
            // Application-limited: no evidence the upstream has room for more; decay toward
            // twice the concurrency seen.
            target = target.min(self.limit).min(2.0 * f64::from(peak));
        }
        let a = self.cfg.smoothing;
        let mut next = (1.0 - a) * self.limit + a * target;
        if let Some(cap) = self.knee.window(queued) {
            next = next.min(f64::from(cap));
        }
        let before = self.limit();
        self.limit = next.clamp(f64::from(self.cfg.min), f64::from(self.max));
        self.knee.updated(before, self.limit(), now);
        self.gradient = gradient;
        self.gauges.gradient.set(gradient);
        self.limit_changed();
    }

    /// The highest TTFT that still counts as no queueing against `baseline`: the tolerance
    /// above it, for a window's statistic and for one sample alike.
    fn no_queueing(&self, baseline: f64) -> f64 {
        baseline * (1.0 + self.cfg.tolerance)
    }

    fn restart_window(&mut self, now: Instant) {
        self.window_start = now;
        self.peak_in_use = 0;
    }

    /// Publishes the limit; logs it when it moved more than the configured fraction since the
    /// last logged value.
    fn limit_changed(&mut self) {
        let limit = self.limit();
        self.gauges.limit.set(f64::from(limit));
        let moved = f64::from(limit.abs_diff(self.logged));
        if moved > self.cfg.log_change * f64::from(self.logged) {
            tracing::info!(
                limit,
                previous = self.logged,
                baseline_ttft_s = self.baseline.unwrap_or(0.0),
                gradient = self.gradient,
                "tailguard-admission: adaptive limit changed"
            );
            self.logged = limit;
        }
    }
}

/// The 75th percentile of `v` (nearest rank; sorted in place); `None` when empty.
fn p75(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable_by(f64::total_cmp);
    let rank = (v.len() * 3).div_ceil(4);
    Some(v[rank - 1])
}

/// A pseudo-random value in `[-1, 1]` for the `n`th probe, from the standard library's
/// per-process random hasher keys.
fn jitter(n: u64) -> f64 {
    let h = std::collections::hash_map::RandomState::new().hash_one(n);
    (h as f64 / u64::MAX as f64) * 2.0 - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptive::{DEFAULT_MIN_LIMIT, DEFAULT_PROBE_TIMEOUT, DEFAULT_WINDOW_SAMPLES};

    fn sample(granted: Instant, ms: u64, censored: bool) -> Sample {
        Sample {
            granted,
            ttft: Duration::from_millis(ms),
            censored,
        }
    }

    #[test]
    fn p75_is_robust_and_censored_samples_only_raise_it() {
        let mut v = vec![0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 5.0, 5.0];
        assert_eq!(
            p75(&mut v),
            Some(0.1),
            "two odd samples of eight do not move it"
        );
        let mut v = vec![0.1, 0.1, 0.1, 0.1, 0.1, 0.3, 5.0, 5.0];
        assert_eq!(p75(&mut v), Some(0.3));
        assert_eq!(p75(&mut []), None);
        let mut c = Controller::new(AdaptiveLimit::new(), 16, Instant::now());
        c.samples = vec![0.2; 5];
        c.censored = vec![0.01; 20];
        assert_eq!(c.take_statistic(None), Some(0.2));
        c.samples = vec![0.2; 3];
        c.censored = vec![1.0; 4];
        assert_eq!(c.take_statistic(None), Some(1.0));
        // No uncensored sample: only censored ones above the reference count.
        c.censored = vec![0.01; 8];
        assert_eq!(c.take_statistic(Some(0.2)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn seed_probe_runs_at_min_then_the_initial_limit() {
        let cfg = AdaptiveLimit::new().with_min(2).with_initial(10);
        let start = Instant::now();
        let mut c = Controller::new(cfg, 16, start);
        assert_eq!(c.limit(), 2);
        // One round at min ends the seed.
        c.observe(Some(sample(start, 100, false)), start);
        assert_eq!(c.limit(), 2);
        c.observe(Some(sample(start, 100, false)), start);
        assert_eq!(c.limit(), 10);
        assert_eq!(c.baseline(), Some(Duration::from_millis(100)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lightly_used_limit_decays_toward_twice_the_peak() {
        let start = Instant::now();
        let mut c = Controller::new(AdaptiveLimit::new(), 128, start);
        for _ in 0..DEFAULT_MIN_LIMIT {
            c.observe(Some(sample(start, 100, false)), start);
        }
        assert_eq!(c.limit(), 128);
        // A window at the baseline TTFT with at most 10 in use: down half way to 20 (no rise,
        // however good the TTFT).
        c.note_in_use(10);
        let end = start + Duration::from_secs(1);
        for _ in 0..DEFAULT_WINDOW_SAMPLES {
            c.observe(Some(sample(start, 100, false)), end);
        }
        assert_eq!(c.limit(), 74);
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_without_samples_times_out_to_the_initial_limit() {
        let start = Instant::now();
        let mut c = Controller::new(AdaptiveLimit::new().with_initial(12), 16, start);
        c.observe(None, start + DEFAULT_PROBE_TIMEOUT / 2);
        assert_eq!(c.limit(), DEFAULT_MIN_LIMIT);
        c.observe(None, start + DEFAULT_PROBE_TIMEOUT);
        assert_eq!((c.limit(), c.baseline()), (12, None));
    }

    /// A window of `DEFAULT_WINDOW_SAMPLES` samples of `ms` granted at `granted`, ending
    /// `DEFAULT_WINDOW` after `from` with `in_use` units in use; returns its end.
    fn window(
        c: &mut Controller,
        from: Instant,
        granted: Instant,
        ms: u64,
        in_use: u32,
    ) -> Instant {
        let end = from + crate::adaptive::DEFAULT_WINDOW;
        c.note_in_use(in_use);
        for _ in 0..DEFAULT_WINDOW_SAMPLES {
            c.observe(Some(sample(granted, ms, false)), end);
        }
        end
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_climb_is_remembered_and_re_probed_with_a_doubling_hold() {
        let start = Instant::now();
        let cfg = AdaptiveLimit::new().with_initial(8);
        let mut c = Controller::new(cfg, 16, start);
        for _ in 0..DEFAULT_MIN_LIMIT {
            c.observe(Some(sample(start, 100, false)), start);
        }
        // A clean window at 8 in use: up by half of √8 (9.41).
        let t = window(&mut c, start, start, 100, 8);
        assert_eq!(c.limit(), 9);
        // The next window queues: the raise is blamed, 9 is the knee; the gradient halves the
        // target and no headroom is added (7.06).
        let t = window(&mut c, t, t, 300, 9);
        assert_eq!(c.limit(), 7);
        // A hold of one clean window, then the climb (8.39, then 9.84).
        let t = window(&mut c, t, t, 100, 7);
        assert_eq!(c.limit(), 8);
        let t = window(&mut c, t, t, 100, 8);
        assert_eq!(c.limit(), 10, "a re-probe, past the knee");
        // A sample above the tolerance from a request admitted before the re-probe says
        // nothing about it; the first from one admitted after it fails it at once: 10 is the
        // knee, the limit one below, and the hold doubles.
        c.observe(Some(sample(t - Duration::from_millis(1), 300, false)), t);
        assert_eq!(c.limit(), 10);
        c.observe(Some(sample(t, 300, false)), t + Duration::from_millis(300));
        assert_eq!(c.limit(), 9);
        let t = window(&mut c, t, t, 100, 9);
        assert_eq!(c.limit(), 9, "held for two windows");
        let t = window(&mut c, t, t, 100, 9);
        assert_eq!(c.limit(), 11, "re-probe (10.5)");
        // A clean window past the knee: the upstream has room; the knee is forgotten and the
        // limit grows by its headroom (12.4), up to the old knee and past it.
        let t = window(&mut c, t, t, 100, 11);
        assert_eq!(c.limit(), 12);
        c.observe(Some(sample(t, 300, false)), t + Duration::from_millis(300));
        assert_eq!(c.limit(), 12, "no knee: one slow sample moves nothing");
    }
}
