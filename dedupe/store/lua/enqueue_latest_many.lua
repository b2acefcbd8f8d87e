-- enqueue_latest_many: enqueue_latest.lua for many calls of one batch, in one script (one
-- server only, as enqueue_many.lua). The calls are decided in order, as many single calls
-- would be: a key given twice is a duplicate of its first call, and leaves its arguments for
-- that call's run (the last call of a key leaves the arguments its run takes).
--
-- KEYS[2i - 1]  the call key of the batch's i-th call
-- KEYS[2i]      its latest-arguments hash
-- ARGV[6i - 5]  its provisional record, msgpack
-- ARGV[6i - 4]  its time to live, ms
-- ARGV[6i - 3]  its arguments, serialised (dedupe.values.latest.pack_arguments)
-- ARGV[6i - 2]  now, seconds (the producer's clock)
-- ARGV[6i - 1]  debounce, seconds; 0: a replace
-- ARGV[6i]      debounce max wait, seconds; 0: none
-- With one more KEY and ARGV, the last key is the store's marker key (see enqueue.lua), and
-- a batch is decided only while it exists.
--
-- Returns 0 when the marker is gone (nothing decided), else an array: for each call, what
-- enqueue_latest.lua answers for it (1, 2 or "<pttl>:<record>").
local calls = math.floor(#ARGV / 6)
if #ARGV % 6 == 1 and redis.call('EXISTS', KEYS[#KEYS]) == 0 then
  return 0
end
local replies = {}
for i = 1, calls do
  local a = 6 * (i - 1)
  replies[i] = enqueue_latest_call(
    KEYS[2 * i - 1], KEYS[2 * i], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4],
    ARGV[a + 5], ARGV[a + 6]
  )
end
return replies
