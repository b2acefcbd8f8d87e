-- withdraw: a record restore.lua wrote back for a message a worker held is withdrawn, the
-- message gone since without running (acked, revoked, or run and ended before the record was
-- written): restored -> absent (the key to the call waiting in it), or its place in another
-- run's record given up.
--
-- Only what that restore wrote is touched, told by its bytes: a message that went on as a new
-- message of its task id (a retry, a deferral's next try) takes its place again with records
-- of its own (wait.lua, requeue.lua, claim.lua), which must stay.
--
-- KEYS[1]  record key
-- ARGV[1]  the restored record restore.lua was given (its owner and when it was delivered)
-- ARGV[2]  the queued record restore.lua was given (its place in a run)
--
-- Returns 1 if the record or the place was withdrawn, else 0.
local rec = load_record(KEYS[1])
if not rec or not run_token(rec) then
  return 0
end
local mine = cmsgpack.unpack(ARGV[1])
if rec[1] == mine[1] and rec[2] == RESTORED and rec[5] == mine[5] then
  return end_run(KEYS[1], rec)
end
if successor(rec) == ARGV[2] then
  return drop_successor(KEYS[1], rec)
end
return 0
