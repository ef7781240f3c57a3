//! Cluster mode of the gateway: `--redis URL` (or `[cluster] redis` in the file,
//! `TAILGUARD_REDIS` in the environment) shares the admission capacity and the hedge budget of
//! every gateway pointed at the same Redis and cluster name (see `tailguard-redis`).

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tailguard::admission::{BoundedAdmissionLayer, Cluster, FailMode};
use tailguard::hedge::{HedgeBudget, SharedBudget};
use tailguard_redis::{Redis, RedisBudget, RedisLeases};

use super::config::{ConfigError, Dur, parse_duration};

/// Cluster-mode flags.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ClusterArgs {
    /// Redis URL (`redis://host:port/db`): turns cluster mode on [default: off].
    #[arg(long, env = "TAILGUARD_REDIS", value_name = "URL")]
    pub redis: Option<String>,
    /// Cluster-wide capacity in units, shared by all gateways [default: the admission capacity].
    #[arg(long, env = "TAILGUARD_CLUSTER_CAPACITY", value_name = "N")]
    pub cluster_capacity: Option<u32>,
    /// Name of the shared pool and hedge budget (gateways sharing a capacity use the same one)
    /// [default: gateway].
    #[arg(long, env = "TAILGUARD_CLUSTER_NAME", value_name = "NAME")]
    pub cluster_name: Option<String>,
    /// While Redis is unreachable: `open` (local limits) or `closed` (503) [default: open].
    #[arg(long, env = "TAILGUARD_CLUSTER_FAIL", value_name = "MODE", value_parser = parse_fail)]
    pub cluster_fail: Option<FailMode>,
    /// Timeout of each Redis call [default: 50ms].
    #[arg(long, env = "TAILGUARD_REDIS_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub redis_timeout: Option<Duration>,
}

fn parse_fail(s: &str) -> Result<FailMode, String> {
    match s.trim() {
        "open" => Ok(FailMode::Open),
        "closed" => Ok(FailMode::Closed),
        other => Err(format!("expected open or closed, not {other:?}")),
    }
}

/// `[cluster]`
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterFile {
    /// `redis`
    pub redis: Option<String>,
    /// `capacity`
    pub capacity: Option<u32>,
    /// `name`
    pub name: Option<String>,
    /// `fail` (`open` | `closed`)
    pub fail: Option<String>,
    /// `timeout`
    pub timeout: Option<Dur>,
}

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
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            redis: None,
            capacity: None,
            name: "gateway".to_owned(),
            fail: FailMode::Open,
            timeout: Duration::from_millis(50),
        }
    }
}

impl ClusterConfig {
    /// Flags over file over defaults.
    pub fn resolve(file: ClusterFile, args: &ClusterArgs) -> Result<Self, ConfigError> {
        let d = ClusterConfig::default();
        let fail = match (args.cluster_fail, file.fail) {
            (Some(f), _) => f,
            (None, Some(s)) => {
                parse_fail(&s).map_err(|e| ConfigError(format!("cluster.fail: {e}")))?
            }
            (None, None) => d.fail,
        };
        let c = ClusterConfig {
            redis: args.redis.clone().or(file.redis),
            capacity: args.cluster_capacity.or(file.capacity),
            name: args.cluster_name.clone().or(file.name).unwrap_or(d.name),
            fail,
            timeout: args
                .redis_timeout
                .or(file.timeout.map(|t| t.0))
                .unwrap_or(d.timeout),
        };
        if c.capacity == Some(0) {
            return Err(ConfigError(
                "cluster.capacity (--cluster-capacity) must be at least 1".to_owned(),
            ));
        }
        if let Some(url) = &c.redis {
            redis_client_check(url)?;
        }
        Ok(c)
    }

    /// Puts `admission` and `budget` in cluster mode when a Redis URL is configured (must be
    /// called inside the runtime: the connection is made lazily, in the background).
    pub fn apply(
        &self,
        admission: BoundedAdmissionLayer,
        local_capacity: u32,
        budget: HedgeBudget,
    ) -> (BoundedAdmissionLayer, HedgeBudget) {
        let Some(url) = &self.redis else {
            return (admission, budget);
        };
        let redis = match Redis::new(url, self.timeout) {
            Ok(r) => r,
            Err(e) => {
                // Checked when the configuration was loaded; refused here only by a bug.
                tracing::error!("cluster mode off: invalid Redis URL {url:?}: {e}");
                return (admission, budget);
            }
        };
        let capacity = self.capacity.unwrap_or(local_capacity);
        let leases = Arc::new(RedisLeases::new(redis.clone(), "tailguard"));
        let cluster = Cluster::new(leases, &self.name, capacity)
            .with_timeout(self.timeout)
            .with_fail_mode(self.fail);
        let shared = SharedBudget::new(Arc::new(RedisBudget::new(redis, "tailguard", &self.name)))
            .with_timeout(self.timeout)
            .with_fail_open(self.fail == FailMode::Open);
        (admission.with_cluster(cluster), budget.with_shared(shared))
    }
}

fn redis_client_check(url: &str) -> Result<(), ConfigError> {
    tailguard_redis::check_url(url)
        .map_err(|e| ConfigError(format!("cluster.redis (--redis): {e}")))
}
