-- turn: a run of a task with key_concurrency asks for its turn (handed -> running; no place
-- -> running, or held in line). A message handed a slot (hold_or_push.lua, end_turn.lua)
-- runs in it; a message that comes with none (a call by send_task, by name, from a canvas or
-- beat, one with an eta or countdown, published to another broker, a redelivery) runs if a
-- slot is free and nobody waits, else waits in line, held in Redis with what publishes it
-- again (its delivery then ends: no message of a waiting call stays in the broker).
--
-- KEYS[1..7]  slots, line, held, seq, started, index, due (line_keys in the prelude)
-- ARGV[1]     task id
-- ARGV[2]     run token
-- ARGV[3]     lease, ms
-- ARGV[4]     the limit: runs of this key at once
-- ARGV[5]     how long a waiting call's place lives, at most, ms (unique_ttl)
-- ARGV[6]     Celery's options that publish this message again (JSON), if it waits
-- ARGV[7]     the index member of this line ("<limit>|<lease ms>|<key>")
-- ARGV[8]     "B" where the worker keeps a backstop of a waiting call in the broker (a broker
--             apart from the dedup Redis: the call outlives a loss of the dedup data), else "C"
--
-- Returns {verdict, id1, options1, id2, options2, ...}: the verdict is 0 (runs: it holds a
-- slot), n>0 (waits: the nth to get a slot as slots free), -1 (a copy of a message that
-- runs, ran, or waits in line already: dropped) or -2 (the backstop of a call that still
-- waits: it goes back to the broker); then the calls a lapsed slot was handed to here, each
-- with the options the worker publishes it with ('' when pushed here).
--
-- A backstopped call ("B") that starts leaves "<id> copy" in started (for unique_ttl at most),
-- whichever of its two copies (the hand-off's publish, the backstop) starts first: the other
-- is dropped as it comes, and the mark with it.
local k = line_keys(1)
local now = server_ms()
local id, member = ARGV[1], ARGV[1] .. ' ' .. ARGV[2]
local lease, limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local handed = {}
local verdict
local was = redis.call('HGET', k.held, id)
local backstopped = was and string.sub(was, 1, 1) == 'B'
local copy_mark = id .. ' copy'
if redis.call('ZREM', k.slots, id .. ' ' .. HANDED) == 1
    or redis.call('ZSCORE', k.slots, member) then
  verdict = 0  -- (its handed slot, even if its lease is over; or this very run asked already)
else
  lapse_slots(k, now)
  hand_on(k, limit, lease, now, handed)
  -- A copy: what publishes it waits in line, one of its copies started after it was handed
  -- twice, or a run of it holds a slot.
  local copy = redis.call('HGET', k.held, id) ~= false or redis.call('ZSCORE', k.started, id)
    or redis.call('ZSCORE', k.started, copy_mark)
  if not copy then
    for _, held in ipairs(redis.call('ZRANGE', k.slots, 0, -1)) do
      if string.sub(held, 1, #id + 1) == id .. ' ' then
        copy = true
      end
    end
  end
  if backstopped then
    verdict = -2  -- (its backstop: the call waits still)
  elseif copy then
    verdict = -1
    if not redis.call('ZSCORE', k.started, id) then
      redis.call('ZREM', k.started, copy_mark)  -- (the last copy of a backstopped call)
    end
  else
    -- Its place (taken at the call), or one at the back; it runs if a slot is free for it
    -- with the calls before it that wait or are on their way served first.
    if not redis.call('ZSCORE', k.line, id) then
      redis.call('ZADD', k.line, redis.call('INCR', k.seq), id)
    end
    local ahead = redis.call('ZRANK', k.line, id) - handed_count(k)
    if not settling(k) and redis.call('ZCARD', k.slots) + math.max(ahead, 0) < limit then
      verdict = 0
    else
      verdict = hold(k, id, ARGV[8] .. ARGV[6], tonumber(ARGV[5]))
    end
  end
end
if verdict == 0 then
  redis.call('ZADD', k.slots, now + lease, member)
  keep_alive(k.slots, 2 * lease + 1000)
  redis.call('ZREM', k.line, id)
  redis.call('ZREM', k.due, id)
  redis.call('HDEL', k.held, id)
  if redis.call('ZSCORE', k.started, id) then
    -- Handed more than once: the copies still to come are dropped for a while.
    redis.call('ZADD', k.started, now + tonumber(ARGV[5]), id)
    keep_alive(k.started, tonumber(ARGV[5]))
  end
  if backstopped then
    redis.call('ZADD', k.started, now + tonumber(ARGV[5]), copy_mark)
    keep_alive(k.started, tonumber(ARGV[5]))
  end
  lapse_slots(k, now)
  hand_on(k, limit, lease, now, handed)
end
index_line(k, ARGV[7])
return with_handed(verdict, handed)
