//! [`RedisFairShare`]: tenants' cluster-wide service totals in one Redis hash.

use redis::Script;
use tailguard_admission::{BackendError, BackendFuture, FairShareBackend, ServiceReport};

use crate::Redis;

/// Adds each reported service to its tenant's total, then reads the wanted totals (0 for a
/// tenant without one). KEYS: the hash. ARGV: the number of reported pairs, the pairs
/// (tenant, service), then the wanted tenants. Returns the totals as strings (a Lua number
/// would come back truncated to an integer).
const EXCHANGE: &str = r"
local n = tonumber(ARGV[1])
for i = 0, n - 1 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[2 + 2 * i], ARGV[3 + 2 * i])
end
local out = {}
for j = 2 + 2 * n, #ARGV do
  out[#out + 1] = redis.call('HGET', KEYS[1], ARGV[j]) or '0'
end
redis.call('PEXPIRE', KEYS[1], 3600000)
return out
";

/// The fair-share counters shared by several gateways in Redis: the [`FairShareBackend`] of
/// [`SharedFairness`](tailguard_admission::SharedFairness).
///
/// One hash per cluster, a field per tenant (its weighted service, a float), kept an hour
/// after the last exchange of any gateway: one script call per gateway per exchange period,
/// whatever the request rate, and none while a gateway knows no tenant and served nothing.
/// Only differences between totals matter, so a total's size is of no consequence and a lost
/// hash (Redis restarted) makes every gateway start its tenants over, as a new tenant starts.
#[derive(Debug)]
pub struct RedisFairShare {
    redis: Redis,
    key: String,
    script: Script,
}

impl RedisFairShare {
    /// The counters `name` (gateways sharing them use the same prefix and name).
    pub fn new(redis: Redis, prefix: &str, name: &str) -> Self {
        RedisFairShare {
            redis,
            key: format!("{prefix}:{{{name}}}:fair"),
            script: Script::new(EXCHANGE),
        }
    }
}

impl FairShareBackend for RedisFairShare {
    fn exchange(&self, report: ServiceReport) -> BackendFuture<Vec<f64>> {
        let (script, key, mut conn) = (self.script.clone(), self.key.clone(), self.redis.conn());
        Box::pin(async move {
            let mut call = script.prepare_invoke();
            call.key(key).arg(report.served.len());
            for (tenant, service) in &report.served {
                call.arg(tenant).arg(service);
            }
            for tenant in &report.wanted {
                call.arg(tenant);
            }
            let totals: Vec<String> = call
                .invoke_async(&mut conn)
                .await
                .map_err(BackendError::new)?;
            totals
                .iter()
                .map(|t| t.parse::<f64>().map_err(BackendError::new))
                .collect()
        })
    }
}
