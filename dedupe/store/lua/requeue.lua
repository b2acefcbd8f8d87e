-- requeue: a continuation of a task id goes back to the queue (running -> queued): a retry,
-- a replace with the same task, a worker lost under retry_on_worker_lost, a requeued Reject.
--
-- KEYS[1]  record key
-- KEYS[2]  run key (equal to KEYS[1] with unique_until="finished")
-- ARGV[1]  owner (packed task id)
-- ARGV[2]  run token of the run that continues; "" when the caller is no run (the worker's
--          main process after losing the child) and speaks for every run of this task id
-- ARGV[3]  the record: provisional for a continuation the producer publishes (confirm.lua
--          makes it durable once the message is out), else queued
-- ARGV[4]  time to live, ms
--
-- A call waiting in this task id's record (successor(): accepted while the key was lost, or
-- while this message waited for its next try) keeps its place behind the next message: the
-- key holds a restored record of this task id with the call inside (see hold_ahead), which
-- that message's claim takes as its own, and which gives the key to the call if the
-- continuation is withdrawn (cancel.lua). A queued record in its place would drop the call,
-- whose message is in the broker.
--
-- Returns
--   1   queued: the record is this task id's, queued again with the new ttl (or held ahead
--       of the call waiting in it)
--   0   left alone: another task id holds the record
--   2   left alone: another live run of this task id holds it (a redelivered copy)
local id, token = ARGV[1], ARGV[2]
if KEYS[1] ~= KEYS[2] then
  local run = load_record(KEYS[2])
  if run and run[1] == id and (token == '' or run_token(run) == token) then
    redis.call('DEL', KEYS[2])
  end
end
local rec = load_record(KEYS[1])
if rec and rec[1] ~= id then
  return 0
end
local running = rec and run_token(rec)
if running and token ~= '' and running ~= token and running ~= RESTORED then
  return 2
end
local waiting = rec and successor(rec)
if waiting then
  hold_ahead(KEYS[1], restored(id), waiting, 0, tonumber(ARGV[4]))
  return 1
end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
return 1
