//! [`RedisLeases`]: admission leases in Redis sorted sets.
//!
//! A pool's leases are the members of one sorted set (and a class's, of a second one), scored
//! by their expiry in milliseconds of the Redis server's clock; a member is `units:id`. The two
//! keys share a hash tag, so they live in one slot of a Redis Cluster too.

use std::sync::atomic::{AtomicU64, Ordering};

use redis::Script;
use tailguard_admission::LeaseBackend;
use tailguard_admission::{BackendError, BackendFuture, LeaseId, LeaseSpec};

use crate::Redis;

/// Drops expired leases, counts the units held in the pool and the class, and adds the lease
/// if it fits both. KEYS: pool set, class set. ARGV: member, units, pool capacity, class
/// capacity, TTL in ms. Returns 1 when taken, 0 when full.
const ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function used(key)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local n = 0
  for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    n = n + tonumber(string.match(m, '^(%d+):'))
  end
  return n
end
local units = tonumber(ARGV[2])
if used(KEYS[1]) + units > tonumber(ARGV[3]) or used(KEYS[2]) + units > tonumber(ARGV[4]) then
  return 0
end
local expiry = now + tonumber(ARGV[5])
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, expiry, ARGV[1])
  redis.call('PEXPIRE', key, ARGV[5])
end
return 1
";

/// Extends a lease still present by the TTL. KEYS: pool set, class set. ARGV: member, TTL in
/// ms. Returns 1 when renewed, 0 when the lease had expired.
const RENEW: &str = r"
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
local t = redis.call('TIME')
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, expiry, ARGV[1])
  redis.call('PEXPIRE', key, ARGV[2])
end
return 1
";

/// Cluster-wide admission leases in Redis: the
/// [`LeaseBackend`](tailguard_admission::LeaseBackend) of `BoundedAdmission`'s cluster mode.
///
/// Per request: one script call to take the lease, one pipelined `ZREM` pair to release it,
/// and one script call per third of the TTL the body streams for; a waiter asks again each
/// poll interval or local release while the cluster is full.
#[derive(Debug)]
pub struct RedisLeases {
    redis: Redis,
    prefix: String,
    acquire: Script,
    renew: Script,
}

impl RedisLeases {
    /// Leases on `redis`, under keys `{prefix}...` (`tailguard` is a fine prefix; gateways
    /// sharing a capacity must use the same one).
    pub fn new(redis: Redis, prefix: &str) -> Self {
        RedisLeases {
            redis,
            prefix: prefix.to_owned(),
            acquire: Script::new(ACQUIRE),
            renew: Script::new(RENEW),
        }
    }

    /// The pool's and the class's keys.
    fn keys(&self, spec: &LeaseSpec) -> [String; 2] {
        let pool = format!("{}:{{{}}}:adm", self.prefix, spec.pool);
        let class = format!("{pool}:{}", spec.class);
        [pool, class]
    }

    /// A member unique across gateways: units, process, start time, sequence (one sequence
    /// per process, so several backends in one process never collide).
    fn member(&self, units: u32) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        format!("{units}:{}:{n}", instance())
    }
}

/// This process's identity in lease members: its pid and start time.
pub(crate) fn instance() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        format!("{}-{}", std::process::id(), t.as_nanos())
    })
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl LeaseBackend for RedisLeases {
    fn try_acquire(&self, spec: &LeaseSpec) -> BackendFuture<Option<LeaseId>> {
        let member = self.member(spec.units);
        let (script, keys, mut conn) = (self.acquire.clone(), self.keys(spec), self.redis.conn());
        let spec = spec.clone();
        Box::pin(async move {
            let mut call = script.prepare_invoke();
            call.key(&keys[..]).arg(&member).arg(spec.units);
            call.arg(spec.pool_capacity)
                .arg(spec.class_capacity)
                .arg(ms(spec.ttl));
            let taken: bool = call
                .invoke_async(&mut conn)
                .await
                .map_err(BackendError::new)?;
            Ok(taken.then_some(LeaseId(member)))
        })
    }

    fn renew(&self, spec: &LeaseSpec, id: &LeaseId) -> BackendFuture<bool> {
        let (script, keys, mut conn) = (self.renew.clone(), self.keys(spec), self.redis.conn());
        let (member, ttl) = (id.0.clone(), ms(spec.ttl));
        Box::pin(async move {
            let mut call = script.prepare_invoke();
            call.key(&keys[..]).arg(member).arg(ttl);
            call.invoke_async(&mut conn)
                .await
                .map_err(BackendError::new)
        })
    }

    fn release(&self, spec: &LeaseSpec, id: &LeaseId) -> BackendFuture<()> {
        let [pool, class] = self.keys(spec);
        let mut pipe = redis::pipe();
        pipe.zrem(pool, &id.0).ignore().zrem(class, &id.0).ignore();
        let mut conn = self.redis.conn();
        Box::pin(async move { pipe.query_async(&mut conn).await.map_err(BackendError::new) })
    }
}
