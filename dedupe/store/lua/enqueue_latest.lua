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
return enqueue_latest_call(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
