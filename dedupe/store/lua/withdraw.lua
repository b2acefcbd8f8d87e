-- withdraw: a record restore.lua wrote back for a message a worker held is withdrawn, the
-- message gone since without running (acked, revoked, or run and ended before the record was
-- written): restored -> absent (the key to the call waiting in it), or its place in another
-- run's record given up.
--
-- Only what that restore wrote is touched, told by its bytes: a message that went on as a new
-- message of its task id (a retry, a deferral's next try) takes its place again with records
-- of its own (wait.lua, requeue.lua, claim.lua), which must stay.
--
-- KEYS      the record key, and (unique_until="started") the run lock restore_run_lock.lua
--           may have written
-- ARGV[1]  the restored record restore.lua was given (its owner and when it was delivered)
-- ARGV[2]  the queued record restore.lua was given (its place in a run)
--
-- Returns 1 if a record or the place was withdrawn, else 0.
local mine = cmsgpack.unpack(ARGV[1])
local withdrawn = 0
for _, key in ipairs(KEYS) do
  local rec = load_record(key)
  if rec and run_token(rec) then
    if rec[1] == mine[1] and rec[2] == RESTORED and rec[5] == mine[5] then
      withdrawn = math.max(withdrawn, end_run(key, rec))
    elseif successor(rec) == ARGV[2] then
      withdrawn = math.max(withdrawn, drop_successor(key, rec))
    end
  end
end
return withdrawn
