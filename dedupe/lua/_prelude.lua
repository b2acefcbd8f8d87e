-- Prepended to every script when it is loaded (see dedupe/store.py).
-- A record is a msgpack array (see dedupe/record.py), its state told by its shape:
--   provisional  {owner, nonce}
--   queued       {owner, nonce, enqueued_at[, eta]}
--   running      {owner, run token, worker host, worker pid, started_at}
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
  if #rec == 5 then
    return rec[2]
  end
  return nil
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
