-- Prepended to every script when it is loaded (see dedupe/store.py).
-- A record is a msgpack map (fields documented in dedupe/record.py).

-- Returns the decoded record stored at key and its raw bytes, or nil when the key is absent.
local function load_record(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil, nil
  end
  return cmsgpack.unpack(raw), raw
end

-- The answer of a script refused because key is held: "<pttl>:<record>", one bulk string
-- (dedupe.store.held_by reads it). A pttl never holds a colon; the record may.
local function held(key, raw)
  return string.format('%d:', redis.call('PTTL', key)) .. raw
end
