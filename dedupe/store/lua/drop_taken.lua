-- drop_taken: a run that took the latest arguments (take_latest.lua) has ended: the take it
-- kept for a resend is dropped, and with it the hash when nothing else is left in it.
--
-- KEYS[1]  the call's latest-arguments hash
-- ARGV[1]  owner (packed task id)
--
-- Returns 1 dropped, 0 the kept take was another run's (or gone).
local taken = redis.call('HGET', KEYS[1], 'taken')
if taken and cmsgpack.unpack(taken)[1] == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'taken')
  return 1
end
return 0
