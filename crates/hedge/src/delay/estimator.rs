//! The adaptive delay's estimator: recent times to first token (and censored waits) in
//! decaying log-bucket histograms, and their quantile by the product-limit estimator.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::AdaptiveDelay;

/// Number of histogram buckets: bucket 0 is `[0, 1 ms)`, bucket `k` is
/// `[1.04^(k-1), 1.04^k)` ms; the last one reaches past 10 minutes.
const BUCKETS: usize = 344;
const RATIO: f64 = 1.04;

pub(super) fn bucket_of(d: Duration) -> usize {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 1.0 {
        return 0;
    }
    let k = (ms.ln() / RATIO.ln()).floor() as usize + 1;
    k.min(BUCKETS - 1)
}

/// The geometric middle of bucket `k`.
pub(super) fn bucket_value(k: usize) -> Duration {
    if k == 0 {
        return Duration::from_micros(500);
    }
    let ms = RATIO.powf(k as f64 - 0.5);
    Duration::from_secs_f64(ms / 1000.0)
}

/// Before the first estimate, a first token this many times slower than the slowest sample
/// seen is hedged even before the initial delay: a few samples cannot place a percentile, but
/// that far past all of them is the tail of whatever the distribution is (issue 29: a fresh
/// gateway's primary on a replica busy with traffic nobody sees waited the whole initial
/// second, while the first tokens seen had taken 0.13 s). The budget bounds what it costs.
const WARMUP_FACTOR: u32 = 4;

/// Samples by bucket: attempts that produced a first token, and censored ones.
struct Hist {
    events: [u32; BUCKETS],
    censored: [u32; BUCKETS],
    total: u32,
}

impl Hist {
    fn new() -> Self {
        Hist {
            events: [0; BUCKETS],
            censored: [0; BUCKETS],
            total: 0,
        }
    }

    /// The bucket of the slowest sample, a first token or a censored wait.
    fn slowest(&self) -> Option<usize> {
        (0..BUCKETS)
            .rev()
            .find(|&k| self.events[k] > 0 || self.censored[k] > 0)
    }
}

struct State {
    current: Hist,
    previous: Hist,
    rotated_at: Instant,
    /// The last estimate made from enough samples, kept through quiet periods.
    last: Option<Duration>,
}

/// One TTFT estimate.
pub(crate) struct Estimator {
    config: AdaptiveDelay,
    pub(super) label: Arc<str>,
    state: Mutex<State>,
}

impl fmt::Debug for Estimator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Estimator")
            .field("key", &self.label)
            .finish_non_exhaustive()
    }
}

impl Estimator {
    pub(crate) fn new(config: AdaptiveDelay, label: Arc<str>) -> Self {
        Estimator {
            config,
            label,
            state: Mutex::new(State {
                current: Hist::new(),
                previous: Hist::new(),
                rotated_at: Instant::now(),
                last: None,
            }),
        }
    }

    /// The state, its window rotated to `now`: once a window has passed the current
    /// histogram becomes the previous one; after two, both are empty.
    fn state(&self, now: Instant) -> MutexGuard<'_, State> {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let since = now.saturating_duration_since(st.rotated_at);
        if since >= self.config.window {
            let previous = std::mem::replace(&mut st.current, Hist::new());
            st.previous = if since >= self.config.window.saturating_mul(2) {
                Hist::new()
            } else {
                previous
            };
            st.rotated_at = now;
        }
        st
    }

    /// Records a time to first token; `censored` when the attempt was cancelled before its
    /// first token and `ttft` is only a lower bound.
    pub(crate) fn record(&self, ttft: Duration, censored: bool, now: Instant) {
        let mut st = self.state(now);
        let k = bucket_of(ttft);
        let h = &mut st.current;
        let count = if censored {
            &mut h.censored[k]
        } else {
            &mut h.events[k]
        };
        *count = count.saturating_add(1);
        h.total = h.total.saturating_add(1);
    }

    /// The expected time to first token, the median of the window (within the bounds); `None`
    /// while the window holds fewer than the minimum samples.
    pub(crate) fn expected(&self, now: Instant) -> Option<Duration> {
        let st = self.state(now);
        let samples = st.current.total.saturating_add(st.previous.total);
        (samples >= self.config.min_samples.max(1)).then(|| {
            kaplan_meier(&st.current, &st.previous, 0.5).clamp(self.config.min, self.config.max)
        })
    }

    /// The delay in force: the estimate of the window, or, while it holds fewer than the
    /// minimum samples, the last estimate made, or before any: the initial delay, or
    /// [`WARMUP_FACTOR`] times the slowest sample of the window when that is sooner.
    pub(crate) fn current(&self, now: Instant) -> Duration {
        let mut st = self.state(now);
        let samples = st.current.total.saturating_add(st.previous.total);
        let (min, max) = (self.config.min, self.config.max);
        let d = if samples >= self.config.min_samples.max(1) {
            let d = kaplan_meier(&st.current, &st.previous, self.config.percentile).clamp(min, max);
            st.last = Some(d);
            d
        } else {
            let slowest = (st.current.slowest().max(st.previous.slowest()))
                .map(|k| bucket_value(k).saturating_mul(WARMUP_FACTOR));
            let initial = slowest.map_or(self.config.initial, |s| s.min(self.config.initial));
            st.last.unwrap_or(initial.clamp(min, max))
        };
        metrics::gauge!("tailguard_hedge_delay_seconds", "key" => self.label.clone())
            .set(d.as_secs_f64());
        d
    }
}

/// The `p` quantile of the merged histograms by the product-limit estimator: at a bucket
/// with `d` events and `n` samples still at risk, survival is multiplied by `1 - d/n`;
/// censored samples leave the risk set after the events of their bucket.
fn kaplan_meier(a: &Hist, b: &Hist, p: f64) -> Duration {
    let mut at_risk = f64::from(a.total) + f64::from(b.total);
    let mut survival = 1.0f64;
    let mut last = 0;
    for k in 0..BUCKETS {
        let d = f64::from(a.events[k]) + f64::from(b.events[k]);
        let c = f64::from(a.censored[k]) + f64::from(b.censored[k]);
        if d + c == 0.0 {
            continue;
        }
        last = k;
        if d > 0.0 && at_risk > 0.0 {
            survival *= 1.0 - d / at_risk;
            if 1.0 - survival >= p - 1e-9 {
                return bucket_value(k);
            }
        }
        at_risk -= d + c;
    }
    // Censoring left the quantile above every observation: the best lower bound is the
    // largest time seen.
    bucket_value(last)
}
