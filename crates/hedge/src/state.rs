//! What every service of one `FirstTokenHedgeLayer` value shares, and the one eligibility check.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use http::request::Parts;
use http_body::Body;
use tailguard_core::{ClassPolicy, Priority};

use crate::budget::Budgets;
use crate::config::Config;
use crate::delay::DelaySource;

/// The state one layer value shares with every service it builds and their clones: the
/// configuration, the TTFT estimates, the budgets and the rollout counter.
pub(crate) struct HedgeState {
    pub(crate) config: Config,
    pub(crate) delay: DelaySource,
    pub(crate) budget: Budgets,
    rollout_seq: AtomicU64,
    rollout_threshold: u64,
}

impl fmt::Debug for HedgeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeState")
            .field("config", &self.config)
            .field("delay", &self.delay)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl HedgeState {
    pub(crate) fn new(config: Config) -> Self {
        crate::metrics::describe();
        let rollout_threshold = if config.rollout >= 1.0 {
            u64::MAX
        } else {
            (config.rollout * u64::MAX as f64) as u64
        };
        HedgeState {
            delay: DelaySource::new(&config.delay),
            budget: Budgets::new(&config.budget, &config.failover_budget),
            rollout_seq: AtomicU64::new(0),
            rollout_threshold,
            config,
        }
    }

    /// The one eligibility check: every condition a request must meet to be raced.
    pub(crate) fn eligible<B: Body>(&self, parts: &Parts, body: &B) -> bool {
        let c = &self.config;
        if c.max_attempts < 2 {
            return false;
        }
        let accepted = match &c.predicate {
            Some(p) => p(parts),
            None => Config::default_predicate(parts),
        };
        if !accepted {
            return false;
        }
        if let Some(h) = &c.opt_out
            && parts.headers.contains_key(h)
        {
            return false;
        }
        match parts.extensions.get::<ClassPolicy>().and_then(|p| p.hedge) {
            Some(false) => return false,
            Some(true) => {}
            None => {
                if let Some(allowed) = &c.priorities {
                    let Some(p) = parts.extensions.get::<Priority>() else {
                        return false;
                    };
                    if !allowed.contains(p) {
                        return false;
                    }
                }
            }
        }
        if body.size_hint().lower() > c.replay_cap as u64 {
            return false;
        }
        if self.rollout_threshold != u64::MAX {
            // A Weyl sequence: the fraction of values under the threshold converges to the
            // rollout fraction quickly and evenly, with no random number generator.
            let n = self.rollout_seq.fetch_add(1, Ordering::Relaxed);
            if n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >= self.rollout_threshold {
                return false;
            }
        }
        true
    }
}
