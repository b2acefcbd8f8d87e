-- slot: a run of a task with key_concurrency asks for a slot (waiting -> running). It gets
-- one when fewer than the limit run and no call before it waits: the line is call order.
--
-- KEYS[1]  slots: sorted set, member "<task id> <run token>", score (server ms) when its
--          lease ends; a slot whose lease is over (its worker died) is free
-- KEYS[2]  line, KEYS[3] due, KEYS[4] seq: as in ticket.lua
-- ARGV[1]  task id
-- ARGV[2]  run token
-- ARGV[3]  lease, ms
-- ARGV[4]  the limit: runs of this key at once
-- ARGV[5]  a turn, ms: a waiting run is asked back a turn for every limit runs ahead of it
--          (come_back in the prelude), and its place lapses a lease after that if it never
--          comes (its worker died with the message)
-- ARGV[6]  how long a place taken here lives, at most, ms (unique_ttl)
-- ARGV[7]  the longest a waiting run is asked to stay away, ms (dedupe_deferral_cap)
--
-- Returns
--   0    claimed: the run holds a slot (also when this very run claimed already)
--   n>0  wait: this run is the nth to get a slot as slots free; come back later
local now = server_ms()
local id, member = ARGV[1], ARGV[1] .. ' ' .. ARGV[2]
local lease, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local held, ahead = slot_turn(KEYS[1], KEYS[2], KEYS[3], KEYS[4], id, member, limit, now)
if held then
  return 0
end
if ahead <= 0 then
  claim_slot(KEYS[1], KEYS[2], KEYS[3], KEYS[4], id, member, lease, now)
  return 0
end
local back = come_back(ahead, limit, tonumber(ARGV[5]), tonumber(ARGV[7]))
keep_place(KEYS[2], KEYS[3], KEYS[4], id, now, back, lease, tonumber(ARGV[6]))
return ahead
