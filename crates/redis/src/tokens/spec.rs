//! One limit's numbers as the scripts take them, and what Rust makes of the levels they
//! return: `tailguard-tenant`'s bucket arithmetic (bucket.rs), on levels kept in Redis.

use std::time::Duration;

use tailguard_tenant::{Limit, Shortfall};

/// A limit's bucket in Redis: its field in the tenant's hash, and its arithmetic in units of
/// `1 / window` of a token.
#[derive(Clone, Debug)]
pub(super) struct Spec {
    /// The hash field: window in nanoseconds, kind, tokens (a bucket per distinct limit, as
    /// the local store keeps one).
    pub(super) field: String,
    /// The window in nanoseconds (at least 1, at most `u64::MAX`).
    window: u128,
    /// The limit's tokens: the refill in units per nanosecond.
    rate: u128,
}

impl Spec {
    pub(super) fn of(limit: &Limit) -> Self {
        let window = limit
            .window()
            .duration()
            .as_nanos()
            .min(u128::from(u64::MAX));
        Spec {
            field: format!("{window}:{}:{}", limit.kind(), limit.tokens()),
            window,
            rate: u128::from(limit.tokens()),
        }
    }

    /// `tokens` in units.
    pub(super) fn units(&self, tokens: u64) -> u128 {
        u128::from(tokens) * self.window
    }

    /// The script arguments every call takes: field, window, rate, capacity.
    pub(super) fn args(&self) -> [String; 4] {
        [
            self.field.clone(),
            self.window.to_string(),
            self.rate.to_string(),
            (self.rate * self.window).to_string(),
        ]
    }

    /// Whole tokens at `level`.
    pub(super) fn available(&self, level: u128) -> u64 {
        u64::try_from(level / self.window).unwrap_or(u64::MAX)
    }

    /// When `tokens` fit a bucket at `level`: `Some(ZERO)` now, `Some(wait)` after a refill,
    /// `None` never (more than the limit).
    pub(super) fn fit(&self, level: u128, tokens: u64) -> Option<Duration> {
        let need = self.units(tokens);
        if u128::from(tokens) > self.rate {
            None
        } else if level >= need {
            Some(Duration::ZERO)
        } else {
            // `tokens <= rate` and the level is short, so the rate is not zero.
            let nanos = (need - level).div_ceil(self.rate);
            Some(Duration::from_nanos(
                u64::try_from(nanos).unwrap_or(u64::MAX),
            ))
        }
    }

    /// The whole tokens of a charge of `tokens` that a bucket at `level` could not cover.
    pub(super) fn uncovered(&self, level: u128, tokens: u64) -> u64 {
        if self.units(tokens) <= level {
            0
        } else {
            tokens - self.available(level)
        }
    }

    /// The longest window of `specs` in milliseconds, rounded up (at least 1): after it every
    /// bucket is full again, so the hash may expire.
    pub(super) fn hash_ttl_ms(specs: &[Spec]) -> u64 {
        let ns = specs.iter().map(|s| s.window).max().unwrap_or(1);
        u64::try_from(ns.div_ceil(1_000_000))
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// The refusal of a reservation that did not fit: the bucket that frees its share last, or
/// the first that never can, as the local store picks it. `levels` are the buckets' levels,
/// `wanted` each limit's share.
pub(super) fn shortfall(
    limits: &[Limit],
    specs: &[Spec],
    levels: &[u128],
    wanted: impl Fn(&Limit) -> u64,
) -> Option<Shortfall> {
    let mut short: Option<Shortfall> = None;
    for ((limit, spec), &level) in limits.iter().zip(specs).zip(levels) {
        let wanted = wanted(limit);
        let retry_after = match spec.fit(level, wanted) {
            Some(Duration::ZERO) => continue,
            wait => wait,
        };
        let s = Shortfall {
            limit: *limit,
            wanted,
            available: spec.available(level),
            retry_after,
        };
        if short.as_ref().is_none_or(|cur| worse(cur, &s)) {
            short = Some(s);
        }
    }
    short
}

/// Whether `b`'s refusal is a stronger one than `a`'s: one that never fits beats a wait, a
/// longer wait beats a shorter one (the local store's order).
fn worse(a: &Shortfall, b: &Shortfall) -> bool {
    match (a.retry_after, b.retry_after) {
        (_, None) => a.retry_after.is_some(),
        (None, Some(_)) => false,
        (Some(x), Some(y)) => y > x,
    }
}

#[cfg(test)]
mod tests {
    use tailguard_tenant::{Kind, Window};

    use super::*;

    #[test]
    fn the_arithmetic_is_the_local_buckets() {
        let s = Spec::of(&Limit::per_minute(Kind::Output, 60));
        assert_eq!(s.field, "60000000000:output:60");
        let w = 60_000_000_000u128;
        assert_eq!(s.args()[3], (60 * w).to_string());
        assert_eq!(s.fit(0, 1), Some(Duration::from_secs(1)));
        assert_eq!(s.fit(0, 61), None);
        assert_eq!(s.fit(60 * w, 60), Some(Duration::ZERO));
        // Half a token held: 29.5 more take 29.5 s.
        assert_eq!(s.fit(w + w / 2, 31), Some(Duration::from_millis(29_500)));
        assert_eq!(s.available(6 * w + w / 2), 6);
        assert_eq!(s.uncovered(6 * w + w / 2, 10), 4);
        assert_eq!(s.uncovered(6 * w, 6), 0);
        // 7 tokens per 10 s: one token every 10/7 s, rounded up to the nanosecond.
        let s = Spec::of(&Limit::new(
            Window::Every(Duration::from_secs(10)),
            Kind::Total,
            7,
        ));
        assert_eq!(s.fit(0, 1), Some(Duration::from_nanos(1_428_571_429)));
        // A zero limit fits only nothing.
        let zero = Spec::of(&Limit::per_day(Kind::Input, 0));
        assert_eq!(
            (zero.fit(0, 0), zero.fit(0, 1)),
            (Some(Duration::ZERO), None)
        );
        assert_eq!(Spec::hash_ttl_ms(&[s, zero]), 86_400_000);
        assert_eq!(Spec::hash_ttl_ms(&[]), 1);
    }

    #[test]
    fn the_scarcest_bucket_decides_and_never_beats_a_wait() {
        let minute = Limit::per_minute(Kind::Total, 600);
        let day = Limit::per_day(Kind::Output, 1000);
        let limits = [minute, day];
        let specs: Vec<_> = limits.iter().map(Spec::of).collect();
        let levels = [0, specs[1].units(500)];
        let s = shortfall(&limits, &specs, &levels, |l| {
            l.kind().of(tailguard_tenant::Tokens::new(0, 600))
        })
        .expect("refused");
        assert_eq!((s.limit, s.wanted, s.available), (day, 600, 500));
        assert_eq!(s.retry_after, Some(Duration::from_millis(8_640_000)));
        let s = shortfall(&limits, &specs, &levels, |l| {
            l.kind().of(tailguard_tenant::Tokens::new(0, 700))
        })
        .expect("refused");
        assert_eq!((s.limit, s.wanted, s.retry_after), (minute, 700, None));
        assert!(shortfall(&limits, &specs, &levels, |_| 0).is_none());
    }
}
