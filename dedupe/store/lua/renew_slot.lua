-- renew_slot: the heartbeat of a run extends its slot's lease (running -> running).
--
-- KEYS[1]  slots (slot.lua)
-- ARGV[1]  "<task id> <run token>"
-- ARGV[2]  lease, ms
--
-- Returns 1 renewed, 2 re-created: the slot was gone (Redis lost it in a restart or a
-- failover, or the run stalled past its lease and it lapsed). The run is live, so it is
-- counted again, even if the key's runs are over the limit for a while: a slot that tells
-- the truth holds the next runs back until enough have ended.
local now = server_ms()
local lease = tonumber(ARGV[2])
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
if redis.call('PTTL', KEYS[1]) < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
if not ends or tonumber(ends) <= now then
  return 2
end
return 1
