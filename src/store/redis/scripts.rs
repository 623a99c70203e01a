//! The Lua scripts: one per strategy family, each the exact arithmetic of `src/strategy/*.rs` in
//! microseconds, for all quotas of a key in one call.
//!
//! Lua numbers are doubles, so every number a script computes stays an integer below 2^53: the Rust
//! side checks its arguments against that bound, and the only products that could pass it (the
//! sliding window's `count * (W - e)`) go through [`PRELUDE`]'s exact `muldivmod`, which never holds
//! a value above its divisor.
//!
//! Calling convention, shared by all scripts:
//! - `KEYS`: the hash holding the key's state (fixed, sliding, GCRA), or one list per quota (moving).
//! - `ARGV`: `op` (0 check, 1 peek, 2 refund, 3 reset), `cost`, `now_us` (0: use the server's `TIME`),
//!   `ttl_ms`, `aligned` (fixed window: 1 for clock-aligned), `n`, then `limit, window, emission, burst`
//!   per quota (in µs), then `at_us` (refund: the time of the check whose cost is given back, so
//!   only its own window or bucket is refunded; 0: the current one).
//! - Reply: `now_us`, then `outcome, limit, remaining, reset_after, retry_after` per quota (outcome 0
//!   allowed, 1 rejected, 2 never admissible); integers only.

/// Helpers shared by every script: argument parsing, time, exact integer division.
const PRELUDE: &str = r#"
local P = {}
do
  local p = 1
  for i = 0, 53 do P[i] = p; p = p * 2 end
end
-- floor(a / b) and a mod b, exactly for integers 0 <= a < 2^52, b >= 1 (q*b stays below 2^53).
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  while r < 0 do q = q - 1; r = r + b end
  while r >= b do q = q + 1; r = r - b end
  return q, r
end
-- a*b = q*c + r with 0 <= r < c, exactly; needs 0 <= b <= c, c >= 1, integers below 2^52. When
-- a*b could pass 2^52, long multiplication bit by bit keeps every intermediate value below c.
local function muldivmod(a, b, c)
  if b == 0 or a < math.floor(4503599627370496 / b) then return divmod(a * b, c) end
  local q, r, started = 0, 0, false
  for i = 52, 0, -1 do
    local bit = false
    if a >= P[i] then a = a - P[i]; bit = true end
    if started then
      q = q * 2
      if r >= c - r then r = r - (c - r); q = q + 1 else r = r + r end
    end
    if bit then
      started = true
      if r >= c - b then r = r - (c - b); q = q + 1 else r = r + b end
    end
  end
  return q, r
end
local function div(a, b) local q = divmod(a, b); return q end
local function mod(a, b) local _, r = divmod(a, b); return r end
local max, min = math.max, math.min

local op = tonumber(ARGV[1])
local arg_cost = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
if now == 0 then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end
local ttl = tonumber(ARGV[4])
local aligned = tonumber(ARGV[5]) == 1
local n = tonumber(ARGV[6])
local Q = {}
for i = 1, n do
  local b = 6 + (i - 1) * 4
  Q[i] = {lim = tonumber(ARGV[b + 1]), w = tonumber(ARGV[b + 2]),
          T = tonumber(ARGV[b + 3]), B = tonumber(ARGV[b + 4])}
end
local at = tonumber(ARGV[6 + n * 4 + 1]) or 0
local cost = 0
if op == 0 then cost = arg_cost end
local consuming = op == 0 and cost > 0
"#;

/// The strategies keeping a few integers per quota in one hash: `run` loads the fields, applies the
/// op through the strategy's `check`, `commit` and `refund`, and writes them back.
const HASH_DRIVER: &str = r#"
local key = KEYS[1]
local names = {}
for i = 1, n do
  for _, f in ipairs(FIELDS) do names[#names + 1] = f .. i end
end
local raw = redis.call('HMGET', key, unpack(names))
local existed = false
local S = {}
for i = 1, n do
  local st = {}
  for j, f in ipairs(FIELDS) do
    local v = raw[(i - 1) * #FIELDS + j]
    if v then existed = true; st[f] = tonumber(v) or 0 else st[f] = 0 end
  end
  S[i] = st
end
if op == 3 then
  redis.call('DEL', key)
  existed = false
  for i = 1, n do for _, f in ipairs(FIELDS) do S[i][f] = 0 end end
elseif op == 2 then
  for i = 1, n do refund(S[i], Q[i], now, arg_cost) end
end
local out = {now}
local all = true
local V = {}
for i = 1, n do
  local v = check(S[i], Q[i], now, cost)
  if v[1] ~= 0 then all = false end
  V[i] = v
end
if all and cost > 0 then
  for i = 1, n do commit(S[i], Q[i], now, cost) end
end
if op ~= 3 and (existed or consuming) then
  local kv = {}
  for i = 1, n do
    for _, f in ipairs(FIELDS) do kv[#kv + 1] = f .. i; kv[#kv + 1] = S[i][f] end
  end
  redis.call('HSET', key, unpack(kv))
  redis.call('PEXPIRE', key, ttl)
end
for i = 1, n do for j = 1, 5 do out[#out + 1] = V[i][j] end end
return out
"#;

const FIXED: &str = r#"
local FIELDS = {'s', 'n'}
local function check(st, q, now, c)
  local t = max(now, st.s)
  local w, lim = q.w, q.lim
  if aligned then
    local ws = t - mod(t, w)
    if ws ~= st.s then st.s = ws; st.n = 0 end
  elseif st.n > 0 and t - st.s >= w then
    st.n = 0
  end
  local used = st.n
  local left = max(st.s + w - t, 0)
  if c > lim then
    local reset = 0
    if used > 0 then reset = left end
    return {2, lim, max(lim - used, 0), reset, 0}
  end
  if used + c <= lim then
    local after = used + c
    local reset
    if after == 0 then reset = 0 elseif used == 0 and not aligned then reset = w else reset = left end
    return {0, lim, lim - after, reset, 0}
  end
  return {1, lim, max(lim - used, 0), left, left}
end
local function commit(st, q, now, c)
  if st.n == 0 and not aligned then st.s = max(now, st.s) end
  st.n = st.n + c
end
local function refund(st, q, now, c)
  check(st, q, now, 0)
  if at == 0 or at >= st.s then st.n = max(st.n - c, 0) end
end
"#;

const SLIDING: &str = r#"
local FIELDS = {'b', 'c', 'p'}
local function share(count, w, e)
  local q = muldivmod(count, w - min(e, w), w)
  return q
end
local function earliest(count, w, room)
  if count == 0 then return 0 end
  local span
  if room + 1 > count then
    span = w
  elseif room + 1 == count then
    span = w - 1
  else
    local q, r = muldivmod(w, room + 1, count)
    if r >= 1 then span = q else span = q - 1 end
    span = min(span, w)
  end
  return w - span
end
local function reset_of(w, e, cur, prev)
  if cur > 0 then return (w - e) + earliest(cur, w, 0) end
  return max(earliest(prev, w, 0) - e, 0)
end
local function check(st, q, now, c)
  local t = max(now, st.b)
  local w, lim = q.w, q.lim
  local start = t - mod(t, w)
  if start ~= st.b then
    if start == st.b + w then st.p = st.c else st.p = 0 end
    st.c = 0
    st.b = start
  end
  local e = t - start
  local cur, prev = st.c, st.p
  local weighted = cur + share(prev, w, e)
  local remaining = max(lim - weighted, 0)
  if c > lim then return {2, lim, remaining, reset_of(w, e, cur, prev), 0} end
  if weighted + c <= lim then
    return {0, lim, remaining - c, reset_of(w, e, cur + c, prev), 0}
  end
  local room = lim - c
  local wait
  local eo = w
  if cur <= room then eo = earliest(prev, w, room - cur) end
  if cur <= room and eo < w then
    wait = eo - e
  else
    wait = (w - e) + earliest(cur, w, room)
  end
  return {1, lim, remaining, reset_of(w, e, cur, prev), wait}
end
local function commit(st, q, now, c)
  st.c = min(st.c + c, 4294967295)
end
local function refund(st, q, now, c)
  check(st, q, now, 0)
  if at == 0 or at >= st.b then
    st.c = max(st.c - c, 0)
  elseif at >= st.b - q.w then
    st.p = max(st.p - c, 0)
  end
end
"#;

const GCRA: &str = r#"
local FIELDS = {'t'}
local function check(st, q, now, c)
  local T, B = q.T, q.B
  local tau = B * T
  local t = max(now, max(st.t - tau, 0))
  local ahead = max(st.t - t, 0)
  local rem_now = min(div(tau - min(ahead, tau), T), B)
  if c > B then return {2, B, rem_now, ahead, 0} end
  local after = ahead + c * T
  if after <= tau then return {0, B, min(div(tau - after, T), B), after, 0} end
  return {1, B, rem_now, ahead, after - tau}
end
local function commit(st, q, now, c)
  local tau = q.B * q.T
  local t = max(now, max(st.t - tau, 0))
  st.t = max(st.t, t) + c * q.T
end
local function refund(st, q, now, c)
  local base = 0
  if c <= div(st.t, q.T) then base = st.t - c * q.T end
  st.t = max(base, min(now, st.t))
end
"#;

/// The moving window: one list of timestamps per quota, oldest first, at most `N` entries. Equal
/// timestamps are separate entries, so same-instant requests never collapse.
const MOVING: &str = r#"
local function prune(key, w, t)
  local len = redis.call('LLEN', key)
  if len == 0 then return 0 end
  local lo, hi = 0, len
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if tonumber(redis.call('LINDEX', key, mid)) + w <= t then lo = mid + 1 else hi = mid end
  end
  if lo == len then
    redis.call('DEL', key)
    return 0
  elseif lo > 0 then
    redis.call('LTRIM', key, lo, -1)
  end
  return len - lo
end
local function now_of(key)
  local newest = redis.call('LINDEX', key, -1)
  if newest then return max(now, tonumber(newest)) end
  return now
end
local function check(key, q, c)
  local t = now_of(key)
  local w, lim = q.w, q.lim
  local used = prune(key, w, t)
  local reset = 0
  if used > 0 then reset = tonumber(redis.call('LINDEX', key, -1)) + w - t end
  if c > lim then return {2, lim, max(lim - used, 0), reset, 0} end
  if used + c <= lim then
    if c > 0 then reset = w end
    return {0, lim, lim - used - c, reset, 0}
  end
  local k = used + c - lim - 1
  local ts = redis.call('LINDEX', key, k)
  local wait = 0
  if ts then wait = tonumber(ts) + w - t end
  return {1, lim, max(lim - used, 0), reset, wait}
end
local function commit(key, c)
  local t = now_of(key)
  local left = c
  while left > 0 do
    local chunk = min(left, 1024)
    local vals = {}
    for j = 1, chunk do vals[j] = t end
    redis.call('RPUSH', key, unpack(vals))
    left = left - chunk
  end
end
if op == 3 then
  redis.call('DEL', unpack(KEYS))
elseif op == 2 then
  for i = 1, n do
    check(KEYS[i], Q[i], 0)
    local len = redis.call('LLEN', KEYS[i])
    -- Drop the newest entries not older than `at`, at most the refunded cost.
    local drop = 0
    while drop < arg_cost and drop < len and tonumber(redis.call('LINDEX', KEYS[i], len - 1 - drop)) >= at do
      drop = drop + 1
    end
    local keep = len - drop
    if keep == 0 then redis.call('DEL', KEYS[i]) else redis.call('LTRIM', KEYS[i], 0, keep - 1) end
  end
end
local out = {now}
local all = true
local V = {}
for i = 1, n do
  local v = check(KEYS[i], Q[i], cost)
  if v[1] ~= 0 then all = false end
  V[i] = v
end
if all and cost > 0 then
  for i = 1, n do commit(KEYS[i], cost) end
end
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('PEXPIRE', KEYS[i], Q[i].ttl) end
end
for i = 1, n do for j = 1, 5 do out[#out + 1] = V[i][j] end end
return out
"#;

/// Which script a strategy runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Family {
    Fixed,
    Moving,
    Sliding,
    Gcra,
}

impl Family {
    pub(super) const ALL: [Family; 4] =
        [Family::Fixed, Family::Moving, Family::Sliding, Family::Gcra];

    /// The full Lua source of the family's script.
    pub(super) fn source(self) -> String {
        let body: [&str; 2] = match self {
            Family::Fixed => [FIXED, HASH_DRIVER],
            Family::Sliding => [SLIDING, HASH_DRIVER],
            Family::Gcra => [GCRA, HASH_DRIVER],
            Family::Moving => [MOVING_TTL, MOVING],
        };
        let mut s = String::from(PRELUDE);
        for part in body {
            s.push_str(part);
        }
        s
    }
}

/// The moving window's per-quota TTL: its `W` in ms plus the same slack as the others, from `ttl_ms`
/// scaled per quota on the Rust side (`ARGV[4]` is the TTL of the longest window; each list uses its
/// own window, never less than a second past it).
const MOVING_TTL: &str = r#"
for i = 1, n do Q[i].ttl = div(Q[i].w + 999, 1000) + 1000 end
"#;
