//! The budgets: token buckets that bound extra attempts to a share of requests, one for
//! delay-triggered hedges and one for failovers.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use crate::shared_budget::{Reconciled, SharedBudget};

/// One token, in the bucket's fixed-point unit.
const UNIT: i64 = 1_000_000;

/// Limits the extra attempts of one kind a layer sends: delay-triggered hedges
/// ([`FirstTokenHedgeLayer::with_budget`](crate::FirstTokenHedgeLayer::with_budget), default
/// [`HedgeBudget::new`]) or failovers after a failure before the first token
/// ([`with_failover_budget`](crate::FirstTokenHedgeLayer::with_failover_budget), default
/// [`HedgeBudget::failover`]). The two are separate, so a flaky replica's failovers still go
/// out once slow first tokens have spent the hedge budget, and the other way round.
///
/// A token bucket: every eligible request deposits [`ratio`](HedgeBudget::with_ratio) of a
/// token, time deposits [`floor`](HedgeBudget::with_floor) tokens per second (so that a
/// lightly loaded service can still hedge), the balance never exceeds
/// [`max_balance`](HedgeBudget::with_max_balance), and every extra attempt withdraws one
/// token. When the bucket is empty no extra attempt is sent, the request goes on with the
/// attempts it has, and `tailguard_hedge_budget_exhausted_total{budget="hedge"|"failover"}`
/// counts the refusal (`tailguard_hedge_budget_withdrawn_total{budget}` counts the tokens
/// used). Over any period the extra attempts are at most `ratio × requests + floor × seconds +`
/// the balance at its start: from a layer's start, with the hedge defaults (no floor, one
/// token), one backup per ten requests and one more. The one exception is a stuck primary: a
/// backup refused twice is asked for a third time after seven delays, and then borrows from
/// the deposits to come (at most one max balance deep, repaid first), so that a request stuck
/// behind a replica that stopped answering is backed up whatever the budget (see
/// [`FirstTokenHedgeLayer::with_budget`](crate::FirstTokenHedgeLayer::with_budget)).
#[derive(Clone, Debug, PartialEq)]
pub struct HedgeBudget {
    pub(crate) ratio: f64,
    pub(crate) floor_per_sec: f64,
    pub(crate) max_balance: f64,
    /// The balance it starts with (at most `max_balance`); `None`: full.
    pub(crate) initial: Option<f64>,
    pub(crate) unlimited: bool,
    pub(crate) shared: Option<SharedBudget>,
}

impl Default for HedgeBudget {
    fn default() -> Self {
        Self::new()
    }
}

impl HedgeBudget {
    /// The defaults:
    ///
    /// * ratio **0.1**: at most one extra attempt per ten requests, so hedging can never add
    ///   more than 10% load to an upstream that is already slow;
    /// * floor **0 per second**: the ratio alone, so the promise holds at the request rates LLM
    ///   routes see (a floor of 1/s would license a backup for two requests in three at
    ///   1.5 requests per second); the ratio already gives a slow service one hedge per ten
    ///   requests whatever its rate;
    /// * max balance **10 tokens**: enough for a short burst of slow first tokens, small
    ///   enough that a long quiet period does not license a hedge storm;
    /// * initial balance **1 token**: the first slow request may be hedged (a new user's first
    ///   try of a slow replica shows a backup winning), and over any run from the start the
    ///   backups stay within `1 + ratio × requests`, stuck primaries' borrowed ones apart (a
    ///   full bucket let a 30-request run hedge a third of its requests, issue 29).
    pub fn new() -> Self {
        HedgeBudget {
            ratio: 0.1,
            floor_per_sec: 0.0,
            max_balance: 10.0,
            initial: Some(1.0),
            unlimited: false,
            shared: None,
        }
    }

    /// The failover defaults (linkerd's and Finagle's retry budgets):
    ///
    /// * ratio **0.2**: a failover for up to one request in five, enough to hide a replica
    ///   that fails a large share of its requests, bounded so that a failing fleet is not
    ///   hit with a retry storm;
    /// * floor **1 per second**: a failover replaces an attempt that already failed, so a
    ///   service at a few requests per second whose replica is down still fails over every
    ///   request (Finagle's and linkerd's budgets have the same floor);
    /// * max balance **10 tokens**, as for hedges, and the bucket starts full: a failover
    ///   replaces an attempt that already failed, so a replica that is down at start-up is
    ///   failed over from the first request.
    pub fn failover() -> Self {
        let mut b = Self::new().with_ratio(0.2).with_floor(1.0);
        b.initial = None;
        b
    }

    /// A budget that grants nothing: no extra attempt of its kind is ever sent (no deposit,
    /// no floor, no balance, and a shared backend is not asked).
    ///
    /// ```
    /// use tailguard_hedge::{FirstTokenHedgeLayer, HedgeBudget};
    ///
    /// // Hedge slow first tokens, but never fail over.
    /// let layer = FirstTokenHedgeLayer::new().with_failover_budget(HedgeBudget::none());
    /// # let _ = layer;
    /// ```
    pub fn none() -> Self {
        HedgeBudget {
            ratio: 0.0,
            floor_per_sec: 0.0,
            max_balance: 0.0,
            initial: None,
            unlimited: false,
            shared: None,
        }
    }

    /// No budget: every extra attempt the delay and failures call for is sent.
    pub fn unlimited() -> Self {
        HedgeBudget {
            unlimited: true,
            ..Self::new()
        }
    }

    /// Sets the share of requests that may be hedged (clamped to `0.0..=4.0`: with five
    /// attempts a request can use four extra ones).
    pub fn with_ratio(mut self, ratio: f64) -> Self {
        self.ratio = if ratio.is_nan() {
            0.0
        } else {
            ratio.clamp(0.0, 4.0)
        };
        self
    }

    /// Sets the floor rate, in tokens per second.
    pub fn with_floor(mut self, per_sec: f64) -> Self {
        self.floor_per_sec = if per_sec.is_nan() {
            0.0
        } else {
            per_sec.max(0.0)
        };
        self
    }

    /// Shares this budget with other gateways through a backend (see
    /// [`SharedBudget`]): the extra attempts of all of them together stay within it. The
    /// local bucket of this configuration is the fallback while the backend fails.
    pub fn with_shared(mut self, shared: SharedBudget) -> Self {
        self.shared = Some(shared);
        self
    }

    /// Sets the largest balance the bucket holds (at least one token).
    pub fn with_max_balance(mut self, tokens: f64) -> Self {
        self.max_balance = if tokens.is_nan() {
            1.0
        } else {
            tokens.max(1.0)
        };
        self
    }

    /// Sets the balance the bucket starts with (clamped to `0..=max_balance`).
    pub fn with_initial_balance(mut self, tokens: f64) -> Self {
        self.initial = Some(if tokens.is_nan() {
            0.0
        } else {
            tokens.max(0.0)
        });
        self
    }
}

/// The two budgets of one layer.
#[derive(Debug)]
pub(crate) struct Budgets {
    hedge: Bucket,
    failover: Bucket,
}

impl Budgets {
    pub(crate) fn new(hedge: &HedgeBudget, failover: &HedgeBudget) -> Self {
        Budgets {
            hedge: Bucket::new(hedge, "hedge"),
            failover: Bucket::new(failover, "failover"),
        }
    }

    /// An eligible request arrived: both buckets earn their share.
    pub(crate) fn deposit(&self) {
        self.hedge.deposit();
        self.failover.deposit();
    }

    /// Takes a token for an extra attempt from the failover budget (`failover`) or the hedge
    /// budget; `false` when that bucket is empty. Both outcomes are counted.
    pub(crate) fn withdraw(&self, failover: bool, now: Instant) -> bool {
        let bucket = if failover {
            &self.failover
        } else {
            &self.hedge
        };
        bucket.spend(now)
    }

    /// Takes a token from the hedge budget for the backup of a stuck primary, from an empty
    /// bucket too (see [`Bucket::borrow`]); both outcomes are counted as for any withdrawal.
    pub(crate) fn borrow(&self, now: Instant) -> bool {
        self.hedge.counted(self.hedge.borrow(now))
    }
}

/// The shared state of one budget.
#[derive(Debug)]
pub(crate) struct Bucket {
    label: &'static str,
    unlimited: bool,
    per_request: i64,
    floor_per_sec: f64,
    max: i64,
    state: Mutex<State>,
    shared: Option<Arc<Reconciled>>,
}

#[derive(Debug)]
struct State {
    /// In [`UNIT`]s, so that ten deposits of a tenth make exactly one token.
    balance: i64,
    /// When the floor rate last paid into the balance.
    last_floor: Instant,
}

impl Bucket {
    pub(crate) fn new(b: &HedgeBudget, label: &'static str) -> Self {
        let max = (b.max_balance * UNIT as f64) as i64;
        Bucket {
            label,
            unlimited: b.unlimited,
            per_request: (b.ratio * UNIT as f64) as i64,
            floor_per_sec: b.floor_per_sec,
            max,
            shared: (!b.unlimited)
                .then(|| b.shared.clone())
                .flatten()
                .map(|s| Reconciled::new(s, b.floor_per_sec, b.max_balance)),
            state: Mutex::new(State {
                balance: b
                    .initial
                    .map_or(max, |t| ((t * UNIT as f64) as i64).min(max)),
                last_floor: Instant::now(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An eligible request arrived.
    pub(crate) fn deposit(&self) {
        if let Some(s) = &self.shared {
            s.deposit(self.per_request as f64 / UNIT as f64);
        }
        if !self.unlimited {
            let mut st = self.state();
            st.balance = st.balance.saturating_add(self.per_request).min(self.max);
        }
    }

    /// Takes a token for an extra attempt, as [`withdraw`](Self::withdraw) does, and counts
    /// both outcomes under the bucket's label.
    pub(crate) fn spend(&self, now: Instant) -> bool {
        self.counted(self.withdraw(now))
    }

    /// Counts the outcome `ok` of a request for a token under the bucket's label; returns it.
    fn counted(&self, ok: bool) -> bool {
        let name = if ok {
            "tailguard_hedge_budget_withdrawn_total"
        } else {
            "tailguard_hedge_budget_exhausted_total"
        };
        metrics::counter!(name, "budget" => self.label).increment(1);
        ok
    }

    /// Takes one token for an extra attempt; `false` when the bucket is empty.
    fn withdraw(&self, now: Instant) -> bool {
        if self.unlimited {
            return true;
        }
        if self.max == 0 {
            // `HedgeBudget::none`: nothing to grant, here or in a shared backend.
            return false;
        }
        if let Some(granted) = self.shared.as_ref().and_then(|s| s.withdraw()) {
            return granted;
        }
        let mut st = self.earned(now);
        if st.balance < UNIT {
            return false;
        }
        st.balance -= UNIT;
        true
    }

    /// Takes one token, from an empty bucket too: it goes into debt, which the deposits that
    /// follow repay before any withdrawal succeeds; `false` when the debt is already one max
    /// balance deep. [`HedgeBudget::none`] lends nothing, and a budget shared across gateways
    /// only withdraws (each gateway's own debt would add a max balance to the cluster's bound).
    fn borrow(&self, now: Instant) -> bool {
        if self.unlimited {
            return true;
        }
        if self.max == 0 {
            return false;
        }
        if self.shared.is_some() {
            return self.withdraw(now);
        }
        let mut st = self.earned(now);
        if st.balance - UNIT < -self.max {
            return false;
        }
        st.balance -= UNIT;
        true
    }

    /// The state, with the floor rate's earnings since it last paid paid in.
    fn earned(&self, now: Instant) -> MutexGuard<'_, State> {
        let mut st = self.state();
        let elapsed = now.saturating_duration_since(st.last_floor);
        let earned = (elapsed.as_secs_f64() * self.floor_per_sec * UNIT as f64) as i64;
        if earned > 0 {
            st.balance = st.balance.saturating_add(earned).min(self.max);
            st.last_floor = now;
        }
        st
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn ratio_and_floor_bound_withdrawals() {
        let b = Bucket::new(
            &HedgeBudget::new()
                .with_ratio(0.1)
                .with_floor(0.0)
                .with_max_balance(2.0),
            "hedge",
        );
        let now = Instant::now();
        // Starts with one token; then nine requests earn no token, the tenth one.
        assert!(b.withdraw(now));
        assert!(!b.withdraw(now));
        for _ in 0..9 {
            b.deposit();
        }
        assert!(!b.withdraw(now));
        b.deposit();
        assert!(b.withdraw(now));
        assert!(!b.withdraw(now));
        // Started full: the initial balance is capped by the largest.
        let full = HedgeBudget::new()
            .with_max_balance(2.0)
            .with_initial_balance(5.0);
        let b = Bucket::new(&full, "hedge");
        assert!(b.withdraw(now) && b.withdraw(now));
        assert!(!b.withdraw(now));
        // The failover budget starts full.
        let b = Bucket::new(&HedgeBudget::failover(), "failover");
        assert!((0..10).all(|_| b.withdraw(now)));
        assert!(!b.withdraw(now));
    }

    /// Issue 29: the defaults' promise, one backup per ten requests and the starting one,
    /// holds over every prefix of a run from the start, however the asks fall.
    #[tokio::test(start_paused = true)]
    async fn the_defaults_grant_one_backup_per_ten_requests_and_one_from_the_start() {
        let b = Budgets::new(&HedgeBudget::new(), &HedgeBudget::failover());
        let now = Instant::now();
        let mut granted = 0;
        for request in 1..=200u32 {
            b.deposit();
            // Every request asks, the slow ones of a burst twice.
            let asks = if request % 7 == 0 { 2 } else { 1 };
            for _ in 0..asks {
                granted += u32::from(b.withdraw(false, now));
            }
            assert!(
                granted * 10 <= request + 10,
                "{granted} backups after {request} requests"
            );
        }
        assert_eq!(granted, 21);
    }

    #[tokio::test(start_paused = true)]
    async fn floor_refills_with_time_up_to_the_cap() {
        let b = Bucket::new(
            &HedgeBudget::new()
                .with_ratio(0.0)
                .with_floor(2.0)
                .with_max_balance(3.0)
                .with_initial_balance(3.0),
            "hedge",
        );
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(b.withdraw(t0));
        }
        assert!(!b.withdraw(t0));
        assert!(b.withdraw(t0 + Duration::from_millis(500)));
        assert!(!b.withdraw(t0 + Duration::from_millis(500)));
        let later = t0 + Duration::from_secs(100);
        for _ in 0..3 {
            assert!(b.withdraw(later));
        }
        assert!(!b.withdraw(later));
    }

    #[tokio::test(start_paused = true)]
    async fn unlimited_never_refuses() {
        let b = Bucket::new(&HedgeBudget::unlimited(), "hedge");
        for _ in 0..100 {
            assert!(b.withdraw(Instant::now()));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_two_budgets_are_separate() {
        let one = HedgeBudget::new()
            .with_ratio(0.0)
            .with_floor(0.0)
            .with_max_balance(1.0)
            .with_initial_balance(1.0);
        let two = one.clone().with_max_balance(2.0).with_initial_balance(2.0);
        let b = Budgets::new(&one, &two);
        let now = Instant::now();
        assert!(b.withdraw(false, now));
        assert!(!b.withdraw(false, now));
        assert!(b.withdraw(true, now));
        assert!(b.withdraw(true, now));
        assert!(!b.withdraw(true, now));
    }
}
