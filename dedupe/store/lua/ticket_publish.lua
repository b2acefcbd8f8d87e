-- ticket_publish: ticket.lua and the push of the call's message in one step, on a Redis
-- broker that is the dedup store's own server and db (no place -> a place at the back, the
-- message pushed). The place and its message are born together: both or neither.
--
-- KEYS[1..3]       line, due, seq: as in ticket.lua
-- KEYS[4..n+3]     the broker lists the message goes to (named as kombu names them)
-- KEYS[n+4..]      lists whose expiry a push extends (queues declared with x-expires)
-- ARGV[1..2]       as ticket.lua's
-- ARGV[3]          the message, serialised as kombu pushes it
-- ARGV[4]          n, the number of lists to push to
-- ARGV[5]          the expiry to set on KEYS[n+4..], ms
--
-- Returns the ticket. The same task id again keeps its first ticket and its message is
-- pushed again, as ticket.lua then a publish would do; this command itself is never sent
-- twice (a second send of one call would push its message twice).
local ticket = take_ticket(KEYS[1], KEYS[2], KEYS[3], ARGV[1], tonumber(ARGV[2]))
push_message(4, tonumber(ARGV[4]), ARGV[3], ARGV[5])
return ticket
