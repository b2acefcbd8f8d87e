-- end_turn: a run of a task with key_concurrency ended (running -> gone), or the pool's
-- parent saw the child that ran it die: its slot is freed and handed on, in the same step, to
-- the calls at the head of the line (their messages pushed here, "P", or published by the
-- worker that asked, "C": see line_keys in the prelude).
--
-- KEYS[1..7]  slots, line, held, seq, started, index, due (line_keys in the prelude)
-- ARGV[1]     "<task id> <run token>", or "<task id>" for any run of it (a dead child's,
--             whose token the parent does not know: its redelivery may run again)
-- ARGV[2]     lease, ms (of the slots handed on)
-- ARGV[3]     the limit: runs of this key at once
-- ARGV[4]     the index member of this line ("<limit>|<lease ms>|<key>")
--
-- Returns {freed, id1, options1, ...}: the slots freed (0: freed already, or its lease was
-- over), then the calls handed a slot, each with the options the worker publishes it with
-- ('' when pushed here).
local k = line_keys(1)
local now = server_ms()
local freed = 0
if string.find(ARGV[1], ' ', 1, true) then
  freed = redis.call('ZREM', k.slots, ARGV[1])
else
  local prefix = ARGV[1] .. ' '
  for _, member in ipairs(redis.call('ZRANGE', k.slots, 0, -1)) do
    if string.sub(member, 1, #prefix) == prefix and member ~= prefix .. HANDED then
      freed = freed + redis.call('ZREM', k.slots, member)
    end
  end
  redis.call('ZREM', k.started, ARGV[1])
end
local handed = {}
lapse_slots(k, now)
hand_on(k, tonumber(ARGV[3]), tonumber(ARGV[2]), now, handed)
index_line(k, ARGV[4])
return with_handed(freed, handed)
