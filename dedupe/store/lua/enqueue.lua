-- enqueue: a producer asks to queue a call before publishing it (absent -> provisional).
--
-- KEYS[1]  call key
-- KEYS[2]  (optional) the store's marker key (dedupe.values.keys.alive_key): present once the
--          records of the messages in flight were restored since the store last lost its
--          data; missing, an absent key may be a lost record, and nothing is decided
-- ARGV[1]  the provisional record, msgpack (it names the owner and carries the call's nonce)
-- ARGV[2]  time to live, ms: the provisional ttl, long enough for a slow publish; the
--          publish, or confirm.lua after it, makes the record durable
--
-- Returns
--   0                    not decided: the marker is gone (restore, then ask again)
--   1                    accepted: the record was created
--   2                    accepted: the record holds these very bytes (redis-py re-sent the
--                        command after a timeout; the call's nonce makes them unique)
--   "<pttl>:<record>"    duplicate: the key is held, also by an earlier call that passed the
--                        same explicit task id (deterministic ids are a dedup idiom)
--
-- This is every producer's round trip, so it stays lean: the record is compared as bytes,
-- never decoded, and a duplicate's answer is one bulk string (a client parses that for a
-- fraction of what a nested reply costs).
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 0 then
  return 0
end
return enqueue_call(KEYS[1], ARGV[1], ARGV[2])
