-- claim: a worker starts a run (its own queued record, or absent -> running, with a lease).
--
-- KEYS[1]  record key
-- KEYS[2]  run key: equal to KEYS[1] with unique_until="finished"; the separate run lock
--          with unique_until="started", whose queued record is released as the run starts
-- ARGV[1]  owner (packed task id)
-- ARGV[2]  run token (tells this run from a redelivered copy of the same task id)
-- ARGV[3]  lease, ms
-- ARGV[4]  worker host
-- ARGV[5]  worker pid
-- ARGV[6]  now, whole unix seconds
-- ARGV[7]  "1": keep this task id's queued record (unique_until="window": the record is the
--          throttle window, which outlives the run); else it is released as the run starts
-- ARGV[8]  time to live of the running record, ms: the redelivery horizon of a run whose
--          message the broker delivers again if the run dies (acks_late); the lease (or
--          less, or absent) for any other run
-- ARGV[9]  "1": the message carries the producer's key (the producer accepted it)
-- ARGV[10] (optional) the run token of a run of this task id that the worker found dead (its
--          process gone): this claim takes its key over, its lease over or not
--
-- Returns
--   1                    claimed (also when this very run claimed already: a re-sent command)
--   "<pttl>:<record>"    held: the run key holds another task id's run (or, outside
--                        unique_until="finished", queued record; or its provisional
--                        record), or another live run of this task id; its ttl in ms and
--                        its record
--
-- A queued record of another task id is never taken over: its message may have been handed
-- to callers as the holder of this call, so it must run. A message the producer never saw
-- (a bypass) is held by it: that call does the same work. A message the producer accepted
-- too (its own record lost in a Redis restart, or a canvas member, never refused) must run
-- as well: with unique_until="finished" it runs now, and that call waits in its record
-- (successor()), the key going back to it when this run ends. Held instead, it would wait
-- for a next try, and every call made when the key freed before that try would be accepted,
-- again and again. A provisional record (a call being published) holds it.
-- A run of another task id whose lease is over stands for its message, which the broker
-- will deliver again: it is held like a queued record. A run of this very task id whose
-- lease is over is taken over: this is its message, delivered again. So is the run of this
-- task id named in ARGV[10], whose process the worker found gone: Celery requeued its
-- message (reject_on_worker_lost), and nothing else frees its key before its lease is over.
-- A dead run with a call waiting in it (see successor()) is that call's queued record for
-- every other task id.
-- When that call takes the key over and the dead run's message comes back (acks_late: this
-- task's records outlive their lease; or a restored record: a message the broker holds),
-- the dead run's task id waits in line behind it.
local id, token = ARGV[1], ARGV[2]
local run, raw = load_record(KEYS[2])
local waiting = nil
local comes_back = nil
if run then
  local running = run_token(run)
  local dead = running and running ~= token
    and (lease_over(run, server_seconds()) or (run[1] == id and running == ARGV[10]))
  local took_dead = false
  if dead and run[1] ~= id and successor(run) then
    if (tonumber(ARGV[8]) or 0) > tonumber(ARGV[3]) or running == RESTORED then
      comes_back = cmsgpack.pack({run[1], 0, tonumber(ARGV[6])})  -- (a queued record)
    end
    raw = successor(run)
    run, running, took_dead = cmsgpack.unpack(raw), nil, true
  end
  local accepted = ARGV[9] == '1' and KEYS[1] == KEYS[2]
  if accepted and run[1] ~= id and not running and #run >= 3 and not took_dead then
    waiting = raw  -- another call's queued record: it waits in this run
  elseif run[1] ~= id or (running and running ~= token and not dead) then
    return held(KEYS[2], raw)
  elseif running then
    waiting = successor(run)  -- (this run's own record, or its dead copy's: the call waits on)
  else
    waiting = comes_back
  end
end
if KEYS[1] ~= KEYS[2] and ARGV[7] ~= '1' then
  local queued = load_record(KEYS[1])
  if queued and queued[1] == id then
    end_run(KEYS[1], queued)  -- (a restored record may hold a call accepted since: its key)
  elseif queued and run_token(queued) and waits_in(queued, id) then
    drop_successor(KEYS[1], queued)  -- (this call waited in a restored record: it runs now)
  end
end
local rec = {id, token, ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])}
if waiting then
  rec[6], rec[7] = 0, waiting  -- (rec[6]: store_running writes the lease)
end
store_running(KEYS[2], rec, tonumber(ARGV[3]), tonumber(ARGV[8]) or 0)
return 1
