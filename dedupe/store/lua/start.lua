-- start: the starts of a key with key_rate_limit (at most N starts in any period).
-- A producer reserves its call's start in the key's plan (the next free one, among the
-- starts made and reserved: a countdown for its message). A run, as it starts, checks the
-- starts made: it starts when fewer than N runs started in the last period, else it is sent
-- again: for the moment the period frees, when its own reserved start has come (the runs
-- before it started a few ms after theirs), else for the next free start in the plan. So
-- messages due at one moment on many workers (prefetch, clock skew, a worker that was down)
-- cannot bunch: the limit holds at the starts.
--
-- KEYS[1]  starts: sorted set, member "<task id> <run token>", score (server ms) of a run's
--          start; forgotten a period later
-- KEYS[2]  plan: sorted set, member task id, score (server ms) of its reserved start
-- ARGV[1]  task id
-- ARGV[2]  N, starts per period
-- ARGV[3]  the period, ms
-- ARGV[4]  "run <token>": a run starting now; "call": a producer reserving a start
-- ARGV[5]  (call) the earliest start, ms from now (the call's own countdown or eta)
--
-- Returns the ms from now to this task id's start: 0 a run started (its start recorded);
-- else the run, or the call's message, waits that long.
local id, n, period = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if ARGV[4] == 'call' then
  local at, now = reserve_start(KEYS[1], KEYS[2], id, n, period, tonumber(ARGV[5]) or 0)
  return math.max(math.ceil(at - now), 0)
end

local now = server_ms()
forget_starts(KEYS[1], KEYS[2], now, period)
local token = string.sub(ARGV[4], 5)
local reserved = redis.call('ZSCORE', KEYS[2], id)
redis.call('ZREM', KEYS[2], id)  -- (its reservation is used now, or moved)
local started = last_starts(KEYS[1], n)
if #started < 2 * n then
  redis.call('ZADD', KEYS[1], now, id .. ' ' .. token)
  keep_alive(KEYS[1], period)
  return 0
end
-- N runs started within the period: not before the oldest of them is a period old.
local earliest = tonumber(started[2]) + period + 1
if reserved and tonumber(reserved) <= now then
  -- Its reserved start has come, and the runs of the period before started a moment
  -- after theirs (delivery takes a few ms): it waits for that moment, in its place, not
  -- behind every start reserved since (which put runs out of order, and a period late).
  redis.call('ZADD', KEYS[2], earliest, id)
  keep_alive(KEYS[2], earliest - now + period)
  return math.max(math.ceil(earliest - now), 1)
end
return math.max(math.ceil(plan_start(KEYS[1], KEYS[2], id, n, period, earliest, now) - now), 1)
