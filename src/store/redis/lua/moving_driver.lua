-- KEYS: the state's hash (its descriptor and ghosts), then one list per quota.
local H = KEYS[1]
local LK, ttls = {}, {}
for i = 1, n do LK[i] = KEYS[i + 1]; ttls[i] = Q[i].ttl end
local meta = redis.call('HMGET', H, 'd', 'g')
local G = ghosts_parse(meta[2])
local write_meta = false
local dropped
if meta[1] and meta[1] ~= desc and op ~= 3 then
  -- Written under another rule: converted (the lists rewritten), then recorded.
  local _
  _, G = CV().convert(H, meta[1], G, code, Q, now, LK, ttls)
  write_meta = true
end
if op == 3 then
  redis.call('DEL', H, unpack(LK))
  if meta[1] then
    local _, Qo = CV().parse(meta[1])
    for i = n + 1, #Qo do redis.call('DEL', string.sub(H, 1, -2) .. 'm' .. i) end
  end
  G = {}
elseif op == 2 then
  dropped = 0
  -- Settle at the reservation's own timestamp: a refund removes the oldest entries at or after
  -- `at` (the reservation's were written at `at`, or later when the log held a newer entry), as
  -- the memory store does; a charge adds entries at `at`, at most up to N entries in all.
  for i = 1, n do
    local key = LK[i]
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
        dropped = max(dropped, actual - arg_cost - put)
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
  local v = check(LK[i], Q[i], cost)
  if v[1] ~= 0 then all = false end
  V[i] = v
end
if all and cost > 0 then
  for i = 1, n do commit(LK[i], cost) end
  if #G > 0 then G = CV().ghosts_charge(G, cost, now) end
  write_meta = write_meta or not meta[1] or #G > 0
end
for i = 1, n do
  if redis.call('EXISTS', LK[i]) == 1 then redis.call('PEXPIRE', LK[i], Q[i].ttl) end
end
if op ~= 3 and (write_meta or meta[1]) then
  -- The rule the lists were written under lives as long as they do (or the last ghost).
  if #G > 0 and (write_meta or (all and cost > 0)) then
    redis.call('HSET', H, 'd', desc, 'g', CV().ghosts_string(G))
  elseif write_meta then
    redis.call('HSET', H, 'd', desc)
    if meta[2] then redis.call('HDEL', H, 'g') end
  end
  redis.call('PEXPIRE', H, ghosts_ttl(G, now, ttl))
end
for i = 1, n do for j = 1, 5 do out[#out + 1] = V[i][j] end end
-- A settlement or an estimated conversion ends the reply with two more integers: the units a full
-- log could not hold, and 1 if the conversion estimated.
if dropped or cv_estimated then
  out[#out + 1] = dropped or 0
  out[#out + 1] = cv_estimated and 1 or 0
end
return out
