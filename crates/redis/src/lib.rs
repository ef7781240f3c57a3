//! # tailguard-redis
//!
//! Cluster mode for tailguard gateways: several gateway processes in front of one model pool
//! share its capacity and their hedge budget through one Redis, instead of each bounding only
//! itself (three gateways with a local limit of 8 admit 24).
//!
//! * [`RedisLeases`] is a [`LeaseBackend`](tailguard_admission::LeaseBackend) for
//!   `BoundedAdmission`'s cluster mode
//!   ([`BoundedAdmissionLayer::with_cluster`](tailguard_admission::BoundedAdmissionLayer::with_cluster)):
//!   a cluster-wide counting semaphore per pool and class whose leases expire, taken by one Lua
//!   script (drop the expired leases, count, add if below capacity). Expiry is judged on the
//!   Redis server's clock, so the gateways' clocks need not agree. A gateway killed mid-stream
//!   leaks its capacity for at most one lease TTL.
//! * [`RedisBudget`] is a [`BudgetBackend`](tailguard_hedge::BudgetBackend) for
//!   `FirstTokenHedge`'s shared budget
//!   ([`HedgeBudget::with_shared`](tailguard_hedge::HedgeBudget::with_shared)): one token
//!   bucket in Redis, from which each gateway takes tokens into a local allowance once per
//!   exchange period. The hedge decides from the allowance, so its decision never waits on
//!   Redis; a token bucket read on every decision would put a network round trip on the
//!   first-token timer, and local buckets alone would spend the budget once per gateway.
//! * [`RedisTokenStore`] is a [`Store`](tailguard_tenant::Store) for `TokenBudgetLayer`
//!   ([`with_store`](tailguard_tenant::TokenBudgetLayer::with_store)): tenants' token budgets
//!   shared by the gateways, in the same exact bucket arithmetic as the local store, reserved
//!   and reconciled by Lua scripts (all of a tenant's buckets or none; each reservation settled
//!   at most once), with reservations that a dead gateway leaves to expire as fully used, and
//!   the same fail open / closed choice as the leases.
//! * [`RedisFairShare`] is a [`FairShareBackend`](tailguard_admission::FairShareBackend) for
//!   `BoundedAdmission`'s fair queueing across tenants
//!   ([`with_shared_fairness`](tailguard_admission::BoundedAdmissionLayer::with_shared_fairness)):
//!   each tenant's weighted service, summed over the gateways in one hash, so a tenant served
//!   by one gateway ranks accordingly at the others. Exchanged in the background once per
//!   period, like the hedge budget: the queue never waits on Redis.
//!
//! **Priority order across gateways is approximate.** Waiting stays local: each gateway queues
//! its own requests, with its queue deadline, CoDel and priority classes, and only its next
//! waiter (the one its local order puts first) asks Redis for a lease, when one of its own
//! leases is released or every poll interval. A lease freed by another gateway, or expired
//! after a crash, sends no message, so the gateways' next waiters race for it whatever their
//! classes, and the one that asks first wins: an `interactive` request on one gateway can lose
//! a freed unit to a `batch` request on another. Within a gateway the order is exact; across
//! gateways the inversion is bounded by one waiter per gateway. An exact cluster-wide order
//! would need a shared queue in Redis that every gateway polls or subscribes to (a coordination
//! protocol of its own, and a round trip in every wake-up); per-class capacities
//! ([`Cluster::with_class_capacity`](tailguard_admission::Cluster::with_class_capacity)) are
//! the cluster-wide lever for classes that must keep a share.
//!
//! Every call is bounded by the timeout given at [`Redis::new`] (and again by the layer's own);
//! the connection is made lazily and re-made in the background, so a gateway starts, and
//! serves on its fallback, while Redis is down.

mod budget;
mod fair_share;
mod leases;
mod tokens;

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

pub use budget::RedisBudget;
pub use fair_share::RedisFairShare;
pub use leases::RedisLeases;
pub use tokens::{
    DEFAULT_RESERVATION_TTL, DEFAULT_TIMEOUT, DEFAULT_UNAVAILABLE_RETRY_AFTER, RedisTokenStore,
};

/// A connection to one Redis server, shared by the backends built on it (cheap to clone).
#[derive(Clone)]
pub struct Redis {
    conn: ConnectionManager,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis").finish_non_exhaustive()
    }
}

impl Redis {
    /// A lazily made connection to `url` (`redis://host:port/db`): nothing is sent until the
    /// first call, and a lost connection is re-made in the background. Each command and each
    /// connection attempt is bounded by `timeout`. Must be called inside a tokio runtime.
    pub fn new(url: &str, timeout: Duration) -> redis::RedisResult<Self> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Redis { conn })
    }

    pub(crate) fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }
}

/// Whether `url` is a Redis URL this crate can connect to (checked without connecting).
pub fn check_url(url: &str) -> redis::RedisResult<()> {
    redis::Client::open(url).map(drop)
}
