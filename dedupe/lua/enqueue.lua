-- enqueue: a producer asks to queue a call before publishing it (absent -> provisional).
--
-- KEYS[1]  call key
-- ARGV[1]  the provisional record, msgpack (it names the owner and carries the call's nonce)
-- ARGV[2]  time to live, ms: the provisional ttl, long enough for a slow publish; the
--          publish, or confirm.lua after it, makes the record durable
--
-- Returns
--   1                    accepted: the record was created
--   2                    accepted: the record holds these very bytes (redis-py re-sent the
--                        command after a timeout; the call's nonce makes them unique)
--   "<pttl>:<record>"    duplicate: the key is held, also by an earlier call that passed the
--                        same explicit task id (deterministic ids are a dedup idiom)
--
-- This is every producer's round trip, so it stays lean: the record is compared as bytes,
-- never decoded, and a duplicate's answer is one bulk string (a client parses that for a
-- fraction of what a nested reply costs).
local raw = redis.call('GET', KEYS[1])
if not raw then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if raw == ARGV[1] then
  return 2
end
return held(KEYS[1], raw)
