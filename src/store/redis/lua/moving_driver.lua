if op == 3 then
  redis.call('DEL', unpack(KEYS))
elseif op == 2 then
  -- Settle at the reservation's own timestamp: a refund removes the oldest entries at or after
  -- `at` (the reservation's were written at `at`, or later when the log held a newer entry), as
  -- the memory store does; a charge adds entries at `at`, at most up to N entries in all.
  for i = 1, n do
    local key = KEYS[i]
    local t = now_of(key)
    check(key, Q[i], 0)
    if at <= t and t - at < Q[i].w then
      local log = redis.call('LRANGE', key, 0, -1)
      local out_log = {}
      local from = #log + 1
      for j = 1, #log do
        if tonumber(log[j]) >= at then from = j; break end
      end
      local changed = false
      if actual <= arg_cost then
        local drop = arg_cost - actual
        for j = 1, #log do
          if j >= from and drop > 0 then
            drop = drop - 1
            changed = true
          else
            out_log[#out_log + 1] = log[j]
          end
        end
      else
        local put = min(actual - arg_cost, max(Q[i].lim - #log, 0))
        local placed = false
        for j = 1, #log do
          if not placed and tonumber(log[j]) > at then
            for _ = 1, put do out_log[#out_log + 1] = at end
            placed = true
          end
          out_log[#out_log + 1] = log[j]
        end
        if not placed then for _ = 1, put do out_log[#out_log + 1] = at end end
        changed = put > 0
      end
      if changed then
        redis.call('DEL', key)
        local j = 1
        while j <= #out_log do
          local chunk = {}
          for m = j, min(j + 1023, #out_log) do chunk[#chunk + 1] = out_log[m] end
          redis.call('RPUSH', key, unpack(chunk))
          j = j + 1024
        end
      end
    end
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
