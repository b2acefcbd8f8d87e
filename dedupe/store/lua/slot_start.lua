-- slot_start: a run of a task with key_concurrency and key_rate_limit asks for a slot and
-- a start together (waiting -> running): it runs when its turn in line has come (slot.lua)
-- and fewer than N runs of its key started in the last period (start.lua's check at a
-- run). Else it takes neither: a run whose turn has come but not its start keeps its place
-- at the head of the line and comes back when the period frees.
--
-- KEYS[1..4]  slots, line, due, seq: as in slot.lua
-- KEYS[5..6]  starts, plan: as in start.lua
-- ARGV[1..6]  as slot.lua's
-- ARGV[7]     N, starts per period
-- ARGV[8]     the period, ms
-- ARGV[9]     as slot.lua's ARGV[7]
--
-- Returns {ahead, wait}
--   {0, 0}    started: the run holds a slot, its start recorded (also when this very run
--             started already)
--   {n, 0}    n>0: this run is the nth to get a slot as slots free; come back later
--   {0, ms}   its turn, not its start: come back in ms
local now = server_ms()
local id, member = ARGV[1], ARGV[1] .. ' ' .. ARGV[2]
local lease, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local n, period = tonumber(ARGV[7]), tonumber(ARGV[8])
local held, ahead = slot_turn(KEYS[1], KEYS[2], KEYS[3], KEYS[4], id, member, limit, now)
if held then
  return {0, 0}
end
if ahead > 0 then
  local back = come_back(ahead, limit, tonumber(ARGV[5]), tonumber(ARGV[9]))
  keep_place(KEYS[2], KEYS[3], KEYS[4], id, now, back, lease, tonumber(ARGV[6]))
  return {ahead, 0}
end
forget_starts(KEYS[5], KEYS[6], now, period)
local started = last_starts(KEYS[5], n)
if #started >= 2 * n then
  local wait = math.max(tonumber(started[2]) + period + 1 - now, 1)
  keep_place(KEYS[2], KEYS[3], KEYS[4], id, now, wait, lease, tonumber(ARGV[6]))
  return {0, wait}
end
claim_slot(KEYS[1], KEYS[2], KEYS[3], KEYS[4], id, member, lease, now)
redis.call('ZREM', KEYS[6], id)  -- (its reserved start is used now)
redis.call('ZADD', KEYS[5], now, member)
keep_alive(KEYS[5], period)
return {0, 0}
