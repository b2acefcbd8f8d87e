-- start_publish: start.lua's "call" and the push of the call's message in one step, on a
-- Redis broker that is the dedup store's own server and db. The message's countdown is
-- decided here, so its eta is written here: the producer serialised the message with a
-- placeholder for it and sends the text around it.
--
-- KEYS[1..2]       starts, plan: as in start.lua
-- KEYS[3..n+2]     the broker lists the message goes to (named as kombu names them)
-- KEYS[n+3..]      lists whose expiry a push extends (queues declared with x-expires)
-- ARGV[1..3]       task id, N, the period (ms): as start.lua's
-- ARGV[4]          the earliest start, ms from now (the call's own countdown or eta; 0 none)
-- ARGV[5], ARGV[7] the message as kombu pushes it, before and after its eta's JSON value
-- ARGV[6]          the call's own eta's JSON value (null: none)
-- ARGV[8]          n, the number of lists to push to
-- ARGV[9]          the expiry to set on KEYS[n+3..], ms
--
-- Returns {ms from now to the call's start, the eta's JSON value pushed}. This command is
-- never sent twice (a second send of one call would push its message twice).
local at, now = reserve_start(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4]))
local wait, eta = eta_for(at, now, tonumber(ARGV[4]), ARGV[6])
push_message(3, tonumber(ARGV[8]), ARGV[5] .. eta .. ARGV[7], ARGV[9])
return {wait, eta}
