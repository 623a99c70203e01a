-- Several limits all-or-nothing (see `multi_source` in scripts.rs for the calling convention).
local m = tonumber(ARGV[2])
local items = {}
local a, k = 3, 1
for i = 1, m do
  local it = {fam = tonumber(ARGV[a]), nk = tonumber(ARGV[a + 1]), cost = tonumber(ARGV[a + 2]),
              ttl = tonumber(ARGV[a + 3]), aligned = tonumber(ARGV[a + 4]) == 1,
              n = tonumber(ARGV[a + 5]), k = k, Q = {}}
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
local out = {now, 0}
local all = true
for i = 1, m do
  local it = items[i]
  aligned = it.aligned
  local V = {}
  local ok = true
  if it.fam == 4 then
    for j = 1, it.n do
      V[j] = MV.check(KEYS[it.k + j - 1], it.Q[j], it.cost)
      if V[j][1] ~= 0 then ok = false end
    end
  else
    local f = FAM[it.fam]
    local names = {}
    for j = 1, it.n do
      for _, fl in ipairs(f.F) do names[#names + 1] = fl .. j end
    end
    local raw = redis.call('HMGET', KEYS[it.k], unpack(names))
    it.S = {}
    for j = 1, it.n do
      local st = {}
      for x, fl in ipairs(f.F) do st[fl] = tonumber(raw[(j - 1) * #f.F + x]) or 0 end
      it.S[j] = st
      V[j] = f.check(st, it.Q[j], now, it.cost)
      if V[j][1] ~= 0 then ok = false end
    end
  end
  for j = 1, it.n do for x = 1, 5 do out[#out + 1] = V[j][x] end end
  out[2] = i
  if not ok then all = false; break end
end
if all then
  for i = 1, m do
    local it = items[i]
    if it.cost > 0 then
      aligned = it.aligned
      if it.fam == 4 then
        for j = 1, it.n do
          local key = KEYS[it.k + j - 1]
          MV.commit(key, it.cost)
          redis.call('PEXPIRE', key, it.Q[j].ttl)
        end
      else
        local f = FAM[it.fam]
        local kv = {}
        for j = 1, it.n do
          f.commit(it.S[j], it.Q[j], now, it.cost)
          for _, fl in ipairs(f.F) do kv[#kv + 1] = fl .. j; kv[#kv + 1] = it.S[j][fl] end
        end
        redis.call('HSET', KEYS[it.k], unpack(kv))
        redis.call('PEXPIRE', KEYS[it.k], it.ttl)
      end
    end
  end
end
return out
