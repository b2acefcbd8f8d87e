-- cancel: a call is withdrawn before it runs (queued -> absent): its publish failed, or it
-- was revoked through the result the producer got.
--
-- KEYS[1]  record key
-- ARGV[1]  owner (packed task id)
-- ARGV[2]  (optional) a provisional record: delete only these very bytes. A call that never
--          read its enqueue's answer wrote them or nothing: the key may hold another call's
--          record of the same task id (an explicit id), with its message
--
-- Returns 1 if the queued record was deleted (or withdrawn from the run it waited in, see
-- successor()), or its restored record ended (a message that gives up), else 0. A running
-- record is never touched otherwise: a revoke without terminate does
-- not stop a run that started, and the run frees its key when it ends (task_revoked, or the
-- lease).
if ARGV[2] then
  if redis.call('GET', KEYS[1]) == ARGV[2] then
    return redis.call('DEL', KEYS[1])
  end
  return 0
end
local rec = load_record(KEYS[1])
if rec and rec[1] == ARGV[1] and not run_token(rec) then
  return redis.call('DEL', KEYS[1])
end
if rec and rec[1] == ARGV[1] and run_token(rec) == RESTORED then
  return end_run(KEYS[1], rec)  -- (the call waiting in it gets the key)
end
if rec and run_token(rec) and waits_in(rec, ARGV[1]) then
  return drop_successor(KEYS[1], rec)
end
return 0
