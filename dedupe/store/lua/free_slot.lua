-- free_slot: a run's end frees its slot (running -> gone); owner-checked by the run token.
--
-- KEYS[1]  slots (slot.lua)
-- ARGV[1]  "<task id> <run token>"
--
-- Returns 1 freed, 0 not held (freed already, or its lease was over).
return redis.call('ZREM', KEYS[1], ARGV[1])
