-- A quota lease (after the prelude and one of fixed_window.lua, sliding_window.lua, gcra.lua, in
-- place of hash_driver.lua). ARGV as a check of the request's cost (op 0), then, after the settle
-- slots, `want` (the lease size asked for) and `shrink`. Every quota has room for the cost: the
-- grant is min(want, room / shrink), at least the cost, charged at once by the strategy's own
-- check and commit. Otherwise nothing is charged and the verdicts are those of a check of the cost.
-- Reply: now, grant (0: none), life (µs until the lease must die: the end of the window or bucket
-- it was drawn from, or grant x T for the bucket), the key's reset epoch (hash_driver.lua: bumped
-- by a reset; 0: never reset), then five integers per quota.
local want = tonumber(ARGV[6 + n * 5 + 3]) or 0
local shrink = max(tonumber(ARGV[6 + n * 5 + 4]) or 1, 1)
local key = KEYS[1]
local names = {'d', 'g'}
for i = 1, n do
  for _, f in ipairs(FIELDS) do names[#names + 1] = f .. i end
end
local E = #names + 1
names[E] = 'e'
local raw = redis.call('HMGET', key, unpack(names))
local epoch = tonumber(raw[E]) or 0
local S = {}
local G = ghosts_parse(raw[2])
-- Written under another rule: converted (a lease drawn under the old rule was charged there, so
-- the conversion carries it), then always written back.
local converted = raw[1] and raw[1] ~= desc
if converted then
  S, G = CV().convert(key, raw[1], G, code, Q, now)
else
  for i = 1, n do
    local st = {}
    for j, f in ipairs(FIELDS) do st[f] = tonumber(raw[2 + (i - 1) * #FIELDS + j]) or 0 end
    S[i] = st
  end
end
local room = nil
for i = 1, n do
  local v = check(S[i], Q[i], now, 0)
  if room == nil or v[3] < room then room = v[3] end
end
local grant = 0
if cost > 0 and room >= cost then
  grant = max(cost, min(want, div(room, shrink)))
end
local ask = cost
if grant > 0 then ask = grant end
local V = {}
local all = true
for i = 1, n do
  V[i] = check(S[i], Q[i], now, ask)
  if V[i][1] ~= 0 then all = false end
end
local life = 0
if not (all and grant > 0) then grant = 0 end
if grant > 0 or converted then
  if grant > 0 then
    for i = 1, n do commit(S[i], Q[i], now, grant) end
    if #G > 0 then G = CV().ghosts_charge(G, grant, now) end
  end
  local kv = {}
  if raw[1] ~= desc then kv = {'d', desc} end
  -- A leased key records its epoch, so a reset (through any store) bumps it.
  if not raw[E] then kv[#kv + 1] = 'e'; kv[#kv + 1] = epoch end
  if #G > 0 then
    kv[#kv + 1] = 'g'; kv[#kv + 1] = CV().ghosts_string(G)
    ttl = ghosts_ttl(G, now, ttl)
  elseif raw[2] then
    redis.call('HDEL', key, 'g')
  end
  for i = 1, n do
    for _, f in ipairs(FIELDS) do kv[#kv + 1] = f .. i; kv[#kv + 1] = S[i][f] end
    local q, st, l = Q[i], S[i], 0
    if st.t ~= nil then
      l = grant * q.T
    elseif st.b ~= nil then
      l = st.b + q.w - now
    else
      l = st.s + q.w - now
    end
    if i == 1 or l < life then life = l end
  end
  redis.call('HSET', key, unpack(kv))
  redis.call('PEXPIRE', key, ttl)
end
if grant == 0 then life = 0 end
local out = {now, grant, max(life, 0), epoch}
for i = 1, n do for j = 1, 5 do out[#out + 1] = V[i][j] end end
return out
