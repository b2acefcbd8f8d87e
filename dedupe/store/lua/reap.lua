-- reap: a queued record whose message is gone from the broker is freed (queued -> absent):
-- the reaper found the message in none of the places it can be, in two passes apart
-- (dedupe.runs.reaping).
--
-- KEYS[1]  call key
-- ARGV[1]  the queued record both passes read: only these very bytes are deleted. A record
--          that changed since (claimed by a run, a new call after a free) has its message
--
-- Returns 1 if the record was deleted, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
