-- restore: the record of a message the broker holds for a worker (delivered, not acked: a
-- reserved or running task, or one whose worker died and which the broker will give back)
-- is written back after Redis lost it (absent -> restored). Without it, a message whose
-- worker was killed before the loss waits out the broker's visibility timeout with no key:
-- every call made meanwhile is accepted, one after another as each run ends.
--
-- KEYS[1]  record key (the run key too: unique_until="finished")
-- KEYS[2]  (unique_until="started") the run lock: held by a run of this task id, the message
--          runs, and its call key stays as the run left it (free, or a call made since)
-- ARGV[1]  owner (packed task id)
-- ARGV[2]  the restored record: a running record of token RESTORED (no lease_ends, no next)
-- ARGV[3]  its queued record, for a run it waits in
-- ARGV[4]  time to live, ms: until the broker gives the message back, and a lease more
-- ARGV[5]  lease, ms: a restored record stands for a live run until it is over (that run's
--          heartbeat takes it back meanwhile), then for a dead one, whose message comes back
--
-- Returns
--   1   restored: the key was free
--   2   restored with the call accepted since inside (its queued record), which gets the
--       key when this task id's run ends; or it waits in the run of another task id
--   3   its own: the key holds this task id's record
--   4   not yet: a call accepted since is still being published (a provisional record)
--   0   left alone: a run another call waits in already
--   5   running: KEYS[2] holds a live run of this task id (its heartbeat re-created it)
local id, ttl = ARGV[1], tonumber(ARGV[4])
if KEYS[2] then
  local run = load_record(KEYS[2])
  if run and run[1] == id and run_token(run) and run_token(run) ~= RESTORED then
    return 5
  end
end
local raw = redis.call('GET', KEYS[1])
local rec = raw and cmsgpack.unpack(raw)
if rec and rec[1] == id then
  return 3
end
if rec and run_token(rec) then
  return wait_in_run(KEYS[1], rec, id, ARGV[3], ttl)
end
if rec and #rec == 2 then
  return 4
end
hold_ahead(KEYS[1], cmsgpack.unpack(ARGV[2]), raw, tonumber(ARGV[5]), ttl)
return rec and 2 or 1
