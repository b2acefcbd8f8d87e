-- enqueue_many: enqueue.lua for many calls of one batch, in one script (one server only: on
-- a Redis Cluster the calls' keys are in different slots, and each goes alone).
--
-- KEYS[i]       the call key of the batch's i-th call
-- ARGV[2i - 1]  its provisional record, msgpack
-- ARGV[2i]      its time to live, ms
--
-- Returns an array: for each call, what enqueue.lua answers for it (1, 2 or
-- "<pttl>:<record>"). The calls are decided in order, so a key given twice is a duplicate
-- of its first call.
local replies = {}
for i = 1, #KEYS do
  replies[i] = enqueue_call(KEYS[i], ARGV[2 * i - 1], ARGV[2 * i])
end
return replies
