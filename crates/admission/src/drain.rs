//! How fast a gate drains: the hold times of its permits, per class, and the `Retry-After` of a
//! refusal derived from them.
//!
//! A permit's *hold time* runs from its admission to its release (the response body ended, or
//! was dropped). A refusal means the gate is full, and a full gate frees capacity at the units it
//! holds divided by the mean hold time per unit (Little's law): `k` units held `h` seconds each
//! free one unit every `h / k` seconds. So a refused request of `u` units, with `b` units queued
//! ahead of it, can be admitted after about `(b + u) × h / k`.

use std::time::Duration;

use tokio::time::Instant;

use crate::queue::Queue;

/// Time constant of the decayed mean of ended holds: 10 s.
///
/// A hold that ended 10 s ago weighs e⁻¹ of one that just ended. Streamed answers hold their
/// permits for seconds to tens of seconds, so a change in the upstream's speed or in what
/// clients ask moves the estimate within one or two answer lengths, while a busy gate still
/// averages over many holds.
const HOLD_WINDOW: Duration = Duration::from_secs(10);

/// Upper bound of `Retry-After`: 60 s.
///
/// A client told to wait longer than a minute is better served trying elsewhere, and a longer
/// figure would extrapolate far past the holds the gate has seen.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The hold times of the permits of one class (or of the whole gate).
///
/// Ended holds are averaged with exponentially decaying weights (per unit held); permits still
/// held count as censored samples: each will be held at least as long as it has been so far.
pub(crate) struct Holds {
    epoch: Instant,
    /// Units held now.
    held: u64,
    /// Σ units × admission time (nanoseconds since `epoch`) over the permits held now.
    admitted_ns: u128,
    /// Decayed mean of ended holds, seconds per unit; `None` before the first release.
    mean: Option<f64>,
    /// The weight (units, decayed) behind `mean` as of `last`.
    weight: f64,
    last: Instant,
}

impl Holds {
    pub(crate) fn new(now: Instant) -> Self {
        Holds {
            epoch: now,
            held: 0,
            admitted_ns: 0,
            mean: None,
            weight: 0.0,
            last: now,
        }
    }

    fn ns(&self, t: Instant) -> u128 {
        t.saturating_duration_since(self.epoch).as_nanos()
    }

    fn weight_at(&self, now: Instant) -> f64 {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.weight * (-dt / HOLD_WINDOW.as_secs_f64()).exp()
    }

    /// Counts a permit of `units` admitted at `now`.
    pub(crate) fn admit(&mut self, now: Instant, units: u32) {
        self.held += u64::from(units);
        self.admitted_ns += u128::from(units) * self.ns(now);
    }

    /// Counts the release at `now` of a permit of `units` admitted at `admitted`.
    pub(crate) fn release(&mut self, now: Instant, admitted: Instant, units: u32) {
        self.held -= u64::from(units);
        self.admitted_ns -= u128::from(units) * self.ns(admitted);
        let hold = now.saturating_duration_since(admitted).as_secs_f64();
        let (w, u) = (self.weight_at(now), f64::from(units));
        let mean = self.mean.map_or(hold, |m| (m * w + hold * u) / (w + u));
        self.mean = Some(mean);
        self.weight = w + u;
        self.last = now;
    }

    /// The hold time per unit to expect, in seconds: the mean of the ended holds (at their
    /// decayed weights) and of the permits still held (at their age so far, one weight per
    /// unit), but never below the mean of the ended holds alone, since a permit still held is no
    /// evidence that holds got shorter. Before any release it is the mean age of the permits
    /// held. `None` when the gate never held anything of this class.
    pub(crate) fn estimate(&self, now: Instant) -> Option<f64> {
        let held = self.held as f64;
        let held_age_ns = (u128::from(self.held) * self.ns(now)).saturating_sub(self.admitted_ns);
        let held_age = held_age_ns as f64 / 1e9;
        let w = self.weight_at(now);
        if w + held <= 0.0 {
            return self.mean;
        }
        let pooled = (self.mean.unwrap_or(0.0) * w + held_age) / (w + held);
        Some(self.mean.map_or(pooled, |m| m.max(pooled)))
    }
}

/// How long a request of `units` in class `class` arriving at `now` can expect to wait in the
/// queue: until the work queued ahead of it, and its own units, can be admitted (zero before
/// the gate has seen any hold, at most [`MAX_RETRY_AFTER`]). A refusal's `Retry-After` is this
/// in [`whole_seconds`].
///
/// Ahead of a class are the waiters of its own and higher classes (lower ones are served after
/// it and evicted for it). They are admitted as the capacity left to the class frees: the
/// capacity less the reserved shares of lower classes that have waiters (those slots go back to
/// their class), at the gate-wide hold time, since whatever holds the shared capacity frees it.
/// A class with a reserved share also drains its own waiters through its reserved units, at its
/// own hold time; the sooner of the two wins.
pub(crate) fn expected_wait(
    queue: &Queue,
    gate: &Holds,
    capacity: u32,
    class: usize,
    units: u32,
    now: Instant,
) -> Duration {
    let c = &queue.classes[class];
    let level = c.priority.level();
    let mut ahead = u64::from(units);
    let mut share = f64::from(capacity);
    for d in &queue.classes {
        if d.priority.level() >= level {
            ahead += d.queued_units;
        } else if !d.waiters.is_empty() {
            share -= f64::from(d.reserved);
        }
    }
    let hold = gate.estimate(now).unwrap_or(0.0);
    let mut secs = ahead as f64 * hold / share.max(1.0);
    if c.reserved > 0 {
        let own = c.queued_units + u64::from(units);
        let hold = c.holds.estimate(now).unwrap_or(hold);
        secs = secs.min(own as f64 * hold / f64::from(c.reserved));
    }
    Duration::try_from_secs_f64(secs.min(MAX_RETRY_AFTER.as_secs_f64())).unwrap_or(MAX_RETRY_AFTER)
}

/// `secs` rounded up to whole seconds, at least 1, at most [`MAX_RETRY_AFTER`].
pub(crate) fn whole_seconds(secs: f64) -> Duration {
    let max = MAX_RETRY_AFTER.as_secs();
    if secs.is_nan() || secs >= max as f64 {
        return MAX_RETRY_AFTER;
    }
    Duration::from_secs((secs.ceil() as u64).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-6)
    }

    #[tokio::test(start_paused = true)]
    async fn before_any_release_the_estimate_is_the_mean_age_of_what_is_held() {
        let t0 = Instant::now();
        let mut h = Holds::new(t0);
        assert_eq!(h.estimate(t0), None, "nothing ever held");
        h.admit(t0, 1);
        h.admit(t0 + secs(2.0), 3);
        assert!(close(h.estimate(t0), 0.0));
        // At 6 s: one unit aged 6 s, three aged 4 s.
        assert!(close(h.estimate(t0 + secs(6.0)), (6.0 + 3.0 * 4.0) / 4.0));
    }

    #[tokio::test(start_paused = true)]
    async fn ended_holds_are_a_decayed_mean_that_held_permits_only_raise() {
        let t0 = Instant::now();
        let mut h = Holds::new(t0);
        h.admit(t0, 1);
        h.admit(t0, 1);
        h.release(t0 + secs(5.0), t0, 1);
        let t = t0 + secs(5.0);
        // A permit held 5 s so far is no evidence of shorter holds.
        assert!(close(h.estimate(t), 5.0));
        // Held on to 20 s, it raises the estimate above the ended mean...
        let t = t0 + secs(20.0);
        let w = (-15.0f64 / 10.0).exp();
        assert!(close(h.estimate(t), (5.0 * w + 20.0) / (w + 1.0)));
        // ...and once released, the ended holds speak alone, kept through an idle spell.
        h.release(t, t0, 1);
        let mean = (5.0 * w + 20.0) / (w + 1.0);
        assert!(close(h.estimate(t), mean));
        assert!(close(h.estimate(t0 + secs(1_000.0)), mean));
        // Shorter holds pull the mean down, the more the newer they are.
        let mut prev = mean;
        for i in 0..20 {
            let at = t + secs(f64::from(i));
            h.admit(at, 1);
            h.release(at + secs(1.0), at, 1);
            let now = h.estimate(at + secs(1.0)).unwrap();
            assert!(now < prev, "{now} after {prev}");
            prev = now;
        }
        assert!(prev < 1.5, "{prev}");
    }

    #[tokio::test(start_paused = true)]
    async fn holds_are_weighted_by_units() {
        let t0 = Instant::now();
        let mut h = Holds::new(t0);
        h.admit(t0, 3);
        h.admit(t0, 1);
        h.release(t0 + secs(2.0), t0, 3);
        h.release(t0 + secs(6.0), t0, 1);
        let w = (-4.0f64 / 10.0).exp();
        let mean = (2.0 * 3.0 * w + 6.0) / (3.0 * w + 1.0);
        assert!(close(h.estimate(t0 + secs(6.0)), mean));
    }

    #[test]
    fn whole_seconds_round_up_with_a_floor_and_a_cap() {
        assert_eq!(whole_seconds(0.0), Duration::from_secs(1));
        assert_eq!(whole_seconds(1.000_1), Duration::from_secs(2));
        assert_eq!(whole_seconds(7.5), Duration::from_secs(8));
        assert_eq!(whole_seconds(59.5), Duration::from_secs(60));
        assert_eq!(whole_seconds(1e12), MAX_RETRY_AFTER);
        assert_eq!(whole_seconds(f64::INFINITY), MAX_RETRY_AFTER);
        assert_eq!(whole_seconds(f64::NAN), MAX_RETRY_AFTER);
    }
}
