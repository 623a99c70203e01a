local FIELDS = {'b', 'c', 'p'}
local function share(count, w, e)
  local q = muldivmod(count, w - min(e, w), w)
  return q
end
local function earliest(count, w, room)
  if count == 0 then return 0 end
  local span
  if room + 1 > count then
    span = w
  elseif room + 1 == count then
    span = w - 1
  else
    local q, r = muldivmod(w, room + 1, count)
    if r >= 1 then span = q else span = q - 1 end
    span = min(span, w)
  end
  return w - span
end
local function reset_of(w, e, cur, prev)
  if cur > 0 then return (w - e) + earliest(cur, w, 0) end
  return max(earliest(prev, w, 0) - e, 0)
end
local function check(st, q, now, c)
  local t = max(now, st.b)
  local w, lim = q.w, q.lim
  local start = window_start(q, t)
  if start ~= st.b then
    if start == st.b + w then st.p = st.c else st.p = 0 end
    st.c = 0
    st.b = start
  end
  local e = t - start
  local cur, prev = st.c, st.p
  local weighted = cur + share(prev, w, e)
  local remaining = max(lim - weighted, 0)
  if c > lim then return {2, lim, remaining, reset_of(w, e, cur, prev), 0} end
  if weighted + c <= lim then
    return {0, lim, remaining - c, reset_of(w, e, cur + c, prev), 0}
  end
  local room = lim - c
  local wait
  local eo = w
  if cur <= room then eo = earliest(prev, w, room - cur) end
  if cur <= room and eo < w then
    wait = eo - e
  else
    wait = (w - e) + earliest(cur, w, room)
  end
  return {1, lim, remaining, reset_of(w, e, cur, prev), wait}
end
local function commit(st, q, now, c)
  st.c = min(st.c + c, 4294967295)
end
-- Moves the count of the reservation's bucket (current or previous) by actual - reserved.
local function settle(st, q, now, reserved, act)
  check(st, q, now, 0)
  local function adjust(count)
    if act <= reserved then return max(count - (reserved - act), 0) end
    return min(count + (act - reserved), max(count, q.lim))
  end
  if at >= st.b then
    st.c = adjust(st.c)
  elseif at >= st.b - q.w then
    st.p = adjust(st.p)
  end
end
