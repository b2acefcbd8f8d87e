-- renew: the heartbeat of a run extends its lease (running -> running).
--
-- KEYS[1]  run key
-- KEYS[2]  (unique_until="started") the call's record key: a restored record of this task id
--          there (restore.lua: the message was delivered, but it runs now) is withdrawn
-- ARGV[1]  owner (packed task id)
-- ARGV[2]  run token
-- ARGV[3]  lease, ms
-- ARGV[4]  the running record, msgpack, to re-create a key that is gone
-- ARGV[5]  time to live of the record, ms (claim.lua's ARGV[8]: the redelivery horizon, or
--          the lease); each renewal moves the lease carried in the record
--
-- Returns
--   1   renewed
--   2   re-created: the key was gone (Redis restarted, failed over or evicted it), or held
--       by this task id's restored record (restore.lua), or by a call accepted since: the run takes its key back with that call's queued record
--       inside, and the key goes to the call when the run ends (one call let in, no more,
--       and it runs after this run)
--   3   not yet: a call accepted since is still being published (a provisional record);
--       the next beat takes the key back
--   0   lost: another task or another run holds the key now; it is left alone
local lease_ms, record_ttl_ms = tonumber(ARGV[3]), tonumber(ARGV[5]) or 0
if KEYS[2] then
  local queued = load_record(KEYS[2])
  if queued and queued[1] == ARGV[1] and run_token(queued) == RESTORED then
    end_run(KEYS[2], queued)
  end
end
local rec = load_record(KEYS[1])
if not rec then
  store_running(KEYS[1], cmsgpack.unpack(ARGV[4]), lease_ms, record_ttl_ms)
  return 2
end
if rec[1] == ARGV[1] and run_token(rec) == ARGV[2] then
  if #rec >= 6 or record_ttl_ms > lease_ms then
    store_running(KEYS[1], rec, lease_ms, record_ttl_ms)
  else
    redis.call('PEXPIRE', KEYS[1], lease_ms)
  end
  return 1
end
if rec[1] == ARGV[1] and run_token(rec) == RESTORED then
  -- Restored for this run (restore.lua) before this beat re-created it: its own again.
  local mine = cmsgpack.unpack(ARGV[4])
  if successor(rec) then
    mine[6], mine[7] = 0, rec[7]
  end
  store_running(KEYS[1], mine, lease_ms, record_ttl_ms)
  return 2
end
if rec[1] ~= ARGV[1] and not run_token(rec) then
  if #rec == 2 then
    return 3
  end
  local mine = cmsgpack.unpack(ARGV[4])
  mine[6], mine[7] = 0, redis.call('GET', KEYS[1])
  store_running(KEYS[1], mine, lease_ms, record_ttl_ms)
  return 2
end
return 0
