-- renew_slot: the heartbeat of a run extends its slot's lease (running -> running).
--
-- KEYS[1]  slots (slot.lua)
-- ARGV[1]  "<task id> <run token>"
-- ARGV[2]  lease, ms
--
-- Returns 1 renewed, 0 lost: the slot's lease was over (the run stalled past it) and the
-- slot may be another run's now; it is not taken back (that could exceed the limit).
local now = tonumber(redis.call('TIME')[1]) * 1000
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ends or tonumber(ends) <= now then
  return 0
end
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[1])
if redis.call('PTTL', KEYS[1]) < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
return 1
