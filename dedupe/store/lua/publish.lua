-- publish: a producer queues a call and pushes its message in one step, on a Redis broker
-- that is the dedup store's own server and db (absent, or this call's provisional record ->
-- queued; the message pushed). Record and message are born together: both or neither.
--
-- KEYS[1]          call key
-- KEYS[2..n+1]     the broker lists the message goes to (named as kombu names them)
-- KEYS[n+2..]      lists whose expiry a push extends (queues declared with x-expires)
-- ARGV[1]          the queued record (it names the owner and carries the call's nonce)
-- ARGV[2]          time to live of the record, ms (unique_ttl + countdown/eta)
-- ARGV[3]          this call's provisional record, or "" when none was written
-- ARGV[4]          the message, serialised as kombu pushes it
-- ARGV[5]          n, the number of lists to push to (0: write the record only)
-- ARGV[6]          "force" to push even when the key is held (a canvas member is never
--                  refused), else ""
-- ARGV[7]          the expiry to set on KEYS[n+2..], ms
--
-- Returns
--   1                    pushed: the record was created, or this call's provisional record
--                        made durable, and the message pushed to every list
--   2                    resent: the key holds these very bytes, so the first send of this
--                        command pushed the message (redis-py re-sent it after a timeout)
--   3                    pushed, held: a forced push that left the holder's record alone
--   "<pttl>:<record>"    duplicate: the key is held; nothing was pushed
local raw = redis.call('GET', KEYS[1])
local mine = not raw or (ARGV[3] ~= '' and raw == ARGV[3])
if raw and raw == ARGV[1] then
  return 2
end
if not mine and ARGV[6] ~= 'force' then
  return held(KEYS[1], raw)
end
if mine then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
local lists = tonumber(ARGV[5])
for i = 2, lists + 1 do
  redis.call('LPUSH', KEYS[i], ARGV[4])
end
for i = lists + 2, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[7])
end
if mine then
  return 1
end
return 3
