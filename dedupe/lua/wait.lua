-- wait: a deferred message whose record is gone (a Redis restart or failover lost it) takes
-- its place again: it holds the free key, or waits in the run that holds it (finished mode).
-- Without it, every call made while it waits for its next try is accepted when the key
-- frees, and the message that lost its record can lose every race after that.
--
-- KEYS[1]  record key (the run key too, with unique_until="finished")
-- ARGV[1]  owner (packed task id)
-- ARGV[2]  its queued record, msgpack
-- ARGV[3]  time to live of that record, ms
--
-- Returns
--   1   queued: the key was free and holds this record again
--   2   waits: the running record of another task id keeps this record as the call that
--       gets the key when the run ends (successor() in the prelude), now or already
--   3   its own: the key holds this task id's record
--   0   left alone: a queued record of another task id, or a run another call waits in
local id = ARGV[1]
local rec = load_record(KEYS[1])
if not rec then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if rec[1] == id then
  return 3
end
if not run_token(rec) then
  return 0
end
if successor(rec) then
  if waits_in(rec, id) then
    return 2
  end
  return 0
end
local pttl = math.max(redis.call('PTTL', KEYS[1]), 1)
if #rec < 6 then
  -- The record lived for its lease: that lease, carried inside now that it lives longer.
  rec[6] = server_seconds() + math.ceil(pttl / 1000)
end
rec[7] = ARGV[2]
redis.call('SET', KEYS[1], cmsgpack.pack(rec), 'PX', math.max(pttl, tonumber(ARGV[3])))
return 2
