//! Cluster mode of the gateway: `--redis URL` (or `[cluster] redis` in the file,
//! `TAILGUARD_REDIS` in the environment) shares the admission capacity, the hedge budget and the
//! failover budget of every gateway pointed at the same Redis and cluster name (see
//! `tailguard-redis`).

use std::sync::Arc;
use tailguard::admission::{BoundedAdmissionLayer, Cluster, FailMode};
use tailguard::hedge::{HedgeBudget, SharedBudget};
use tailguard_redis::{Redis, RedisBudget, RedisLeases};

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
    /// Puts admission and both budgets in cluster mode when a Redis URL is configured (must
    /// be called inside the runtime: the connection is made lazily, in the background).
    pub fn apply(&self, s: Shared, local_capacity: u32) -> Shared {
        let Some(url) = &self.redis else {
            return s;
        };
        let redis = match Redis::new(url, self.timeout) {
            Ok(r) => r,
            Err(e) => {
                // Checked when the configuration was loaded; refused here only by a bug.
                tracing::error!("cluster mode off: invalid Redis URL {url:?}: {e}");
                return s;
            }
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
        Shared {
            admission: s.admission.with_cluster(cluster),
            hedge: s.hedge.with_shared(shared(&self.name)),
            failover: s
                .failover
                .with_shared(shared(&format!("{}:failover", self.name))),
        }
    }
}
