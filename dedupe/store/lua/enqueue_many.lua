-- enqueue_many: enqueue.lua for many calls of one batch, in one script (one server only: on
-- a Redis Cluster the calls' keys are in different slots, and each goes alone).
--
-- KEYS[i]       the call key of the batch's i-th call
-- ARGV[2i - 1]  its provisional record, msgpack
-- ARGV[2i]      its time to live, ms
-- With one more ARGV than two per key, the last key is the store's marker key (see
-- enqueue.lua), and a batch is decided only while it exists.
--
-- Returns 0 when the marker is gone (nothing decided), else an array: for each call, what enqueue.lua answers for it (1, 2 or
-- "<pttl>:<record>"). The calls are decided in order, so a key given twice is a duplicate
-- of its first call.
local calls = #KEYS
if #ARGV % 2 == 1 then
  calls = calls - 1
  if redis.call('EXISTS', KEYS[#KEYS]) == 0 then
    return 0
  end
end
local replies = {}
for i = 1, calls do
  replies[i] = enqueue_call(KEYS[i], ARGV[2 * i - 1], ARGV[2 * i])
end
return replies
