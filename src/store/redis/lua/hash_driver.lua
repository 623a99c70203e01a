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
