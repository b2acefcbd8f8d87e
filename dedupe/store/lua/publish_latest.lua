-- publish_latest: publish.lua for a debounced or replacing call, in one step on a Redis
-- broker that is the dedup store's own server and db: the record and the message are born
-- together, or (the key held) this duplicate leaves its arguments for the holder's run, as
-- enqueue_latest.lua leaves them, and nothing is pushed.
--
-- KEYS[1]          call key
-- KEYS[2]          the call's latest-arguments hash
-- KEYS[3..n+2]     the broker lists the message goes to (named as kombu names them)
-- KEYS[n+3..]      lists whose expiry a push extends (queues declared with x-expires)
-- ARGV[1..7]       as publish.lua's
-- ARGV[8]          this call's arguments, serialised (dedupe.values.latest.pack_arguments)
-- ARGV[9]          now, seconds (the producer's clock, as the record's enqueue time)
-- ARGV[10]         debounce, seconds; 0: a replace (no deadline)
-- ARGV[11]         debounce max wait, seconds; 0: none
--
-- Returns what publish.lua returns.
local raw = redis.call('GET', KEYS[1])
local mine = not raw or (ARGV[3] ~= '' and raw == ARGV[3])
if raw and raw == ARGV[1] then
  return 2
end
if not mine and ARGV[6] ~= 'force' then
  leave_latest(
    KEYS[1], KEYS[2], raw, ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
  )
  return held(KEYS[1], raw)
end
if mine then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
local lists = tonumber(ARGV[5])
for i = 3, lists + 2 do
  redis.call('LPUSH', KEYS[i], ARGV[4])
end
for i = lists + 3, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[7])
end
if mine then
  return 1
end
return 3
