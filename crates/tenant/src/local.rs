//! [`LocalStore`]: the buckets of every tenant in this process.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tailguard_core::Tenant;
use tokio::time::Instant;

use crate::bucket::{Bucket, Fit};
use crate::limit::{Limit, Tokens};
use crate::metrics;
use crate::store::{Decision, Reply, Shortfall, Store, Ticket};

/// The fewest accounts a store holds before it looks for idle ones to drop.
const MIN_SWEEP: usize = 64;

/// The in-process [`Store`]: a token bucket per tenant and limit, behind one lock, so a
/// reservation across a tenant's buckets is atomic. The default store of
/// [`TokenBudgetLayer`](crate::TokenBudgetLayer); clones share the buckets.
///
/// **Memory.** A tenant's buckets are created full on its first request. A tenant whose
/// buckets are all full again and who has nothing in flight is forgotten — recreating it full
/// on its next request is the same — when the store grows to twice its size after the last
/// such sweep (and at least 64 tenants): memory stays within twice the tenants seen in the
/// longest window, at an amortised constant cost per request.
///
/// **Use beyond a reservation** (a server that ignores the output limit, a prompt estimated
/// short) is taken from the buckets as far as they hold: a balance never goes below zero. What
/// a bucket could not cover is counted in `tailguard_tenant_overrun_tokens_total{tenant,
/// window, kind}` instead of carried as a debt.
///
/// ```
/// use tailguard_core::Tenant;
/// use tailguard_tenant::{Decision, Kind, Limit, LocalStore, Store, Tokens};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = LocalStore::new();
/// let acme = Tenant::new("acme");
/// let limits = [Limit::per_minute(Kind::Output, 100)];
/// let Decision::Reserved(ticket) = store.reserve(&acme, &limits, Tokens::new(0, 80)).await else {
///     panic!("100 tokens hold 80");
/// };
/// assert_eq!(store.available("acme", &limits[0]), 20);
/// // The answer was 30 tokens long: 50 come back.
/// store.reconcile(&acme, &limits, ticket, Tokens::new(0, 80), Tokens::new(0, 30));
/// assert_eq!(store.available("acme", &limits[0]), 70);
/// # }
/// ```
#[derive(Clone, Default)]
pub struct LocalStore {
    inner: Arc<Mutex<Accounts>>,
}

#[derive(Default)]
struct Accounts {
    map: HashMap<Arc<str>, Account>,
    /// The size at which the next sweep runs.
    sweep_at: usize,
}

/// One tenant's buckets and its reservations in flight.
#[derive(Default)]
struct Account {
    buckets: Vec<Bucket>,
    in_flight: u64,
}

impl Account {
    /// The bucket of `limit`, brought up to date (created full if new).
    fn bucket(&mut self, limit: &Limit, now: Instant) -> &mut Bucket {
        let i = match self.buckets.iter().position(|b| b.limit() == limit) {
            Some(i) => i,
            None => {
                self.buckets.push(Bucket::full(*limit, now));
                self.buckets.len() - 1
            }
        };
        let b = &mut self.buckets[i];
        b.refill(now);
        b
    }

    /// Nothing in flight and every bucket full: the account can be forgotten.
    fn is_idle(&mut self, now: Instant) -> bool {
        self.in_flight == 0
            && self.buckets.iter_mut().all(|b| {
                b.refill(now);
                b.is_full()
            })
    }
}

impl LocalStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whole tokens `tenant`'s bucket of `limit` holds now (the limit's tokens for a tenant
    /// the store does not hold: its bucket would be created full).
    pub fn available(&self, tenant: &str, limit: &Limit) -> u64 {
        let now = Instant::now();
        let mut accounts = self.lock();
        match accounts.map.get_mut(tenant) {
            Some(account) => account.bucket(limit, now).available(),
            None => limit.tokens(),
        }
    }

    /// The tenants the store holds buckets of (idle ones are dropped as it grows).
    pub fn tenants(&self) -> usize {
        self.lock().map.len()
    }

    fn lock(&self) -> MutexGuard<'_, Accounts> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Accounts {
    /// Forgets idle accounts once the map has doubled since the last sweep.
    fn maybe_sweep(&mut self, now: Instant) {
        if self.map.len() < self.sweep_at.max(MIN_SWEEP) {
            return;
        }
        self.map.retain(|_, account| !account.is_idle(now));
        self.sweep_at = self.map.len() * 2;
    }
}

/// Whether `b`'s refusal is a stronger one than `a`'s: one that never fits beats a wait, a
/// longer wait beats a shorter one.
fn worse(a: &Shortfall, b: &Shortfall) -> bool {
    match (a.retry_after, b.retry_after) {
        (_, None) => a.retry_after.is_some(),
        (None, Some(_)) => false,
        (Some(x), Some(y)) => y > x,
    }
}

impl Store for LocalStore {
    fn reserve(&self, tenant: &Tenant, limits: &[Limit], want: Tokens) -> Reply {
        let now = Instant::now();
        let mut accounts = self.lock();
        if !accounts.map.contains_key(tenant.id()) {
            accounts.maybe_sweep(now);
        }
        let account = accounts.map.entry(tenant.shared_id()).or_default();
        let mut short: Option<Shortfall> = None;
        for limit in limits {
            let wanted = limit.kind().of(want);
            let bucket = account.bucket(limit, now);
            let retry_after = match bucket.fit(wanted) {
                Fit::Now => continue,
                Fit::After(wait) => Some(wait),
                Fit::Never => None,
            };
            let s = Shortfall {
                limit: *limit,
                wanted,
                available: bucket.available(),
                retry_after,
            };
            if short.as_ref().is_none_or(|cur| worse(cur, &s)) {
                short = Some(s);
            }
        }
        if let Some(s) = short {
            return Reply::Ready(Decision::Refused(s));
        }
        for limit in limits {
            account.bucket(limit, now).take(limit.kind().of(want));
        }
        account.in_flight += 1;
        Reply::Ready(Decision::Reserved(Ticket::default()))
    }

    fn reconcile(
        &self,
        tenant: &Tenant,
        limits: &[Limit],
        _ticket: Ticket,
        reserved: Tokens,
        used: Tokens,
    ) {
        let now = Instant::now();
        let mut accounts = self.lock();
        let account = accounts.map.entry(tenant.shared_id()).or_default();
        account.in_flight = account.in_flight.saturating_sub(1);
        for limit in limits {
            let (r, u) = (limit.kind().of(reserved), limit.kind().of(used));
            let bucket = account.bucket(limit, now);
            if r >= u {
                bucket.refund(r - u);
            } else {
                let overrun = bucket.charge(u - r);
                if overrun > 0 {
                    metrics::overrun(tenant, limit, overrun);
                }
            }
        }
    }
}

impl fmt::Debug for LocalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalStore")
            .field("tenants", &self.tenants())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limit::{Kind, Window};

    fn reserve(store: &LocalStore, t: &Tenant, limits: &[Limit], want: Tokens) -> Decision {
        match store.reserve(t, limits, want) {
            Reply::Ready(d) => d,
            Reply::Later(_) => panic!("the local store answers at once"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn all_or_nothing_and_the_scarcest_bucket_decides() {
        let store = LocalStore::new();
        let t = Tenant::new("t");
        let minute = Limit::per_minute(Kind::Total, 600);
        let day = Limit::per_day(Kind::Output, 1000);
        let limits = [minute, day];
        assert!(matches!(
            reserve(&store, &t, &limits, Tokens::new(100, 500)),
            Decision::Reserved(_)
        ));
        // The minute bucket holds 0 (refills 10/s), the day bucket 500 (refills 1 per 86.4 s).
        let Decision::Refused(s) = reserve(&store, &t, &limits, Tokens::new(0, 600)) else {
            panic!("refused");
        };
        // 600 output tokens: the minute frees them in 60 s, the day bucket in 100 * 86.4 s.
        assert_eq!(s.limit, day);
        assert_eq!((s.wanted, s.available), (600, 500));
        assert_eq!(s.retry_after, Some(Duration::from_millis(8_640_000)));
        // Nothing was taken by the refusal.
        assert_eq!(store.available("t", &day), 500);
        // 700 in all can never fit the minute's 600, whatever the day bucket would wait.
        let Decision::Refused(s) = reserve(&store, &t, &limits, Tokens::new(0, 700)) else {
            panic!("refused");
        };
        assert_eq!((s.limit, s.wanted, s.retry_after), (minute, 700, None));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_tenants_are_forgotten_as_the_store_grows() {
        let store = LocalStore::new();
        let limits = [Limit::new(
            Window::Every(Duration::from_secs(1)),
            Kind::Output,
            10,
        )];
        let busy = Tenant::new("busy");
        assert!(matches!(
            reserve(&store, &busy, &limits, Tokens::new(0, 5)),
            Decision::Reserved(_)
        ));
        for i in 0..MIN_SWEEP - 1 {
            let t = Tenant::new(format!("t{i}"));
            let d = reserve(&store, &t, &limits, Tokens::new(0, 1));
            store.reconcile(&t, &limits, Ticket(0), Tokens::new(0, 1), Tokens::new(0, 1));
            assert!(matches!(d, Decision::Reserved(_)));
        }
        assert_eq!(store.tenants(), MIN_SWEEP);
        tokio::time::advance(Duration::from_secs(1)).await;
        // The next new tenant sweeps: every refilled, idle tenant goes; `busy` has one in flight.
        reserve(&store, &Tenant::new("new"), &limits, Tokens::new(0, 1));
        assert_eq!(store.tenants(), 2);
        // Settling `busy` later finds its account.
        store.reconcile(
            &busy,
            &limits,
            Ticket(0),
            Tokens::new(0, 5),
            Tokens::new(0, 1),
        );
        assert_eq!(store.tenants(), 2);
    }
}
