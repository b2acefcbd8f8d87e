-- slot: a run of a task with key_concurrency asks for a slot (waiting -> running). It gets
-- one when fewer than the limit run and no call before it waits: the line is call order.
--
-- KEYS[1]  slots: sorted set, member "<task id> <run token>", score (server ms) when its
--          lease ends; a slot whose lease is over (its worker died) is free
-- KEYS[2]  line, KEYS[3] due, KEYS[4] seq: as in ticket.lua
-- ARGV[1]  task id
-- ARGV[2]  run token
-- ARGV[3]  lease, ms
-- ARGV[4]  the limit: runs of this key at once
-- ARGV[5]  when a waiting run is asked to come back, ms from now (its place lapses a lease
--          after that, if it never comes: its worker died with the message)
-- ARGV[6]  how long a place taken here lives, at most, ms (unique_ttl)
--
-- Returns
--   0    claimed: the run holds a slot (also when this very run claimed already)
--   n>0  wait: this run is the nth to get a slot as slots free; come back later
local now = server_ms()
local id, member = ARGV[1], ARGV[1] .. ' ' .. ARGV[2]
local lease, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)  -- (dead runs' slots are free)
if redis.call('ZSCORE', KEYS[1], member) then
  return 0
end
-- Places whose message never came (lost before any worker saw it, or whose worker died
-- while it waited) lapse, a few at a time.
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
for _, gone in ipairs(lapsed) do
  if gone ~= id then
    redis.call('ZREM', KEYS[2], gone)
    redis.call('ZREM', KEYS[3], gone)
  end
end
if not redis.call('ZSCORE', KEYS[2], id) then
  -- No place: a message the producer did not see, a retry, a redelivery after its place
  -- lapsed. It goes to the back of the line.
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), id)
end
local rank = redis.call('ZRANK', KEYS[2], id)
local free = limit - redis.call('ZCARD', KEYS[1])
if rank < free then
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[4])  -- (nobody waits: the count starts again, nothing left behind)
  end
  redis.call('ZADD', KEYS[1], now + lease, member)
  if redis.call('PTTL', KEYS[1]) < lease then
    redis.call('PEXPIRE', KEYS[1], lease)
  end
  return 0
end
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]) + lease, id)
local keep = math.max(tonumber(ARGV[6]), tonumber(ARGV[5]) + lease)
for i = 2, 4 do
  if redis.call('PTTL', KEYS[i]) < keep then
    redis.call('PEXPIRE', KEYS[i], keep)
  end
end
return rank - math.max(free, 0) + 1
