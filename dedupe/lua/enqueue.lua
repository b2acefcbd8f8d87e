-- enqueue: a producer asks to queue a call (absent -> queued).
--
-- KEYS[1]  record key
-- ARGV[1]  task id of the call (the owner token)
-- ARGV[2]  the queued record, msgpack
-- ARGV[3]  time to live, ms (unique_ttl + countdown/eta)
--
-- Returns
--   {1}                  accepted: the record was created
--   {2}                  accepted: the record holds these very bytes (redis-py re-sent the
--                        command after a timeout; the enqueue time in them makes them unique)
--   {0, record, pttl}    duplicate: the key is held, also by an earlier call that passed the
--                        same explicit task id (deterministic ids are a dedup idiom)
local rec, raw = load_record(KEYS[1])
if not rec then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return {1}
end
if raw == ARGV[2] then
  return {2}
end
return {0, raw, redis.call('PTTL', KEYS[1])}
