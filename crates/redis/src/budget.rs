//! [`RedisBudget`]: the shared hedge bucket in one Redis hash.

use redis::Script;
use tailguard_hedge::{BudgetBackend, Exchange, ExchangeFuture};

use crate::Redis;

/// Adds the deposits and the floor earned since the last exchange (capped at the max balance;
/// a new bucket starts full), then takes up to `want` whole tokens. KEYS: the bucket hash.
/// ARGV: deposited, want, floor per second, max balance. Returns the tokens taken.
const EXCHANGE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max = tonumber(ARGV[4])
local b = tonumber(redis.call('HGET', KEYS[1], 'balance') or max)
local last = tonumber(redis.call('HGET', KEYS[1], 'ts') or now)
b = math.min(max, b + tonumber(ARGV[1]) + tonumber(ARGV[3]) * math.max(0, now - last) / 1000)
local take = math.max(0, math.min(tonumber(ARGV[2]), math.floor(b)))
b = b - take
redis.call('HSET', KEYS[1], 'balance', tostring(b), 'ts', now)
redis.call('PEXPIRE', KEYS[1], 3600000)
return take
";

/// The hedge and failover budget shared by several gateways in Redis: the
/// [`BudgetBackend`] of [`SharedBudget`](tailguard_hedge::SharedBudget).
///
/// One script call per gateway per exchange period, whatever the request rate.
#[derive(Debug)]
pub struct RedisBudget {
    redis: Redis,
    key: String,
    script: Script,
}

impl RedisBudget {
    /// The bucket `name` (gateways sharing a budget use the same prefix and name).
    pub fn new(redis: Redis, prefix: &str, name: &str) -> Self {
        RedisBudget {
            redis,
            key: format!("{prefix}:{{{name}}}:hedge"),
            script: Script::new(EXCHANGE),
        }
    }
}

impl BudgetBackend for RedisBudget {
    fn exchange(&self, ex: Exchange) -> ExchangeFuture {
        let (script, key, mut conn) = (self.script.clone(), self.key.clone(), self.redis.conn());
        Box::pin(async move {
            let mut call = script.prepare_invoke();
            call.key(key).arg(ex.deposited).arg(ex.want);
            call.arg(ex.floor_per_sec).arg(ex.max_balance);
            let taken: u64 = call.invoke_async(&mut conn).await?;
            Ok(taken as f64)
        })
    }
}
