//! The drain rate of a gate and the `Retry-After` estimated from it.

use std::time::Duration;

use tokio::time::Instant;

/// Time constant of the drain-rate estimate.
const DRAIN_WINDOW: Duration = Duration::from_secs(5);
/// Upper bound of an estimated `Retry-After`.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Units released per second, as an exponentially decayed count of released units.
pub(crate) struct Drain {
    /// Released units, each weighted by `exp(-age / DRAIN_WINDOW)` as of `last`.
    decayed: f64,
    last: Instant,
    created: Instant,
}

impl Drain {
    pub(crate) fn new(now: Instant) -> Self {
        Drain {
            decayed: 0.0,
            last: now,
            created: now,
        }
    }

    fn decayed_at(&self, now: Instant) -> f64 {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.decayed * (-dt / DRAIN_WINDOW.as_secs_f64()).exp()
    }

    /// Counts `units` released at `now`.
    pub(crate) fn record(&mut self, now: Instant, units: u32) {
        self.decayed = self.decayed_at(now) + f64::from(units);
        self.last = now;
    }

    /// Units per second, bias-corrected for a gate younger than the window; `None` before
    /// anything was released.
    fn rate(&self, now: Instant) -> Option<f64> {
        let decayed = self.decayed_at(now);
        if decayed <= 0.0 {
            return None;
        }
        let tau = DRAIN_WINDOW.as_secs_f64();
        let age = now
            .saturating_duration_since(self.created)
            .as_secs_f64()
            .max(0.001);
        let rate = decayed / (tau * (1.0 - (-age / tau).exp()));
        (rate.is_finite() && rate > 0.0).then_some(rate)
    }

    /// How long a backlog of `backlog` units takes to drain at the observed rate; `fallback`
    /// before anything was released; at most 60 s.
    pub(crate) fn retry_after(&self, now: Instant, backlog: u64, fallback: Duration) -> Duration {
        let est = match self.rate(now) {
            Some(rate) => {
                Duration::try_from_secs_f64(backlog as f64 / rate).unwrap_or(MAX_RETRY_AFTER)
            }
            None => fallback,
        };
        est.min(MAX_RETRY_AFTER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_the_backlog_over_the_rate_and_bounded() {
        let start = Instant::now();
        let mut d = Drain::new(start);
        let fallback = Duration::from_secs(2);
        assert_eq!(
            d.retry_after(start, 10, fallback),
            fallback,
            "nothing released yet"
        );
        // One unit per 100 ms for 30 s: about 10 units per second.
        for i in 1..=300 {
            d.record(start + Duration::from_millis(100 * i), 1);
        }
        let now = start + Duration::from_secs(30);
        let est = d.retry_after(now, 20, fallback);
        assert!(
            (Duration::from_millis(1_900)..=Duration::from_millis(2_100)).contains(&est),
            "{est:?}"
        );
        assert_eq!(d.retry_after(now, 1_000_000, fallback), MAX_RETRY_AFTER);
    }
}
