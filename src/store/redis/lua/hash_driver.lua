local key = KEYS[1]
local names = {'d', 'g'}
for i = 1, n do
  for _, f in ipairs(FIELDS) do names[#names + 1] = f .. i end
end
-- The key's reset epoch (a quota lease's return carries the epoch it was granted under).
local E = #names + 1
names[E] = 'e'
local raw = redis.call('HMGET', key, unpack(names))
local epoch = tonumber(raw[E]) or 0
-- A lease's return (a settle with an epoch) from before the key's last reset: Redis forgot the
-- units it would give back, so it changes nothing.
local lease_epoch = tonumber(ARGV[6 + n * 5 + 3])
if op == 2 and lease_epoch and lease_epoch ~= epoch then op = 1; consuming = false end
local existed = false
local S = {}
local G = ghosts_parse(raw[2])
if raw[1] and raw[1] ~= desc and op ~= 3 then
  -- Written under another rule: converted, then always written back.
  S, G = CV().convert(key, raw[1], G, code, Q, now)
  existed = true
else
  for i = 1, n do
    local st = {}
    for j, f in ipairs(FIELDS) do
      local v = raw[2 + (i - 1) * #FIELDS + j]
      if v then existed = true; st[f] = tonumber(v) or 0 else st[f] = 0 end
    end
    S[i] = st
  end
end
if op == 3 then
  redis.call('DEL', key)
  if raw[1] then
    local ocode, Qo = CV().parse(raw[1])
    if ocode == 6 then
      for i = 1, #Qo do redis.call('DEL', string.sub(key, 1, -2) .. 'm' .. i) end
    end
  end
  existed = false
  G = {}
  for i = 1, n do for _, f in ipairs(FIELDS) do S[i][f] = 0 end end
  -- A leased key (lease_driver.lua records its epoch) gets a new epoch: above the last and at
  -- least Redis's time, so a key that expired and was leased and reset again never repeats one;
  -- kept for the rule's horizon, as long as a lease drawn before the reset can live.
  if raw[E] then
    local tm = redis.call('TIME')
    epoch = max(epoch + 1, tonumber(tm[1]) * 1000000 + tonumber(tm[2]))
    redis.call('HSET', key, 'e', epoch)
    redis.call('PEXPIRE', key, ttl)
  end
elseif op == 2 then
  for i = 1, n do settle(S[i], Q[i], now, arg_cost, actual) end
elseif op == 4 and step_back then
  for i = 1, n do step_back(S[i], Q[i], now, arg_cost, at) end
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
  if #G > 0 then G = CV().ghosts_charge(G, cost, now) end
end
if op ~= 3 and (existed or consuming) then
  -- The rule is written when it changes only (the hash keeps it).
  local kv = {}
  if raw[1] ~= desc then kv = {'d', desc} end
  for i = 1, n do
    for _, f in ipairs(FIELDS) do kv[#kv + 1] = f .. i; kv[#kv + 1] = S[i][f] end
  end
  if #G > 0 then
    kv[#kv + 1] = 'g'; kv[#kv + 1] = CV().ghosts_string(G)
    ttl = ghosts_ttl(G, now, ttl)
  elseif raw[2] then
    redis.call('HDEL', key, 'g')
  end
  redis.call('HSET', key, unpack(kv))
  redis.call('PEXPIRE', key, ttl)
end
for i = 1, n do for j = 1, 5 do out[#out + 1] = V[i][j] end end
return out
