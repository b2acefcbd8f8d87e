-- leave_turn: a call of a task with key_concurrency leaves its key's line (waiting or handed
-- -> gone): its message was revoked or expired before its run (the worker dropped it). Its
-- handed slot, if it had one, is handed on in the same step.
--
-- KEYS[1..7]  slots, line, held, seq, started, index, due (line_keys in the prelude)
-- ARGV[1]     task id
-- ARGV[2..4]  as end_turn.lua's
--
-- Returns {left, id1, options1, ...}: 1 if it had a place or a handed slot, then as
-- end_turn.lua's.
local k = line_keys(1)
local now = server_ms()
local id = ARGV[1]
local left = redis.call('ZREM', k.line, id)
redis.call('ZREM', k.due, id)
redis.call('HDEL', k.held, id)
redis.call('ZREM', k.started, id)
left = math.max(left, redis.call('ZREM', k.slots, id .. ' ' .. HANDED))
local handed = {}
lapse_slots(k, now)
hand_on(k, tonumber(ARGV[3]), tonumber(ARGV[2]), now, handed)
index_line(k, ARGV[4])
return with_handed(left, handed)
