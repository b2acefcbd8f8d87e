-- hold_or_push: a call of a task with key_concurrency, on a Redis broker that is the dedup
-- store's own server and db, in one step (no place -> handed a slot and pushed, or held in
-- line): a slot is free and nobody waits, so the call is handed one and its message pushed;
-- else the call waits in its key's line, held in Redis with its message, which a freed slot
-- pushes (end_turn.lua, hand_on.lua). No message of a waiting call is in the broker.
--
-- KEYS[1..7]       slots, line, held, seq, started, index, due (line_keys in the prelude)
-- KEYS[8..n+7]     the broker lists the message goes to (named as kombu names them)
-- KEYS[n+8..]      lists whose expiry a push extends (queues declared with x-expires)
-- ARGV[1]          task id
-- ARGV[2]          lease, ms: how long a handed message has to start
-- ARGV[3]          the limit: runs of this key at once
-- ARGV[4]          how long a waiting call's place lives, at most, ms (unique_ttl)
-- ARGV[5]          the message, serialised as kombu pushes it
-- ARGV[6]          n, the number of lists to push to
-- ARGV[7]          the expiry to set on KEYS[n+8..], ms
-- ARGV[8]          the index member of this line ("<limit>|<lease ms>|<key>")
--
-- Returns 0 (handed a slot, pushed) or n>0 (waits: the nth to get a slot as slots free). This
-- command is never sent twice (a second send of one call would push its message twice).
local k = line_keys(1)
local now = server_ms()
local id, lease, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local lists = tonumber(ARGV[6])
lapse_slots(k, now)
if free_now(k, limit) then
  redis.call('ZADD', k.slots, now + lease, id .. ' ' .. HANDED)
  keep_alive(k.slots, 2 * lease + 1000)
  redis.call('ZADD', k.line, 0, id)  -- (its place, and what pushes it, until it starts)
  redis.call('HSET', k.held, id,
    'P' .. cjson.encode({ARGV[5], {unpack(KEYS, 8, 7 + lists)}, {unpack(KEYS, 8 + lists)},
      tonumber(ARGV[7])}))
  for _, key in ipairs({k.line, k.held}) do
    keep_alive(key, tonumber(ARGV[4]))
  end
  push_message(8, lists, ARGV[5], ARGV[7])
  index_line(k, ARGV[8])
  return 0
end
local payload = 'P' .. cjson.encode({ARGV[5], {unpack(KEYS, 8, 7 + lists)},
  {unpack(KEYS, 8 + lists)}, tonumber(ARGV[7])})
local ahead = hold(k, id, payload, tonumber(ARGV[4]))
index_line(k, ARGV[8])
return ahead
