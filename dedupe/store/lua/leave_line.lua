-- leave_line: a limited call's message was revoked or expired before its run (the worker
-- dropped it): its place in line goes (waiting -> gone), so the calls behind it move up
-- now rather than when the place lapses.
--
-- KEYS[1]  line, KEYS[2] due (ticket.lua)
-- ARGV[1]  task id
--
-- Returns 1 left, 0 it had no place.
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
