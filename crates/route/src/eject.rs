//! Outlier ejection: a replica that keeps failing before its first token is left out of primary
//! selection for a while. Slowness steers placement through the score; it ejects only when
//! asked to ([`Ejection::with_slow_factor`]).

use std::time::Duration;

use tokio::time::Instant;

/// When a [`ReplicaSet`](crate::ReplicaSet) ejects a replica from primary selection, and for
/// how long (Envoy's outlier detection semantics).
///
/// A replica is ejected after [`consecutive_failures`](Ejection::with_consecutive_failures)
/// failures before a first token in a row. Slowness alone does not eject by default: a replica
/// that still answers gets fewer primaries through its first-token score, and ejecting it for
/// being slow sends every primary to the others, which then queue (issue 29: a single-slot
/// replica busy with traffic the gateway cannot see was ejected, and the one left queued runs
/// of 20 requests). Opt in with [`with_slow_factor`](Ejection::with_slow_factor): then a
/// replica whose first-token estimate exceeds that many times the median of the others' and is
/// at least [`slow_min`](Ejection::with_slow_min) is ejected too. The `n`-th ejection lasts
/// `n × base` (at most `max`); every `base` period a replica goes without an ejection takes one
/// off `n`. After the period the replica is back in selection (probed by the next primaries
/// that pick it).
///
/// Ejection never leaves fewer than half of the replicas in selection (Envoy's panic
/// threshold, at 50%): with two replicas one may be ejected, with three one, with four two.
/// Backups may still go to an ejected replica when it is the only one not yet tried.
///
/// Each ejection increments `tailguard_hedge_ejections_total{replica, reason}` and logs a
/// `tracing` warning.
#[derive(Clone, Debug, PartialEq)]
pub struct Ejection {
    pub(crate) consecutive_failures: u32,
    pub(crate) slow_factor: f64,
    pub(crate) slow_min: Duration,
    pub(crate) base: Duration,
    pub(crate) max: Duration,
    pub(crate) enabled: bool,
}

impl Default for Ejection {
    fn default() -> Self {
        Self::new()
    }
}

impl Ejection {
    /// The defaults:
    ///
    /// * **5** consecutive failures (Envoy's `consecutive_5xx`): fewer would eject a replica
    ///   for a short burst that failover already hides;
    /// * slow factor **off** (infinite): slowness steers through the score and never ejects a
    ///   replica that answers; slow minimum **1 s** for those who turn it on, so that replicas
    ///   that are all fast are not ejected for a few milliseconds of difference;
    /// * base **30 s**, max **300 s** (Envoy's `base_ejection_time` and `max_ejection_time`):
    ///   long enough for a restart or a queue to drain, and growing for a replica that keeps
    ///   relapsing.
    pub fn new() -> Self {
        Ejection {
            consecutive_failures: 5,
            slow_factor: f64::INFINITY,
            slow_min: Duration::from_secs(1),
            base: Duration::from_secs(30),
            max: Duration::from_secs(300),
            enabled: true,
        }
    }

    /// No ejection.
    pub fn disabled() -> Self {
        Ejection {
            enabled: false,
            ..Self::new()
        }
    }

    /// Sets the consecutive failures that eject a replica (`0`: failures never eject).
    pub fn with_consecutive_failures(mut self, n: u32) -> Self {
        self.consecutive_failures = n;
        self
    }

    /// Sets how many times the others' median first-token estimate ejects a replica
    /// (`f64::INFINITY`, the default, or NaN: slowness never ejects). Five is a reasonable
    /// value where replicas are interchangeable and a slow one is broken rather than busy.
    pub fn with_slow_factor(mut self, factor: f64) -> Self {
        self.slow_factor = if factor.is_nan() {
            f64::INFINITY
        } else {
            factor.max(1.0)
        };
        self
    }

    /// Sets the smallest first-token estimate that can eject a replica for slowness.
    pub fn with_slow_min(mut self, min: Duration) -> Self {
        self.slow_min = min;
        self
    }

    /// Sets the base and the longest ejection period.
    pub fn with_period(mut self, base: Duration, max: Duration) -> Self {
        self.base = base;
        self.max = max.max(base);
        self
    }
}

/// One replica's ejection state.
#[derive(Debug, Default)]
pub(crate) struct Ejector {
    pub(crate) consecutive: u32,
    /// Ejections that still lengthen the next one.
    times: u32,
    until: Option<Instant>,
    /// When the last ejection ended (or was decided, for the first).
    since: Option<Instant>,
}

impl Ejector {
    pub(crate) fn failed(&mut self) {
        self.consecutive = self.consecutive.saturating_add(1);
    }

    pub(crate) fn succeeded(&mut self) {
        self.consecutive = 0;
    }

    /// Whether the replica is out of primary selection at `now`; a period that is over is
    /// cleared (the replica is back, to be probed).
    pub(crate) fn is_ejected(&mut self, now: Instant) -> bool {
        match self.until {
            Some(t) if now < t => true,
            Some(t) => {
                self.until = None;
                self.since = Some(t);
                self.consecutive = 0;
                false
            }
            None => false,
        }
    }

    pub(crate) fn eject(&mut self, cfg: &Ejection, now: Instant) -> Duration {
        if let Some(since) = self.since {
            let healthy = now.saturating_duration_since(since).as_secs_f64();
            let periods = (healthy / cfg.base.as_secs_f64().max(1e-9)) as u32;
            self.times = self.times.saturating_sub(periods);
        }
        self.times = self.times.saturating_add(1);
        let period = cfg.base.saturating_mul(self.times).min(cfg.max);
        self.until = Some(now + period);
        self.consecutive = 0;
        period
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn periods_grow_and_shrink_again() {
        let cfg = Ejection::new().with_period(Duration::from_secs(10), Duration::from_secs(25));
        let mut e = Ejector::default();
        let t0 = Instant::now();
        assert_eq!(e.eject(&cfg, t0), Duration::from_secs(10));
        assert!(e.is_ejected(t0 + Duration::from_secs(9)));
        assert!(!e.is_ejected(t0 + Duration::from_secs(10)));
        let t1 = t0 + Duration::from_secs(11);
        assert_eq!(e.eject(&cfg, t1), Duration::from_secs(20));
        let t2 = t1 + Duration::from_secs(20);
        assert!(!e.is_ejected(t2));
        assert_eq!(e.eject(&cfg, t2), Duration::from_secs(25));
        // Long healthy: back to the base.
        let t3 = t2 + Duration::from_secs(500);
        assert!(!e.is_ejected(t3));
        assert_eq!(e.eject(&cfg, t3), Duration::from_secs(10));
    }
}
