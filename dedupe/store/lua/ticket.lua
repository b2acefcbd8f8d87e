-- ticket: a call of a task with key_concurrency takes its place in its key's line (no
-- place -> a place at the back). Every call is accepted: nothing is refused here.
--
-- KEYS[1]  line: sorted set, member task id, score its ticket (call order)
-- KEYS[2]  due: sorted set, member task id, score (server ms) when its place lapses if no
--          run of it has come to ask (a message lost before any worker saw it)
-- KEYS[3]  seq: the key's ticket counter
-- ARGV[1]  task id
-- ARGV[2]  how long the place waits for its message's first run, ms (unique_ttl + countdown)
--
-- Returns the ticket (a re-sent command, or the same task id again, keeps its first one).
local now = server_ms()
local ttl = tonumber(ARGV[2])
local ticket = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ticket then
  ticket = redis.call('INCR', KEYS[3])
  redis.call('ZADD', KEYS[1], ticket, ARGV[1])
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
end
for i = 1, 3 do
  if redis.call('PTTL', KEYS[i]) < ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return tonumber(ticket)
