local FIELDS = {'t'}
local function check(st, q, now, c)
  local T, B = q.T, q.B
  local tau = B * T
  local t = max(now, max(st.t - tau, 0))
  local ahead = max(st.t - t, 0)
  local rem_now = min(div(tau - min(ahead, tau), T), B)
  if c > B then return {2, B, rem_now, ahead, 0} end
  local after = ahead + c * T
  if after <= tau then return {0, B, min(div(tau - after, T), B), after, 0} end
  return {1, B, rem_now, ahead, after - tau}
end
local function commit(st, q, now, c)
  local tau = q.B * q.T
  local t = max(now, max(st.t - tau, 0))
  st.t = max(st.t, t) + c * q.T
end
-- Moves TAT by (actual - reserved) * T: not back below now, and the content (TAT - now) not past
-- the bucket's depth (one horizon) unless already above.
local function settle(st, q, now, reserved, act)
  if act <= reserved then
    local c = reserved - act
    local base = 0
    if c <= div(st.t, q.T) then base = st.t - c * q.T end
    st.t = max(base, min(now, st.t))
  else
    local tau = q.B * q.T
    st.t = min(max(st.t, now) + (act - reserved) * q.T, max(now + tau, st.t))
  end
end
-- A queue's last reservation steps back: only while TAT is still its end `at` (no reservation
-- came after it), by c * T, not back below now.
step_back = function(st, q, now, c, at)
  if st.t == at then st.t = max(st.t - c * q.T, min(now, st.t)) end
end
