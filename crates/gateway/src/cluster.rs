//! Cluster mode of the gateway: `--redis URL` (or `[cluster] redis` in the file,
//! `TAILGUARD_REDIS` in the environment) shares the admission capacity, the hedge budget and the
//! failover budget of every gateway pointed at the same Redis and cluster name (see
//! `tailguard-redis`).

use std::sync::Arc;
use std::time::Duration;

use tailguard::admission::{BoundedAdmissionLayer, Cluster, FailMode};
use tailguard::hedge::{HedgeBudget, SharedBudget};
use tailguard_redis::{Redis, RedisBudget, RedisLeases};

/// Resolved cluster settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterConfig {
    /// The Redis URL; `None`: cluster mode off.
    pub redis: Option<String>,
    /// Cluster-wide capacity (`None`: the admission capacity).
    pub capacity: Option<u32>,
    /// Pool and budget name.
    pub name: String,
    /// Failure mode.
    pub fail: FailMode,
    /// Timeout of each Redis call.
    pub timeout: Duration,
    /// Lifetime of an unrenewed admission lease.
    pub lease_ttl: Duration,
}

impl Default for ClusterConfig {
    /// Off; name `gateway`, fail open (local limits while Redis is unreachable), a 50 ms
    /// timeout per Redis call (a same-datacenter round trip is well under a millisecond),
    /// 10 s leases.
    fn default() -> Self {
        ClusterConfig {
            redis: None,
            capacity: None,
            name: "gateway".to_owned(),
            fail: FailMode::Open,
            timeout: Duration::from_millis(50),
            lease_ttl: tailguard::admission::DEFAULT_LEASE_TTL,
        }
    }
}

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
