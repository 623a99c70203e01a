-- Several limits all-or-nothing (see `multi_source` in scripts.rs for the calling convention).
local m = tonumber(ARGV[2])
local items = {}
local a, k = 3, 1
for i = 1, m do
  local it = {fam = tonumber(ARGV[a]), nk = tonumber(ARGV[a + 1]), cost = tonumber(ARGV[a + 2]),
              ttl = tonumber(ARGV[a + 3]), code = tonumber(ARGV[a + 4]),
              n = tonumber(ARGV[a + 5]), k = k, Q = {}}
  it.aligned = it.code == 1
  it.desc = cv_desc(it.code, a + 6, a + 5 + it.n * 5)
  a = a + 6
  for j = 1, it.n do
    it.Q[j] = {lim = tonumber(ARGV[a]), w = tonumber(ARGV[a + 1]), T = tonumber(ARGV[a + 2]),
               B = tonumber(ARGV[a + 3]), o = tonumber(ARGV[a + 4])}
    it.Q[j].ttl = div(it.Q[j].w + 999, 1000) + 1000
    a = a + 5
  end
  k = k + it.nk
  items[i] = it
end
-- Each item's hash: its rule's descriptor and ghosts, and (but for the moving window) its state.
-- A state written under another rule is converted first and always written back.
local function load(it)
  local H = KEYS[it.k]
  local names = {'d', 'g'}
  local f = FAM[it.fam]
  if f then
    for j = 1, it.n do
      for _, fl in ipairs(f.F) do names[#names + 1] = fl .. j end
    end
  end
  local raw = redis.call('HMGET', H, unpack(names))
  it.G = ghosts_parse(raw[2])
  it.had_g = raw[2] ~= false and raw[2] ~= nil
  it.fresh = not raw[1]
  it.LK, it.ttls = {}, {}
  for j = 1, it.n do
    it.LK[j] = KEYS[it.k + j]
    it.ttls[j] = it.Q[j].ttl
  end
  if raw[1] and raw[1] ~= it.desc then
    it.S, it.G = CV().convert(H, raw[1], it.G, it.code, it.Q, now, it.LK, it.ttls)
    it.converted = true
    it.estimated = cv_estimated
    cv_estimated = false
  elseif f then
    it.S = {}
    for j = 1, it.n do
      local st = {}
      for x, fl in ipairs(f.F) do st[fl] = tonumber(raw[2 + (j - 1) * #f.F + x]) or 0 end
      it.S[j] = st
    end
  end
end
-- Writes an item's hash back: its descriptor, ghosts and (hash strategies) state.
local function store(it)
  local H = KEYS[it.k]
  local kv = {'d', it.desc}
  local f = FAM[it.fam]
  if f then
    for j = 1, it.n do
      for _, fl in ipairs(f.F) do kv[#kv + 1] = fl .. j; kv[#kv + 1] = it.S[j][fl] end
    end
  end
  if #it.G > 0 then
    kv[#kv + 1] = 'g'; kv[#kv + 1] = CV().ghosts_string(it.G)
  elseif it.had_g then
    redis.call('HDEL', H, 'g')
  end
  redis.call('HSET', H, unpack(kv))
  redis.call('PEXPIRE', H, ghosts_ttl(it.G, now, it.ttl))
end
local out = {now, 0}
local all = true
for i = 1, m do
  local it = items[i]
  aligned = it.aligned
  load(it)
  local V = {}
  local ok = true
  if it.fam == 4 then
    for j = 1, it.n do
      V[j] = MV.check(it.LK[j], it.Q[j], it.cost)
      if V[j][1] ~= 0 then ok = false end
    end
  else
    local f = FAM[it.fam]
    for j = 1, it.n do
      V[j] = f.check(it.S[j], it.Q[j], now, it.cost)
      if V[j][1] ~= 0 then ok = false end
    end
  end
  for j = 1, it.n do for x = 1, 5 do out[#out + 1] = V[j][x] end end
  out[2] = i
  if not ok then all = false; break end
end
for i = 1, m do
  local it = items[i]
  if all and it.cost > 0 then
    aligned = it.aligned
    if it.fam == 4 then
      for j = 1, it.n do
        MV.commit(it.LK[j], it.cost)
        redis.call('PEXPIRE', it.LK[j], it.Q[j].ttl)
      end
    else
      local f = FAM[it.fam]
      for j = 1, it.n do f.commit(it.S[j], it.Q[j], now, it.cost) end
    end
    if #it.G > 0 then it.G = CV().ghosts_charge(it.G, it.cost, now) end
    store(it)
  elseif it.converted then
    store(it)
  end
end
-- Then the positions (from 1) of the items whose conversion estimated.
for i = 1, m do
  if items[i].estimated then out[#out + 1] = i end
end
return out
