-- start_ticket_publish: a call of a task with both limits in one step, on a Redis broker that
-- is the dedup store's own server and db: its start reserved (start.lua's "call"), its place
-- in line taken (ticket.lua) for as long as it waits past its start, and its message pushed
-- with the eta of its start (as start_publish.lua pushes it).
--
-- KEYS[1..2]       starts, plan: as in start.lua
-- KEYS[3..5]       line, due, seq: as in ticket.lua
-- KEYS[6..n+5]     the broker lists the message goes to (named as kombu names them)
-- KEYS[n+6..]      lists whose expiry a push extends (queues declared with x-expires)
-- ARGV[1..9]       as start_publish.lua's
-- ARGV[10]         how long the place waits past the call's start, ms (unique_ttl)
-- ARGV[11]         the ms from now to the message's expiry, after which its place goes
--                  (1 s at least); '' for a message that never expires
--
-- Returns {ms from now to the call's start, the eta's JSON value pushed, the ticket}. This
-- command is never sent twice (a second send of one call would push its message twice).
local earliest = tonumber(ARGV[4])
local at, now = reserve_start(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]),
  earliest)
local wait, eta = eta_for(at, now, earliest, ARGV[6])
local place = tonumber(ARGV[10]) + math.max(wait, earliest)
if ARGV[11] ~= '' then
  place = math.max(math.min(place, tonumber(ARGV[11])), 1000)
end
local ticket = take_ticket(KEYS[3], KEYS[4], KEYS[5], ARGV[1], place)
push_message(6, tonumber(ARGV[8]), ARGV[5] .. eta .. ARGV[7], ARGV[9])
return {wait, eta, ticket}
