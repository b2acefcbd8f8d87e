-- Prepended to every script when it is loaded (see dedupe/store.py).
-- A record is a msgpack array (see dedupe/record.py), its state told by its shape:
--   provisional  {owner, nonce}
--   queued       {owner, nonce, enqueued_at[, eta]}
--   running      {owner, run token, worker host, worker pid, started_at[, lease_ends[, next]]}
-- lease_ends (server time, whole seconds) is in the record of a run whose message the broker
-- would deliver again if the run died (acks_late): that record outlives the lease, up to the
-- redelivery, and a run whose lease is over is dead. Without it (and in records of older
-- versions) the record lives for the lease only, so a record that exists is a live run.
-- next (see successor() below) is the queued record of a call that waits for this run.
-- The owner is the task id as dedupe.record.pack_owner packs it; scripts get it packed too.

-- Returns the decoded record stored at key and its raw bytes, or nil when the key is absent.
local function load_record(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil, nil
  end
  return cmsgpack.unpack(raw), raw
end

-- The run token of a running record; nil for a queued one.
local function run_token(rec)
  if #rec >= 5 then
    return rec[2]
  end
  return nil
end

-- The server's clock, whole seconds: leases are judged by Redis's time, never by the hosts'.
local function server_seconds()
  if redis.replicate_commands then
    redis.replicate_commands()  -- (Redis < 5: TIME before a write needs effects replication)
  end
  return tonumber(redis.call('TIME')[1])
end

-- True when rec is a run whose lease is over: its worker died (or stalled past the lease)
-- and its message waits for the broker to deliver it again.
local function lease_over(rec, now)
  return #rec >= 6 and now >= rec[6]
end

-- The queued record (bytes) of the call that waits in a run's record, or nil: a call
-- accepted while the run's key was lost (Redis restarted, failed over, evicted it), which
-- the run's heartbeat took back. The key goes to that call when the run ends.
local function successor(rec)
  if #rec >= 7 then
    return rec[7]
  end
  return nil
end

-- Store the running record rec at key: the lease carried inside when the record outlives
-- it (a redelivery horizon, or a call waiting in it), else the record lives for the lease.
local function store_running(key, rec, lease_ms, record_ttl_ms)
  local waiting = successor(rec) ~= nil
  local ttl = math.max(record_ttl_ms, lease_ms)
  if record_ttl_ms > lease_ms or waiting then
    rec[6] = server_seconds() + math.ceil(lease_ms / 1000)
  else
    rec[6] = nil
  end
  if waiting then
    -- The waiting call's record lives as long as it would have on its own.
    ttl = math.max(ttl, redis.call('PTTL', key))
  end
  redis.call('SET', key, cmsgpack.pack(rec), 'PX', ttl)
end

-- The run in rec (stored at key) is over: the key goes to the call waiting in it, if any
-- (its queued record back, for the rest of the key's ttl), else it is deleted. Returns 1.
local function end_run(key, rec)
  local waiting = successor(rec)
  if waiting then
    redis.call('SET', key, waiting, 'PX', math.max(redis.call('PTTL', key), 1))
    return 1
  end
  return redis.call('DEL', key)
end

-- True when the call of owner waits in the run record rec.
local function waits_in(rec, owner)
  local waiting = successor(rec)
  return waiting ~= nil and cmsgpack.unpack(waiting)[1] == owner
end

-- The call waiting in the run record rec (stored at key) is withdrawn: the run keeps the key.
local function drop_successor(key, rec)
  rec[7] = nil
  redis.call('SET', key, cmsgpack.pack(rec), 'KEEPTTL')
  return 1
end

-- The answer of a script refused because key is held: "<pttl>:<record>", one bulk string
-- (dedupe.store.held_by reads it). A pttl never holds a colon; the record may.
local function held(key, raw)
  return string.format('%d:', redis.call('PTTL', key)) .. raw
end

-- enqueue.lua's transition for one call (enqueue_many.lua makes it for many): create the
-- provisional record if the key is absent; 1 created, 2 these very bytes (a resend), else
-- the holder's answer (see held).
local function enqueue_call(key, record, ttl)
  local raw = redis.call('GET', key)
  if not raw then
    redis.call('SET', key, record, 'PX', ttl)
    return 1
  end
  if raw == record then
    return 2
  end
  return held(key, raw)
end
