-- renew: the heartbeat of a run extends its lease (running -> running).
--
-- KEYS[1]  run key
-- ARGV[1]  owner (packed task id)
-- ARGV[2]  run token
-- ARGV[3]  lease, ms
-- ARGV[4]  the running record, msgpack, to re-create a key that is gone
--
-- Returns
--   1   renewed
--   2   re-created: the key was gone (Redis restarted, failed over or evicted it)
--   0   lost: another task or another run holds the key now; it is left alone
local rec = load_record(KEYS[1])
if not rec then
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[3])
  return 2
end
if rec[1] == ARGV[1] and run_token(rec) == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
