-- release: a call or a run ends (queued or running -> absent): the task finished, failed,
-- was ignored, rejected, revoked or expired, or its publish failed.
--
-- KEYS[1]  record key
-- KEYS[2]  run key (may equal KEYS[1])
-- ARGV[1]  owner (packed task id)
-- ARGV[2]  run token of the run that ends; "" to release whatever this task id holds
--          (a publish that failed, a revoke, a lost worker child); RESTORED to withdraw a
--          restored record (restore.lua) whose message was acked meanwhile
--
-- Returns the number of keys freed. A key held by another task id, or by another run of
-- this task id, is never touched: a stale owner cannot release what someone else holds.
-- A restored record stands for every run of its task id: any of them ends it.
-- A run with a call waiting in it (see successor()) gives the key to that call; a call that
-- waits in another run's record is withdrawn from it.
local id, token = ARGV[1], ARGV[2]
local deleted = 0
local function release(key)
  local rec = load_record(key)
  if not rec then
    return
  end
  if rec[1] == id and (token == '' or run_token(rec) == token or run_token(rec) == RESTORED) then
    deleted = deleted + end_run(key, rec)
  elseif run_token(rec) and waits_in(rec, id) then
    deleted = deleted + drop_successor(key, rec)
  end
end
release(KEYS[1])
if KEYS[2] ~= KEYS[1] then
  release(KEYS[2])
end
return deleted
