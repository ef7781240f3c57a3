//! Cluster mode of the gateway: `--redis URL` (or `[cluster] redis` in the file,
//! `TAILGUARD_REDIS` in the environment) shares the admission capacity, the hedge budget, the
//! failover budget, the tenants' fair-share counters and token budgets of every gateway pointed at the same Redis and
//! cluster name (see `tailguard-redis`).

use std::sync::Arc;
use tailguard::admission::{BoundedAdmissionLayer, Cluster, FailMode, SharedFairness};
use tailguard::hedge::{HedgeBudget, SharedBudget};
use tailguard::tenant::TokenBudgetLayer;
use tailguard_redis::{Redis, RedisBudget, RedisFairShare, RedisLeases, RedisTokenStore};

use crate::config::ClusterConfig;

/// The layers and budgets cluster mode changes.
#[derive(Debug)]
pub struct Shared {
    /// Admission.
    pub admission: BoundedAdmissionLayer,
    /// The hedge budget.
    pub hedge: HedgeBudget,
    /// The failover budget.
    pub failover: HedgeBudget,
}

impl ClusterConfig {
    /// The connection to the configured Redis, or `None`: cluster mode off (must be called
    /// inside the runtime: the connection is made lazily, in the background).
    fn connect(&self) -> Option<Redis> {
        let url = self.redis.as_ref()?;
        match Redis::new(url, self.timeout) {
            Ok(r) => Some(r),
            Err(e) => {
                // Checked when the configuration was loaded; refused here only by a bug.
                tracing::error!("cluster mode off: invalid Redis URL {url:?}: {e}");
                None
            }
        }
    }

    /// Puts admission (its capacity and its tenants' fair-share counters) and both budgets in
    /// cluster mode when a Redis URL is configured (must be called inside the runtime: the
    /// connection is made lazily, in the background).
    pub fn apply(&self, s: Shared, local_capacity: u32) -> Shared {
        let Some(redis) = self.connect() else {
            return s;
        };
        let capacity = self.capacity.unwrap_or(local_capacity);
        let leases = Arc::new(RedisLeases::new(redis.clone(), "tailguard"));
        let cluster = Cluster::new(leases, &self.name, capacity)
            .with_timeout(self.timeout)
            .with_lease_ttl(self.lease_ttl)
            .with_fail_mode(self.fail);
        let shared = |name: &str| {
            SharedBudget::new(Arc::new(RedisBudget::new(redis.clone(), "tailguard", name)))
                .with_timeout(self.timeout)
                .with_fail_open(self.fail == FailMode::Open)
        };
        let fair = RedisFairShare::new(redis.clone(), "tailguard", &self.name);
        let fair = SharedFairness::new(Arc::new(fair)).with_timeout(self.timeout);
        Shared {
            admission: s.admission.with_cluster(cluster).with_shared_fairness(fair),
            hedge: s.hedge.with_shared(shared(&self.name)),
            failover: s
                .failover
                .with_shared(shared(&format!("{}:failover", self.name))),
        }
    }

    /// Keeps the tenants' token budgets of `layer` in Redis when a Redis URL is configured:
    /// one bucket per tenant and limit for every gateway with this cluster name (keys
    /// `tailguard:NAME:{TENANT}:…`, the tenant the hash tag), reserved and settled by
    /// `RedisTokenStore` with the leases' timeout and fail mode (fail open: each gateway's own
    /// buckets while Redis is unreachable; closed: 503 `cluster_unavailable`). Its own
    /// connection: `build_stack` makes the budgets apart from [`Shared`]. Must be called inside
    /// the runtime, as [`apply`](Self::apply).
    pub fn budgets(&self, layer: TokenBudgetLayer) -> TokenBudgetLayer {
        let Some(redis) = self.connect() else {
            return layer;
        };
        let store = RedisTokenStore::new(redis, &format!("tailguard:{}", self.name))
            .with_timeout(self.timeout)
            .with_fail_mode(self.fail);
        layer.with_store(store)
    }
}
