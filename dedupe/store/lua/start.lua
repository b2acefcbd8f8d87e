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
local now = server_ms()
local id, n, period = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
forget_starts(KEYS[1], KEYS[2], now, period)

local earliest = now
if ARGV[4] == 'call' then
  local reserved = redis.call('ZSCORE', KEYS[2], id)
  if reserved then
    return math.max(math.ceil(tonumber(reserved) - now), 0)  -- (a re-sent command)
  end
  earliest = now + math.max(tonumber(ARGV[5]) or 0, 0)
else
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
  earliest = tonumber(started[2]) + period + 1
  if reserved and tonumber(reserved) <= now then
    -- Its reserved start has come, and the runs of the period before started a moment
    -- after theirs (delivery takes a few ms): it waits for that moment, in its place, not
    -- behind every start reserved since (which put runs out of order, and a period late).
    redis.call('ZADD', KEYS[2], earliest, id)
    keep_alive(KEYS[2], earliest - now + period)
    return math.max(math.ceil(earliest - now), 1)
  end
end

-- The scores that read(set) finds in the starts made and in the plan, together, sorted.
local function times_of(read)
  local times = {}
  for k = 1, 2 do
    local found = read(KEYS[k])
    for i = 2, #found, 2 do
      times[#times + 1] = tonumber(found[i])
    end
  end
  table.sort(times)
  return times
end

-- The starts (made and reserved) between lo and hi, exclusive.
local function times_between(lo, hi)
  return times_of(function(set)
    return redis.call('ZRANGEBYSCORE', set, '(' .. lo, '(' .. hi, 'WITHSCORES')
  end)
end

-- The last n starts (made and reserved): a long plan is never read whole.
local function last_times()
  return times_of(function(set)
    return redis.call('ZRANGE', set, -n, -1, 'WITHSCORES')
  end)
end

-- Would a start at t keep every window of a period at N starts or fewer?
local function fits(t)
  local times = times_between(t - period, t + period)
  times[#times + 1] = t
  table.sort(times)
  for i = n + 1, #times do
    if times[i] - times[i - n] < period then
      return false
    end
  end
  return true
end

local at = earliest
if not fits(at) then
  -- The next free start: after every start made or reserved, a period after the Nth last.
  local times = last_times()
  at = math.max(earliest, times[#times])
  if #times >= n then
    at = math.max(at, times[#times - n + 1] + period)
  end
end
redis.call('ZADD', KEYS[2], at, id)
keep_alive(KEYS[2], at - now + period)
if ARGV[4] == 'call' then
  return math.max(math.ceil(at - now), 0)
end
return math.max(math.ceil(at - now), 1)
