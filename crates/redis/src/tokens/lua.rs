//! The Lua of [`RedisTokenStore`](super::RedisTokenStore): exact integer token buckets.
//!
//! A bucket's level is counted as `tailguard-tenant`'s `LocalStore` counts it, in units of
//! `1 / window` of a token (window in nanoseconds), so a limit of `C` tokens per window refills
//! `C` units per nanosecond and every refill, take and refund is exact. Those numbers reach
//! `u64::MAX²` and Lua's numbers are doubles (exact to 2⁵³), so the scripts carry them as
//! decimal strings and compute on little-endian arrays of base-10⁷ limbs: a limb product plus
//! carries stays below 2⁵³. Only addition, subtraction, comparison and multiplication are done
//! in Lua; divisions (whole tokens, waits) are left to Rust on the levels the scripts return.
//!
//! A tenant's buckets are one hash (a field per limit: `"<level> <µs of the last refill>"`, on
//! the Redis server's clock, so the gateways' clocks do not matter); a missing field is a full
//! bucket. The hash expires one longest window after its last write, when every bucket in it
//! would be full again: the same as the bucket it stands for.

/// Big integers, the time, and the buckets of KEYS[1] (`bucket` refills one and caches it,
/// `save` writes the cached ones back and extends the hash's expiry).
const LIB: &str = r"
local B = 10000000
local function big(s)
  local a, i = {}, #s
  while i >= 1 do
    local j = math.max(1, i - 6)
    a[#a + 1] = tonumber(string.sub(s, j, i))
    i = j - 1
  end
  return a
end
local function num(n)
  local a = {}
  repeat
    local r = n % B
    a[#a + 1] = r
    n = (n - r) / B
  until n == 0
  return a
end
local function str(a)
  local t = {tostring(a[#a])}
  for i = #a - 1, 1, -1 do t[#t + 1] = string.format('%07d', a[i]) end
  return table.concat(t)
end
local function trim(a)
  while #a > 1 and a[#a] == 0 do a[#a] = nil end
  return a
end
local function cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  for i = #a, 1, -1 do
    if a[i] ~= b[i] then return a[i] < b[i] and -1 or 1 end
  end
  return 0
end
local function add(a, b)
  local r, c = {}, 0
  for i = 1, math.max(#a, #b) do
    local s = (a[i] or 0) + (b[i] or 0) + c
    r[i] = s % B
    c = (s - r[i]) / B
  end
  if c > 0 then r[#r + 1] = c end
  return r
end
local function sub(a, b)
  if cmp(a, b) <= 0 then return {0} end
  local r, c = {}, 0
  for i = 1, #a do
    local s = a[i] - (b[i] or 0) - c
    if s < 0 then s, c = s + B, 1 else c = 0 end
    r[i] = s
  end
  return trim(r)
end
local function mul(a, b)
  local r = {}
  for i = 1, #a + #b do r[i] = 0 end
  for i = 1, #a do
    local c = 0
    for j = 1, #b do
      local s = r[i + j - 1] + a[i] * b[j] + c
      r[i + j - 1] = s % B
      c = (s - r[i + j - 1]) / B
    end
    r[i + #b] = c
  end
  return trim(r)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cache = {}
local function bucket(field, window, rate, cap)
  if cache[field] then return cache[field] end
  local b = {level = cap, at = now}
  local v = redis.call('HGET', KEYS[1], field)
  if v then
    local sp = string.find(v, ' ', 1, true)
    b.level, b.at = big(string.sub(v, 1, sp - 1)), tonumber(string.sub(v, sp + 1))
    if now > b.at then
      local ns = mul(num(now - b.at), {1000})
      if cmp(ns, window) >= 0 then
        b.level = cap
      else
        b.level = add(b.level, mul(ns, rate))
        if cmp(b.level, cap) > 0 then b.level = cap end
      end
      b.at = now
    end
  end
  cache[field] = b
  return b
end
local function save(ttl)
  for field, b in pairs(cache) do
    redis.call('HSET', KEYS[1], field, str(b.level) .. ' ' .. string.format('%.0f', b.at))
  end
  if redis.call('PTTL', KEYS[1]) < tonumber(ttl) then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
end
";

/// Refills every bucket and takes the reservation from all of them, or from none. KEYS: the
/// buckets hash, the reservation's key. ARGV: the reservation's TTL in ms, the hash's TTL in
/// ms, the reservation's record, then five per limit: field, window, rate, capacity, and the
/// units the reservation takes. Returns `'1'` (taken; the reservation's key is set to expire
/// after its TTL) or `'0'` (nothing taken), then each bucket's level before the take.
const RESERVE: &str = r"
local n = (#ARGV - 3) / 5
local ok, out, need = true, {}, {}
for i = 1, n do
  local o = 3 + (i - 1) * 5
  local cap = big(ARGV[o + 4])
  need[i] = big(ARGV[o + 5])
  local b = bucket(ARGV[o + 1], big(ARGV[o + 2]), big(ARGV[o + 3]), cap)
  if cmp(need[i], cap) > 0 or cmp(b.level, need[i]) < 0 then ok = false end
  out[i + 1] = str(b.level)
end
if not ok then
  out[1] = '0'
  return out
end
for i = 1, n do
  local b = cache[ARGV[3 + (i - 1) * 5 + 1]]
  b.level = sub(b.level, need[i])
end
save(ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[1])
out[1] = '1'
return out
";

/// Settles a reservation once: when its key is still there (not settled, not expired),
/// deletes it and, per limit, refills the bucket, gives back the refund (up to the capacity)
/// and takes the charge (down to zero). KEYS: the buckets hash, the reservation's key. ARGV:
/// the hash's TTL in ms, then six per limit: field, window, rate, capacity, refund units,
/// charge units. Returns nil when there was nothing to settle, else each bucket's level before
/// its refund and charge.
const RECONCILE: &str = r"
if redis.call('DEL', KEYS[2]) == 0 then return false end
local out = {}
for i = 1, (#ARGV - 1) / 6 do
  local o = 1 + (i - 1) * 6
  local cap = big(ARGV[o + 4])
  local b = bucket(ARGV[o + 1], big(ARGV[o + 2]), big(ARGV[o + 3]), cap)
  out[i] = str(b.level)
  b.level = add(b.level, big(ARGV[o + 5]))
  if cmp(b.level, cap) > 0 then b.level = cap end
  b.level = sub(b.level, big(ARGV[o + 6]))
end
save(ARGV[1])
return out
";

/// One bucket's level, refilled (nothing written). KEYS: the buckets hash. ARGV: field,
/// window, rate, capacity.
const LEVEL: &str = r"
return str(bucket(ARGV[1], big(ARGV[2]), big(ARGV[3]), big(ARGV[4])).level)
";

/// The reserve script.
pub(super) fn reserve() -> redis::Script {
    redis::Script::new(&format!("{LIB}{RESERVE}"))
}

/// The reconcile script.
pub(super) fn reconcile() -> redis::Script {
    redis::Script::new(&format!("{LIB}{RECONCILE}"))
}

/// The level script.
pub(super) fn level() -> redis::Script {
    redis::Script::new(&format!("{LIB}{LEVEL}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::LIB;

    /// The big-integer functions against `u128`, on a real redis-server.
    #[tokio::test]
    async fn big_integers_agree_with_u128() {
        let Ok(url) = std::env::var("TAILGUARD_REDIS_URL") else {
            tailguard_test_support::cannot_run(
                "big_integers_agree_with_u128",
                "TAILGUARD_REDIS_URL is unset (run scripts/test.sh)",
            );
            return;
        };
        let redis = crate::Redis::new(&url, Duration::from_secs(5)).expect("url");
        let script = redis::Script::new(&format!(
            "{LIB}
local a, b = big(ARGV[1]), big(ARGV[2])
return {{str(mul(a, b)), str(add(a, b)), str(sub(a, b)), tostring(cmp(a, b)),
  str(mul(num(tonumber(ARGV[3])), {{1000}}))}}"
        ));
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            // xorshift64
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut cases = vec![
            (0, 0),
            (1, 0),
            (0, 1),
            (u64::MAX, u64::MAX),
            (9_999_999, 10_000_000),
            (10_000_000, 9_999_999),
            (86_400_000_000_000, 1_000_000_007),
        ];
        for _ in 0..300 {
            let (a, b) = (next(), next());
            // Small numbers too, and numbers around limb boundaries.
            cases.push((a, b));
            cases.push((a >> (a % 64), b >> (b % 64)));
        }
        let mut conn = redis.conn();
        for (a, b) in cases {
            // Elapsed microseconds are below 2^53.
            let us = a >> 11;
            let mut call = script.prepare_invoke();
            call.arg(a.to_string())
                .arg(b.to_string())
                .arg(us.to_string());
            let got: Vec<String> = call.invoke_async(&mut conn).await.expect("redis");
            let (a128, b128) = (u128::from(a), u128::from(b));
            let want = [
                (a128 * b128).to_string(),
                (a128 + b128).to_string(),
                a128.saturating_sub(b128).to_string(),
                (a.cmp(&b) as i8).to_string(),
                (u128::from(us) * 1000).to_string(),
            ];
            assert_eq!(got, want, "a = {a}, b = {b}, us = {us}");
        }
    }
}
