-- leave_line: a limited call's message was revoked or expired before its run (the worker
-- dropped it), or its publish failed: its place in line goes (waiting -> gone), so the
-- calls behind it move up now rather than when the place lapses.
--
-- KEYS[1]  line, KEYS[2] due, KEYS[3] seq (ticket.lua)
-- ARGV[1]  task id
--
-- Returns 1 left, 0 it had no place.
redis.call('ZREM', KEYS[2], ARGV[1])
local left = redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[3])  -- (nobody waits: the count starts again, nothing left behind)
end
return left
