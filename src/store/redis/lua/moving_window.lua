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
