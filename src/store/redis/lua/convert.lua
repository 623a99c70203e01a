-- A key's state is one hash per (limiter name, key) whatever the rule: field `d` records the rule
-- it was written under (its descriptor: strategy code, then limit, window, emission, burst, offset
-- per quota), field `g` the ghosts (removed periods still counting). A script whose rule's
-- descriptor differs converts the state here, atomically, before deciding (strict conversion: a
-- new quota starts at no less than what the old state proves was spent in its window or bucket).
-- Strategy codes: 1 fixed (aligned), 2 first-hit, 3 sliding, 4 token bucket, 5 leaky bucket, 6
-- moving window. The moving window's lists are `<base>m<i>` next to the hash `<base>h`.

-- Only what every call needs is defined at the top: the rest is built on the first use in a call
-- (a conversion, ghosts to write), as defining every function at every call costs more than the
-- decision itself.
local function cv_numbers(s)
  local out = {}
  for p in string.gmatch(s, '[^,]+') do out[#out + 1] = tonumber(p) or 0 end
  return out
end

-- The descriptor of a rule given as script arguments: the strategy code, then five per quota.
local function cv_desc(code, from, to)
  return code .. ':' .. table.concat(ARGV, ',', from, to)
end

-- Ghosts: `w,spent,end;...`, each a removed period's spend, alive while `end` > now.
local function ghosts_parse(s)
  local G = {}
  if not s or s == '' then return G end
  for part in string.gmatch(s, '[^;]+') do
    local f = cv_numbers(part)
    G[#G + 1] = {w = f[1] or 0, spent = f[2] or 0, fin = f[3] or 0}
  end
  return G
end

-- The TTL (ms) that keeps the state until its last ghost dies, at least `ttl`.
local function ghosts_ttl(G, now, ttl)
  for _, g in ipairs(G) do
    if g.fin > now then ttl = max(ttl, div(g.fin - now + 999, 1000) + 1000) end
  end
  return ttl
end

local cv_lib = nil
-- Set when a conversion had to estimate (a moving window's old log did not reach back far enough):
-- the reply says so, and the store logs it once per limit.
local cv_estimated = false
local function CV()
  if cv_lib then return cv_lib end
  cv_lib = (function()
    -- The most ghosts a state keeps (the least spent go first).
    local MAX_GHOSTS = 8

    local function cv_parse(desc)
      local colon = string.find(desc, ':', 1, true)
      if not colon then return nil, {} end
      local nums = cv_numbers(string.sub(desc, colon + 1))
      local Q = {}
      for i = 1, math.floor(#nums / 5) do
        local b = (i - 1) * 5
        Q[i] = {lim = nums[b + 1], w = nums[b + 2], T = nums[b + 3], B = nums[b + 4], o = nums[b + 5]}
      end
      return tonumber(string.sub(desc, 1, colon - 1)), Q
    end

    local function cv_int(x)
      return string.format('%d', x)
    end

    local function ghosts_string(G)
      local parts = {}
      for i, g in ipairs(G) do
        parts[i] = cv_int(g.w) .. ',' .. cv_int(g.spent) .. ',' .. cv_int(g.fin)
      end
      return table.concat(parts, ';')
    end

    -- Every living ghost is charged `c` admitted units (the new rule decides; ghosts only count).
    local function ghosts_charge(G, c, now)
      local out = {}
      for _, g in ipairs(G) do
        if g.fin > now then
          out[#out + 1] = {w = g.w, spent = g.spent + c, fin = g.fin}
        end
      end
      return out
    end

    -- What the state proves was spent per old quota at `now`: {w, spent, fin (when the state of that
    -- quota would be fresh), start (first-hit), log (moving window: the timestamps within w)}.
    local function cv_spends(code, Qo, F, base, now)
      local out = {}
      for i, q in ipairs(Qo) do
        local w = q.w
        local r = {w = w, spent = 0, fin = 0}
        if code == 1 or code == 2 then
          local s, n = tonumber(F['s' .. i]) or 0, tonumber(F['n' .. i]) or 0
          local t = max(now, s)
          if code == 1 then
            if window_start(q, t) == s then r.spent = n end
          elseif n > 0 and t - s < w then
            r.spent = n
            r.start = s
          end
          r.fin = s + w
        elseif code == 3 then
          local b, c, p = tonumber(F['b' .. i]) or 0, tonumber(F['c' .. i]) or 0,
            tonumber(F['p' .. i]) or 0
          local t = max(now, b)
          local start = window_start(q, t)
          if start ~= b then
            if start == b + w then p = c else p = 0 end
            c = 0
          end
          -- The previous window's weighted share, rounded up (stricter).
          local share, rest = muldivmod(p, w - min(t - start, w), w)
          if rest > 0 then share = share + 1 end
          r.spent = c + share
          r.fin = start + w
          if c > 0 then r.fin = start + 2 * w end
          r.sliding = {b = start, c = c, p = p, o = q.o}
        elseif code == 4 or code == 5 then
          local tat = tonumber(F['t' .. i]) or 0
          if tat > now then
            local units, rest = divmod(tat - now, q.T)
            if rest > 0 then units = units + 1 end
            r.spent = units
            r.ahead, r.T = tat - now, q.T
          end
          r.fin = tat
        elseif code == 6 then
          local key = base .. 'm' .. i
          local raw = redis.call('LRANGE', key, 0, -1)
          local newest = 0
          if #raw > 0 then newest = tonumber(raw[#raw]) or 0 end
          local t = max(now, newest)
          local log = {}
          for _, v in ipairs(raw) do
            local x = tonumber(v) or 0
            if x + w > t then log[#log + 1] = x end
          end
          r.spent = #log
          r.log = log
          r.fin = newest + w
          redis.call('DEL', key)
        end
        out[#out + 1] = r
      end
      return out
    end

    -- The spend a new quota of period W starts at: the largest among old quotas (and ghosts) whose
    -- window lies inside W, else that of the shortest one containing it, as measured by `value`
    -- (units, or a bucket's deficit in time). Not capped at the new limit: two rule versions
    -- alternating (a rolling deploy) must not lose what one of them counted above the other's limit.
    local function cv_window(spends, W, value)
      local inside, best = false, 0
      local outer_w, outer = nil, 0
      for _, r in ipairs(spends) do
        local v = value(r)
        if r.w <= W then
          inside = true
          best = max(best, v)
        elseif outer_w == nil or r.w < outer_w or (r.w == outer_w and v > outer) then
          outer_w, outer = r.w, v
        end
      end
      if inside then return best end
      return outer
    end

    local function cv_units(r) return r.spent end

    -- A new quota's state in the new strategy's fields, holding spend `s` at `now`.
    local function cv_state(code, q, s, first, now, spends)
      if code == 1 then return {s = window_start(q, now), n = s} end
      if code == 2 then
        if s == 0 then return {s = 0, n = 0} end
        local start = first or now
        -- A window that has already ended would hand the spend back: it starts now instead.
        if start > now or start + q.w <= now then start = now end
        return {s = start, n = s}
      end
      if code == 3 then
        -- The same window grid keeps its two counters (the previous one keeps decaying, as if
        -- unchanged); any spend beyond them goes to the current window.
        for _, r in ipairs(spends) do
          local sl = r.sliding
          if sl and r.w == q.w and sl.o == q.o then
            return {b = sl.b, c = sl.c + max(s - r.spent, 0), p = sl.p}
          end
        end
        return {b = window_start(q, now), c = s, p = 0}
      end
      -- A bucket's deficit carries in time at the new emission interval (a unit's fraction too, so
      -- that two versions alternating do not round a unit up at every change), capped at the new
      -- burst; a window's spend in whole units.
      -- Units past 2^50 / T would leave exact integers: no bucket is that deep.
      local most = div(1125899906842624, q.T)
      local ahead = cv_window(spends, q.w, function(r)
        if r.ahead then
          local u, rest = divmod(r.ahead, r.T)
          local f, fr = muldivmod(q.T, rest, r.T)
          if fr > 0 then f = f + 1 end
          return min(u, most) * q.T + f
        end
        return min(r.spent, most) * q.T
      end)
      if ahead == 0 then return {t = 0} end
      -- Capped at the new burst: a deeper deficit would drain for longer than the new period.
      return {t = now + min(ahead, q.B * q.T)}
    end

    -- The moving window's new log for quota q: the old log with the longest period restricted to the
    -- last w (exact), padded with entries stamped now up to `s` where the old logs do not reach back.
    local function cv_log(spends, q, s, now)
      local src = nil
      for _, r in ipairs(spends) do
        if r.log and (src == nil or r.w > src.w) then src = r end
      end
      local E = {}
      local t = now
      if src then
        for _, x in ipairs(src.log) do
          if x + q.w > now then E[#E + 1] = x end
          t = max(t, x)
        end
      end
      if #E < s then cv_estimated = true end
      for _ = #E + 1, s do E[#E + 1] = t end
      return E
    end

    local function cv_write_log(key, E, ttl_ms)
      redis.call('DEL', key)
      local j = 1
      while j <= #E do
        local chunk = {}
        for m = j, min(j + 1023, #E) do chunk[#chunk + 1] = E[m] end
        redis.call('RPUSH', key, unpack(chunk))
        j = j + 1024
      end
      if #E > 0 then redis.call('PEXPIRE', key, ttl_ms) end
    end

    -- Whether the new bucket quota of the same period cuts old bucket spend r at its depth.
    local function cv_cut(code, r, Qn)
      if not r.ahead or (code ~= 4 and code ~= 5) then return false end
      for _, q in ipairs(Qn) do
        if q.w == r.w then
          local u, rest = divmod(r.ahead, r.T)
          local f, fr = muldivmod(q.T, rest, r.T)
          if fr > 0 then f = f + 1 end
          if u * q.T + f > q.B * q.T then return true end
        end
      end
      return false
    end

    -- The ghosts after a change to quotas Qn: every old quota or ghost whose period Qn lacks, and
    -- every old bucket whose deficit the new depth cut (converting back must find it), still alive
    -- and with spend; one per period (the largest spend, the latest end), at most MAX_GHOSTS.
    local function cv_ghosts(spends, code, Qn, now)
      local periods = {}
      for _, q in ipairs(Qn) do periods[q.w] = true end
      local by_w, G = {}, {}
      for _, r in ipairs(spends) do
        if (not periods[r.w] or cv_cut(code, r, Qn)) and r.fin > now and r.spent > 0 then
          local g = by_w[r.w]
          if g then
            g.spent = max(g.spent, r.spent)
            g.fin = max(g.fin, r.fin)
          else
            g = {w = r.w, spent = r.spent, fin = r.fin}
            by_w[r.w] = g
            G[#G + 1] = g
          end
        end
      end
      if #G > MAX_GHOSTS then
        table.sort(G, function(a, b) return a.spent > b.spent end)
        redis.log(redis.LOG_WARNING, 'tollgate: ' .. (#G - MAX_GHOSTS) .. ' removed periods forgotten')
        for i = #G, MAX_GHOSTS + 1, -1 do G[i] = nil end
      end
      return G
    end

    -- Converts the state in hash H (and its lists), written under descriptor `stored` with ghosts
    -- G_old, to the rule (code, Q) at `now`. Returns the new per-quota states (hash strategies) and
    -- the ghosts; for the moving window (code 6) it writes the new lists `lists[j]` itself (with TTL
    -- `ttls[j]` ms). The hash is deleted: the caller writes the new state back.
    local function convert(H, stored, G_old, code, Q, now, lists, ttls)
      local base = string.sub(H, 1, -2)
      local ocode, Qo = cv_parse(stored)
      local F = {}
      local all = redis.call('HGETALL', H)
      for i = 1, #all, 2 do F[all[i]] = all[i + 1] end
      local spends = cv_spends(ocode, Qo, F, base, now)
      for _, g in ipairs(G_old) do
        if g.fin > now then spends[#spends + 1] = {w = g.w, spent = g.spent, fin = g.fin} end
      end
      local first = nil
      for _, r in ipairs(spends) do
        if r.start and (first == nil or r.start < first) then first = r.start end
      end
      redis.call('DEL', H)
      local S = {}
      for j, q in ipairs(Q) do
        local s = cv_window(spends, q.w, cv_units)
        if code == 6 then
          cv_write_log(lists[j], cv_log(spends, q, s, now), ttls[j])
        else
          S[j] = cv_state(code, q, s, first, now, spends)
        end
      end
      return S, cv_ghosts(spends, code, Q, now)
    end
    return {convert = convert, parse = cv_parse, ghosts_string = ghosts_string,
            ghosts_charge = ghosts_charge}
  end)()
  return cv_lib
end
