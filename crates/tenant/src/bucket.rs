//! [`Bucket`]: one token bucket, in exact integer arithmetic.
//!
//! A limit of `C` tokens per window of `W` nanoseconds refills at `C / W` tokens per
//! nanosecond. Counting the level in units of `1 / W` of a token makes that rate a whole
//! number — `C` units per nanosecond — so refills, reservations, refunds and waits are exact:
//! no rounding drifts a budget over a day of traffic, and a paused clock gives exact seconds.
//! A window is at most `u64::MAX` nanoseconds (584 years), so every product of tokens and
//! window fits a `u128`.

use std::time::Duration;

use tokio::time::Instant;

use crate::limit::Limit;

/// Whether a reservation fits a bucket now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fit {
    /// The bucket holds it.
    Now,
    /// The bucket holds it after this wait (if nothing else is taken or refunded meanwhile).
    After(Duration),
    /// It is more than the bucket's capacity: it never fits.
    Never,
}

/// One token bucket: a [`Limit`]'s capacity, its level, and when it was last refilled.
#[derive(Clone, Debug)]
pub(crate) struct Bucket {
    limit: Limit,
    /// The level in units of `1 / window` of a token (see the module docs).
    level: u128,
    /// When the level was last brought up to date.
    at: Instant,
}

impl Bucket {
    /// A full bucket for `limit`, as of `now`.
    pub(crate) fn full(limit: Limit, now: Instant) -> Self {
        let mut b = Bucket {
            limit,
            level: 0,
            at: now,
        };
        b.level = b.capacity();
        b
    }

    pub(crate) fn limit(&self) -> &Limit {
        &self.limit
    }

    fn window(&self) -> u128 {
        self.limit.window().nanos().min(u128::from(u64::MAX))
    }

    fn units(&self, tokens: u64) -> u128 {
        u128::from(tokens) * self.window()
    }

    fn capacity(&self) -> u128 {
        self.units(self.limit.tokens())
    }

    /// Adds what the time since the last refill earned, up to the capacity.
    pub(crate) fn refill(&mut self, now: Instant) {
        if now <= self.at {
            return;
        }
        let elapsed = now
            .duration_since(self.at)
            .as_nanos()
            .min(u128::from(u64::MAX));
        let earned = elapsed * u128::from(self.limit.tokens());
        self.level = self.level.saturating_add(earned).min(self.capacity());
        self.at = now;
    }

    /// Whether `tokens` fit now (call [`refill`](Self::refill) first).
    pub(crate) fn fit(&self, tokens: u64) -> Fit {
        let need = self.units(tokens);
        if tokens > self.limit.tokens() {
            Fit::Never
        } else if self.level >= need {
            Fit::Now
        } else {
            // `tokens <= capacity` and the level is short, so the limit has tokens: no zero.
            let rate = u128::from(self.limit.tokens());
            let nanos = (need - self.level).div_ceil(rate);
            Fit::After(Duration::from_nanos(
                u64::try_from(nanos).unwrap_or(u64::MAX),
            ))
        }
    }

    /// Takes `tokens`, which must [`fit`](Self::fit) now.
    pub(crate) fn take(&mut self, tokens: u64) {
        self.level = self.level.saturating_sub(self.units(tokens));
    }

    /// Gives `tokens` back, up to the capacity.
    pub(crate) fn refund(&mut self, tokens: u64) {
        self.level = self
            .level
            .saturating_add(self.units(tokens))
            .min(self.capacity());
    }

    /// Takes `tokens` used beyond a reservation, as far as the level goes (it never goes
    /// below zero); returns the whole tokens it could not cover.
    pub(crate) fn charge(&mut self, tokens: u64) -> u64 {
        let need = self.units(tokens);
        if need <= self.level {
            self.level -= need;
            return 0;
        }
        let covered = self.available();
        self.level = 0;
        tokens - covered
    }

    /// Whole tokens the bucket holds.
    pub(crate) fn available(&self) -> u64 {
        u64::try_from(self.level / self.window()).unwrap_or(u64::MAX)
    }

    /// Whether the bucket is full (call [`refill`](Self::refill) first).
    pub(crate) fn is_full(&self) -> bool {
        self.level >= self.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Kind, Window};

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_per_minute_limit_bursts_then_refills_one_token_per_second() {
        let t0 = Instant::now();
        let mut b = Bucket::full(Limit::per_minute(Kind::Output, 60), t0);
        assert_eq!(b.fit(60), Fit::Now);
        b.take(60);
        assert_eq!(b.available(), 0);
        assert_eq!(b.fit(1), Fit::After(secs(1)));
        assert_eq!(b.fit(30), Fit::After(secs(30)));
        assert_eq!(b.fit(61), Fit::Never);
        b.refill(t0 + Duration::from_millis(1500));
        assert_eq!(b.available(), 1);
        // Half a token is there already: 29.5 more take 29.5 s.
        assert_eq!(b.fit(31), Fit::After(Duration::from_millis(29_500)));
        b.refill(t0 + secs(3600));
        assert!(b.is_full());
        assert_eq!(b.available(), 60);
    }

    #[test]
    fn waits_round_up_to_the_nanosecond_and_refunds_stop_at_the_capacity() {
        let t0 = Instant::now();
        // 7 tokens per 10 s: one token every 10/7 s.
        let mut b = Bucket::full(Limit::new(Window::Every(secs(10)), Kind::Total, 7), t0);
        b.take(7);
        assert_eq!(b.fit(1), Fit::After(Duration::from_nanos(1_428_571_429)));
        b.refund(3);
        assert_eq!(b.available(), 3);
        b.refund(100);
        assert!(b.is_full());
    }

    #[test]
    fn charges_beyond_the_level_stop_at_zero_and_report_what_was_not_covered() {
        let t0 = Instant::now();
        let mut b = Bucket::full(Limit::per_minute(Kind::Input, 60), t0);
        b.take(50);
        assert_eq!(b.charge(4), 0);
        assert_eq!(b.available(), 6);
        b.refill(t0 + Duration::from_millis(500));
        // 6.5 tokens held: 6 whole ones cover 6 of 10.
        assert_eq!(b.charge(10), 4);
        assert_eq!((b.available(), b.fit(1)), (0, Fit::After(secs(1))));
    }

    #[test]
    fn a_zero_limit_fits_only_nothing_and_huge_values_do_not_overflow() {
        let t0 = Instant::now();
        let b = Bucket::full(Limit::per_day(Kind::Output, 0), t0);
        assert_eq!((b.fit(0), b.fit(1)), (Fit::Now, Fit::Never));
        let forever = Window::Every(Duration::MAX);
        let mut b = Bucket::full(Limit::new(forever, Kind::Total, u64::MAX), t0);
        b.take(u64::MAX);
        assert!(matches!(b.fit(u64::MAX), Fit::After(_)));
        b.refill(t0 + secs(1_000_000_000));
        b.refund(u64::MAX);
        assert_eq!(b.available(), u64::MAX);
        let zero = Bucket::full(
            Limit::new(Window::Every(Duration::ZERO), Kind::Total, 5),
            t0,
        );
        assert_eq!(zero.available(), 5);
    }
}
