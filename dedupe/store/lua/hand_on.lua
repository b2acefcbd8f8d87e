-- hand_on: a worker's look at the lines of a key prefix whose first lease is over (a handed
-- message that never started, a run whose worker died whole): their free slots are handed on
-- (see end_turn.lua). One server only: the lines are named in the index, not in KEYS.
--
-- KEYS[1]  the index (line_keys in the prelude)
-- ARGV[1]  the most lines to look at
--
-- Returns {id1, options1, ...}: the calls handed a slot, each with the options the worker
-- publishes it with ('' when pushed here).
local now = server_ms()
local handed = {}
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0,
    tonumber(ARGV[1]))) do
  local limit, lease, key = string.match(member, '^(%d+)|(%d+)|(.*)$')
  if key then
    local k = line_keys_of(key, KEYS[1])
    lapse_slots(k, now)
    hand_on(k, tonumber(limit), tonumber(lease), now, handed)
    index_line(k, member)
  else
    redis.call('ZREM', KEYS[1], member)
  end
end
return with_handed(nil, handed)
