//! [`RedisTokenStore`]: `tailguard-tenant`'s token budgets, shared by gateways through Redis.

mod call;
mod lua;
mod spec;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redis::Script;
use tailguard_admission::FailMode;
use tailguard_core::Tenant;
use tailguard_tenant::{Decision, Limit, LocalStore, Reply, Store, Ticket, Tokens};

use crate::Redis;
use spec::Spec;

/// Default timeout of one Redis call: 50 ms, as admission's cluster calls.
pub const DEFAULT_TIMEOUT: Duration = tailguard_admission::DEFAULT_BACKEND_TIMEOUT;
/// Default reservation TTL: 1 hour, longer than any stream should last.
pub const DEFAULT_RESERVATION_TTL: Duration = Duration::from_secs(60 * 60);
/// Default `Retry-After` of a request refused while Redis is unreachable (fail closed): 1 s.
pub const DEFAULT_UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How many times a reconciliation is sent before it is left to expire, and the wait before
/// the second (doubled before each next).
const SETTLE_ATTEMPTS: u32 = 4;
const SETTLE_BACKOFF: Duration = Duration::from_millis(100);

/// The tickets of reservations taken from the fallback store while Redis was unreachable.
const LOCAL: u64 = 1 << 63;

/// Token budgets shared by several gateways through one Redis: a
/// [`Store`](tailguard_tenant::Store) for
/// [`TokenBudgetLayer::with_store`](tailguard_tenant::TokenBudgetLayer::with_store).
///
/// **Same buckets as the local store.** Each limit of a tenant is the token bucket of
/// `LocalStore`, in the same exact integer arithmetic (levels in units of `1 / window` of a
/// token, carried as big integers in Lua), refilled on the Redis server's clock: a tenant's
/// limits mean the same locally and here, and the gateways' clocks need not agree. A
/// reservation takes its share from every bucket of the tenant's limits, or from none, in one
/// Lua script; a reconciliation gives back what was reserved and not used (up to the limit)
/// and takes what was used beyond it (down to zero, never a negative balance), in another.
/// Refusals carry the same [`Shortfall`](tailguard_tenant::Shortfall), so `Retry-After` is
/// computed the same way.
///
/// **Keys.** `{prefix}:{tenant}:tb` holds the tenant's buckets (a hash, a field per limit;
/// it expires one longest window after its last write, when every bucket would be full again)
/// and `{prefix}:{tenant}:r:…` each reservation in flight. The tenant id is the hash tag, so a
/// Redis Cluster keeps a tenant's keys in one slot. The prefix (the cluster name) must not
/// contain `{` or `}`.
///
/// **Reservations expire as used.** Each reservation is recorded with an expiry of
/// [`with_reservation_ttl`](Self::with_reservation_ttl) (1 hour by default), and its
/// reconciliation applies only while the record is there, which it deletes: a second
/// reconciliation of the same reservation is a no-op. One never reconciled — its gateway died
/// mid-stream, or Redis was unreachable for every attempt to send it — is settled **as fully
/// used** when it expires: what it reserved is not given back, and nothing beyond it is
/// taken. So a dead gateway never hands a budget tokens back that may have been used: the
/// most its death leaves uncharged is what its requests used beyond their reservations, and
/// it costs the tenant the unused part of them. The TTL is not renewed: set it above the longest stream
/// (the gateway's total deadline); a stream that outlives it is settled as used too. Its only
/// other cost is the memory of dead gateways' records until they expire.
///
/// **Reconciliation** is synchronous in the [`Store`] trait (it runs from `Drop`), so it is
/// sent from a background task: up to 4 attempts, 100, 200 and 400 ms apart, each bounded by
/// the timeout. A reconciliation that finds no record (already applied by an attempt whose
/// answer was lost, or expired) does nothing, so retries never apply twice. One that every
/// attempt fails to send is left to expire as used, and counted in
/// `tailguard_tenant_reconciles_lost_total{what="settle"}`. A reservation whose answer timed
/// out, or whose [`Reply::Later`] was dropped while Redis decided, is given back the same way
/// (it may have been taken); a give-back that cannot be sent counts as `what="give_back"`
/// (while Redis is down, every reservation that timed out: most were never taken).
///
/// **Failure.** Every call is bounded by [`with_timeout`](Self::with_timeout) (50 ms by
/// default). When a reservation fails or times out the store does as admission's cluster mode:
/// [`FailMode::Open`] (the default) reserves from a [`LocalStore`] of this store's own (each
/// gateway then bounds only its own share: while Redis is down, the gateways together admit up
/// to their number times a budget), [`FailMode::Closed`] refuses with
/// [`Decision::Unavailable`] (503 `cluster_unavailable` and a `Retry-After`). A warning is
/// logged when Redis goes down (an info line when it is back), and
/// `tailguard_tenant_store_errors_total{mode}` counts the requests concerned. Reservations
/// taken from the local store are reconciled there. A Redis restarted without persistence
/// comes back with every bucket full and no reservation in flight (their reconciliations do
/// nothing).
///
/// Use beyond a reservation that a bucket could not cover is counted in
/// `tailguard_tenant_overrun_tokens_total{tenant, window, kind}`, as the local store counts
/// it.
///
/// Per request: one script call to reserve, one to reconcile.
#[derive(Clone)]
pub struct RedisTokenStore {
    inner: Arc<Inner>,
}

/// The configuration and state every clone shares.
struct Inner {
    redis: Redis,
    prefix: String,
    reserve: Script,
    reconcile: Script,
    level: Script,
    timeout: Duration,
    ttl: Duration,
    fail: FailMode,
    retry_after: Duration,
    fallback: LocalStore,
    /// Whether the last reservation failed (to log transitions only).
    down: AtomicBool,
}

impl RedisTokenStore {
    /// Budgets on `redis` under keys `{prefix}:...` (gateways sharing budgets use the same
    /// prefix: the cluster name). Defaults: [`DEFAULT_TIMEOUT`],
    /// [`DEFAULT_RESERVATION_TTL`], [`FailMode::Open`],
    /// [`DEFAULT_UNAVAILABLE_RETRY_AFTER`].
    pub fn new(redis: Redis, prefix: &str) -> Self {
        RedisTokenStore {
            inner: Arc::new(Inner {
                redis,
                prefix: prefix.to_owned(),
                reserve: lua::reserve(),
                reconcile: lua::reconcile(),
                level: lua::level(),
                timeout: DEFAULT_TIMEOUT,
                ttl: DEFAULT_RESERVATION_TTL,
                fail: FailMode::Open,
                retry_after: DEFAULT_UNAVAILABLE_RETRY_AFTER,
                fallback: LocalStore::new(),
                down: AtomicBool::new(false),
            }),
        }
    }

    fn inner(&mut self) -> &mut Inner {
        Arc::get_mut(&mut self.inner).expect("configure a RedisTokenStore before cloning it")
    }

    /// Sets the timeout of each Redis call (at least 1 ms).
    ///
    /// # Panics
    ///
    /// When called on a store that was cloned (configure first), as every `with_` method.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.inner().timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Sets how long a reservation waits for its reconciliation before it is settled as
    /// fully used (at least 1 s): longer than the longest stream.
    pub fn with_reservation_ttl(mut self, ttl: Duration) -> Self {
        self.inner().ttl = ttl.max(Duration::from_secs(1));
        self
    }

    /// Sets what happens while Redis is unreachable.
    pub fn with_fail_mode(mut self, fail: FailMode) -> Self {
        self.inner().fail = fail;
        self
    }

    /// Sets the `Retry-After` of a request refused while Redis is unreachable
    /// ([`FailMode::Closed`]).
    pub fn with_unavailable_retry_after(mut self, retry_after: Duration) -> Self {
        self.inner().retry_after = retry_after;
        self
    }

    /// The local store reservations are taken from while Redis is unreachable
    /// ([`FailMode::Open`]).
    pub fn fallback(&self) -> &LocalStore {
        &self.inner.fallback
    }

    /// Whole tokens `tenant`'s bucket of `limit` holds now in Redis (the limit's tokens for
    /// a bucket Redis does not hold: it would be created full).
    pub async fn available(&self, tenant: &str, limit: &Limit) -> redis::RedisResult<u64> {
        let spec = Spec::of(limit);
        let mut call = self.inner.level.prepare_invoke();
        call.key(self.inner.buckets(tenant)).arg(&spec.args()[..]);
        let mut conn = self.inner.redis.conn();
        let level: String = call.invoke_async(&mut conn).await?;
        Ok(spec.available(call::parse(&level)?))
    }

    /// [`reconcile`](Store::reconcile), awaited, in one attempt bounded by the timeout:
    /// `Ok(true)` when it was applied, `Ok(false)` when there was nothing to settle (settled
    /// before, expired, or never taken). A reservation of the local fallback is settled there
    /// (`Ok(true)`).
    pub async fn settle(
        &self,
        tenant: &Tenant,
        limits: &[Limit],
        ticket: Ticket,
        reserved: Tokens,
        used: Tokens,
    ) -> redis::RedisResult<bool> {
        if ticket.0 & LOCAL != 0 {
            self.inner
                .fallback
                .reconcile(tenant, limits, ticket, reserved, used);
            return Ok(true);
        }
        let settle = call::Settle::new(&self.inner, tenant, limits, ticket, reserved, used);
        settle.once().await
    }
}

impl Inner {
    /// The key of `tenant`'s buckets.
    fn buckets(&self, tenant: &str) -> String {
        format!("{}:{{{tenant}}}:tb", self.prefix)
    }

    /// The key of reservation `ticket` of `tenant`: unique across gateways (this process's
    /// identity and the ticket, unique in it).
    fn reservation(&self, tenant: &str, ticket: Ticket) -> String {
        format!(
            "{}:{{{tenant}}}:r:{}:{}",
            self.prefix,
            crate::leases::instance(),
            ticket.0
        )
    }

    fn up(&self) {
        if self.down.swap(false, Ordering::Relaxed) {
            tracing::info!(prefix = %self.prefix, "tailguard-redis: token budget store back");
        }
    }

    /// A reservation that Redis did not answer: the fallback's decision, or unavailable.
    async fn failed(
        &self,
        e: &(dyn fmt::Display + Sync),
        tenant: &Tenant,
        limits: &[Limit],
        want: Tokens,
    ) -> Decision {
        let mode = match self.fail {
            FailMode::Open => "open",
            FailMode::Closed => "closed",
        };
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                prefix = %self.prefix,
                fail = mode,
                "tailguard-redis: token budget store unreachable ({e}); failing {mode}"
            );
        }
        metrics::counter!("tailguard_tenant_store_errors_total", "mode" => mode).increment(1);
        match self.fail {
            FailMode::Open => match self.fallback.reserve(tenant, limits, want).await {
                Decision::Reserved(_) => Decision::Reserved(next_ticket(LOCAL)),
                refused => refused,
            },
            FailMode::Closed => Decision::Unavailable(self.retry_after),
        }
    }
}

/// A ticket unique in this process, marked `local` or not.
fn next_ticket(local: u64) -> Ticket {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    Ticket((NEXT.fetch_add(1, Ordering::Relaxed) & !LOCAL) | local)
}

impl Store for RedisTokenStore {
    fn reserve(&self, tenant: &Tenant, limits: &[Limit], want: Tokens) -> Reply {
        let call = call::Reserve::new(&self.inner, tenant, limits, want, next_ticket(0));
        Reply::Later(Box::pin(call.run(self.inner.clone())))
    }

    fn reconcile(
        &self,
        tenant: &Tenant,
        limits: &[Limit],
        ticket: Ticket,
        reserved: Tokens,
        used: Tokens,
    ) {
        if ticket.0 & LOCAL != 0 {
            self.inner
                .fallback
                .reconcile(tenant, limits, ticket, reserved, used);
            return;
        }
        let settle = call::Settle::new(&self.inner, tenant, limits, ticket, reserved, used);
        settle.spawn();
    }
}

impl fmt::Debug for RedisTokenStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("RedisTokenStore")
            .field("prefix", &i.prefix)
            .field("timeout", &i.timeout)
            .field("ttl", &i.ttl)
            .field("fail", &i.fail)
            .field("retry_after", &i.retry_after)
            .finish_non_exhaustive()
    }
}
