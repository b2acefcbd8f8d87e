-- wait: a deferred message whose record is gone (a Redis restart or failover lost it) takes
-- its place again: it holds the free key; or waits in the run that holds it; or holds it
-- ahead of a call accepted while it waited, which waits in it (either message may come
-- first: the other keeps its place). Without it, every call made while it waits for its next
-- try is accepted when the key frees, and the message that lost its record can lose every
-- race after that.
--
-- KEYS[1]  record key (the run key too, with unique_until="finished")
-- ARGV[1]  owner (packed task id)
-- ARGV[2]  its queued record, msgpack
-- ARGV[3]  time to live of that record, ms
-- ARGV[4]  when the message was first deferred (unix seconds, the deferring host's clock;
--          0: unknown)
--
-- Returns
--   1   queued: the key was free and holds this record again
--   2   waits: the running record of another task id keeps this record as the call that
--       gets the key when the run ends (successor() in the prelude), now or already
--   3   its own: the key holds this task id's record
--   4   ahead: the key held the queued record of a call accepted after ARGV[4]; this message
--       holds it now as a restored record (see the prelude), that call waiting in it
--   0   left alone: a call being published into the key, or queued before ARGV[4], or a
--       run another call waits in
local id = ARGV[1]
local since = tonumber(ARGV[4]) or 0
if since <= 0 then
  since = nil  -- (unknown: never ahead of another call)
end
local rec, raw = load_record(KEYS[1])
if not rec then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
if rec[1] == id then
  return 3
end
if #rec == 2 then
  return 0
end
if not run_token(rec) then
  if not since or #rec < 3 or rec[3] <= since then
    return 0  -- (a call older than this message's wait holds the key: it goes first)
  end
  -- A call accepted while this message waited: this one goes first, and that one waits.
  hold_ahead(KEYS[1], restored(id), raw, 0, tonumber(ARGV[3]))
  return 4
end
return wait_in_run(KEYS[1], rec, id, ARGV[2], tonumber(ARGV[3]), since)
