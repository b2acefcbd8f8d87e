-- free_slots_of: the pool's parent saw the child that ran a task id die (a killed child,
-- whose message is not delivered again): that task id's slots are freed now, not when
-- their lease is over (running -> gone). Any run of the task id, as a dead child's token
-- is not known there; a live copy of it (none is expected) counts its slot again at its
-- next heartbeat (renew_slot.lua).
--
-- KEYS[1]  slots (slot.lua)
-- ARGV[1]  task id
--
-- Returns the number of slots freed.
local prefix = ARGV[1] .. ' '
local freed = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if string.sub(member, 1, #prefix) == prefix then
    freed = freed + redis.call('ZREM', KEYS[1], member)
  end
end
return freed
