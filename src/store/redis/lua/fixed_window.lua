local FIELDS = {'s', 'n'}
local function check(st, q, now, c)
  local t = max(now, st.s)
  local w, lim = q.w, q.lim
  if aligned then
    local ws = window_start(q, t)
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
-- Moves the count of the reservation's window by actual - reserved, if that window is still open;
-- a charge takes the count to the limit at most (or leaves it, if above).
local function settle(st, q, now, reserved, act)
  check(st, q, now, 0)
  local t = max(now, st.s)
  if at < st.s or t - st.s >= q.w then return end
  if act <= reserved then
    st.n = max(st.n - (reserved - act), 0)
  else
    st.n = min(st.n + (act - reserved), max(st.n, q.lim))
  end
end
