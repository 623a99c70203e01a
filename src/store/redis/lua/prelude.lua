local op = tonumber(ARGV[1])
local arg_cost = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
if now == 0 then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end
local ttl = tonumber(ARGV[4])
-- The strategy's code (see convert.lua); 1: the clock-aligned fixed window.
local code = tonumber(ARGV[5])
local aligned = code == 1
local n = tonumber(ARGV[6])
local Q = {}
for i = 1, n do
  local b = 6 + (i - 1) * 5
  -- o: where clock-aligned windows start (a window offset), in 0..w.
  Q[i] = {lim = tonumber(ARGV[b + 1]), w = tonumber(ARGV[b + 2]),
          T = tonumber(ARGV[b + 3]), B = tonumber(ARGV[b + 4]), o = tonumber(ARGV[b + 5])}
end
local at = tonumber(ARGV[6 + n * 5 + 1]) or 0
-- Settle: the reservation's cost is `arg_cost`, the cost to charge instead `actual`.
local actual = tonumber(ARGV[6 + n * 5 + 2]) or 0
local cost = 0
if op == 0 then cost = arg_cost end
-- The rule's descriptor, recorded with the state.
local desc = cv_desc(code, 7, min(6 + n * 5, #ARGV))
local consuming = (op == 0 and cost > 0) or (op == 2 and actual > arg_cost)
