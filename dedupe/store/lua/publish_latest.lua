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
return publish_call(3, function(raw)
  leave_latest(
    KEYS[1], KEYS[2], raw, ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
  )
end)
