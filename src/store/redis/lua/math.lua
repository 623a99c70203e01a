local P = {}
do
  local p = 1
  for i = 0, 53 do P[i] = p; p = p * 2 end
end
-- floor(a / b) and a mod b, exactly for integers 0 <= a < 2^52, b >= 1 (q*b stays below 2^53).
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  while r < 0 do q = q - 1; r = r + b end
  while r >= b do q = q + 1; r = r - b end
  return q, r
end
-- a*b = q*c + r with 0 <= r < c, exactly; needs 0 <= b <= c, c >= 1, integers below 2^52. When
-- a*b could pass 2^52, long multiplication bit by bit keeps every intermediate value below c.
local function muldivmod(a, b, c)
  if b == 0 or a < math.floor(4503599627370496 / b) then return divmod(a * b, c) end
  local q, r, started = 0, 0, false
  for i = 52, 0, -1 do
    local bit = false
    if a >= P[i] then a = a - P[i]; bit = true end
    if started then
      q = q * 2
      if r >= c - r then r = r - (c - r); q = q + 1 else r = r + r end
    end
    if bit then
      started = true
      if r >= c - b then r = r - (c - b); q = q + 1 else r = r + b end
    end
  end
  return q, r
end
local function div(a, b) local q = divmod(a, b); return q end
local function mod(a, b) local _, r = divmod(a, b); return r end
local max, min = math.max, math.min
-- Op 4 (a queue's step back): defined by the bucket script only; the others leave the state alone.
local step_back = nil

-- The start of the clock-aligned window of quota q that holds t.
local function window_start(q, t)
  return t - mod(mod(t, q.w) + q.o, q.w)
end
