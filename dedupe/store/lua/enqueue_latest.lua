-- enqueue_latest: a producer asks to queue a debounced or replacing call (absent ->
-- provisional, as enqueue.lua); a duplicate of a holder that has not started yet leaves its
-- arguments (and, debounced, the new deadline) for that holder's run to take.
--
-- KEYS[1]  call key
-- KEYS[2]  the call's latest-arguments hash (field: packed owner; value:
--          msgpack {first call at, deadline, arguments})
-- KEYS[3]  (optional) the store's marker key, as in enqueue.lua
-- ARGV[1]  the provisional record, msgpack (it names the owner and carries the call's nonce)
-- ARGV[2]  time to live of the provisional record, ms
-- ARGV[3]  this call's arguments, serialised (dedupe.values.latest.pack_arguments)
-- ARGV[4]  now, seconds (the producer's clock, as the record's enqueue time)
-- ARGV[5]  debounce, seconds; 0: a replace (no deadline)
-- ARGV[6]  debounce max wait, seconds; 0: none
--
-- Returns what enqueue.lua returns: 0 not decided, 1 accepted, 2 a resend of the accepted
-- command, or "<pttl>:<record>" a duplicate. A duplicate of a queued (or provisional) holder
-- replaced its arguments; of a running one (unique_until="finished") it left nothing.
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
local raw = redis.call('GET', KEYS[1])
if not raw then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if raw == ARGV[1] then
  return 2
end
local rec = cmsgpack.unpack(raw)
if not run_token(rec) then
  local owner, now = rec[1], tonumber(ARGV[4])
  local first, deadline = rec[3] or now, 0
  local entry = redis.call('HGET', KEYS[2], owner)
  if entry then
    first = cmsgpack.unpack(entry)[1]  -- (the burst began before its message was re-sent)
  end
  local debounce = tonumber(ARGV[5])
  if debounce > 0 then
    deadline = now + debounce
    local max_wait = tonumber(ARGV[6])
    if max_wait > 0 then
      deadline = math.min(deadline, first + max_wait)
    end
  end
  redis.call('HSET', KEYS[2], owner, cmsgpack.pack({first, deadline, ARGV[3]}))
  -- The arguments live as long as the record might, and past a deadline that moved on.
  local keep = math.max(redis.call('PTTL', KEYS[1]), 1)
    + math.ceil(math.max(deadline - now, 0) * 1000)
  if redis.call('PTTL', KEYS[2]) < keep then
    redis.call('PEXPIRE', KEYS[2], keep)
  end
end
return held(KEYS[1], raw)
