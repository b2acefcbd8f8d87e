-- confirm: the message of a call is published; its provisional record becomes durable
-- (provisional -> queued, with the call's full time to live).
--
-- KEYS[1]  call key
-- ARGV[1]  this call's provisional record
-- ARGV[2]  its queued record
-- ARGV[3]  time to live, ms (unique_ttl + countdown/eta)
--
-- Returns
--   1   confirmed (also when it was already: redis-py re-sent the command)
--   0   left alone: the key is gone (the provisional ttl ran out before the publish
--       returned, or the run already ended), or a run or another call holds it. A key that
--       is gone is never re-created: its run may have ended, and a queued record would
--       then name a finished task.
local raw = redis.call('GET', KEYS[1])
if raw == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if raw == ARGV[2] then
  return 1
end
return 0
