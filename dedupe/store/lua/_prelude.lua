-- Its definitions are prepended to each script that uses them, and only those, when it is
-- loaded (see dedupe.store.store.script_text): a script runs them all on every call.
-- A record is a msgpack array (see dedupe/values/record.py), its state told by its shape:
--   provisional  {owner, nonce}
--   queued       {owner, nonce, enqueued_at[, eta]}
--   running      {owner, run token, worker host, worker pid, started_at[, lease_ends[, next]]}
-- lease_ends (server time, whole seconds) is in the record of a run whose message the broker
-- would deliver again if the run died (acks_late): that record outlives the lease, up to the
-- redelivery, and a run whose lease is over is dead. Without it (and in records of older
-- versions) the record lives for the lease only, so a record that exists is a live run.
-- next (see successor() below) is the queued record of a call that waits for this run.
-- A running record of token RESTORED (below) stands for a message the broker holds unacked.
-- The owner is the task id as dedupe.values.record.pack_owner packs it; scripts get it packed too.

-- Returns the decoded record stored at key and its raw bytes, or nil when the key is absent.
local function load_record(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil, nil
  end
  return cmsgpack.unpack(raw), raw
end

-- The run token of a running record; nil for a queued one.
local function run_token(rec)
  if #rec >= 5 then
    return rec[2]
  end
  return nil
end

-- The run token of a restored record (restore.lua): the record of a message the broker
-- holds for a worker (reserved or running) written back after Redis lost the key. It stands
-- for every run of its task id: the live run, if there is one, takes it back as its own
-- (renew, release, requeue), and a redelivered copy takes it over (its lease is over).
local RESTORED = 'restored'

-- The server's clock, whole seconds: leases are judged by Redis's time, never by the hosts'.
local function server_seconds()
  if redis.replicate_commands then
    redis.replicate_commands()  -- (Redis < 5: TIME before a write needs effects replication)
  end
  return tonumber(redis.call('TIME')[1])
end

-- The server's clock in whole milliseconds (the limits per key: slots, places, starts).
local function server_ms()
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- True when rec is a run whose lease is over: its worker died (or stalled past the lease)
-- and its message waits for the broker to deliver it again.
local function lease_over(rec, now)
  return #rec >= 6 and now >= rec[6]
end

-- The queued record (bytes) of the call that waits in a run's record, or nil: a call
-- accepted while the run's key was lost (Redis restarted, failed over, evicted it), which
-- the run's heartbeat took back. The key goes to that call when the run ends.
local function successor(rec)
  if #rec >= 7 then
    return rec[7]
  end
  return nil
end

-- Store the running record rec at key: the lease carried inside when the record outlives
-- it (a redelivery horizon, or a call waiting in it), else the record lives for the lease.
local function store_running(key, rec, lease_ms, record_ttl_ms)
  local waiting = successor(rec) ~= nil
  local ttl = math.max(record_ttl_ms, lease_ms)
  if record_ttl_ms > lease_ms or waiting then
    rec[6] = server_seconds() + math.ceil(lease_ms / 1000)
  else
    rec[6] = nil
  end
  if waiting then
    -- The waiting call's record lives as long as it would have on its own.
    ttl = math.max(ttl, redis.call('PTTL', key))
  end
  redis.call('SET', key, cmsgpack.pack(rec), 'PX', ttl)
end

-- The run in rec (stored at key) is over: the key goes to the call waiting in it, if any
-- (its queued record back, for the rest of the key's ttl), else it is deleted. Returns 1.
local function end_run(key, rec)
  local waiting = successor(rec)
  if waiting then
    redis.call('SET', key, waiting, 'PX', math.max(redis.call('PTTL', key), 1))
    return 1
  end
  return redis.call('DEL', key)
end

-- True when the call of owner waits in the run record rec.
local function waits_in(rec, owner)
  local waiting = successor(rec)
  return waiting ~= nil and cmsgpack.unpack(waiting)[1] == owner
end

-- The call waiting in the run record rec (stored at key) is withdrawn: the run keeps the key
-- (and the call that waited behind the withdrawn one, if any, waits in the run instead).
local function drop_successor(key, rec)
  rec[7] = successor(cmsgpack.unpack(rec[7]))
  redis.call('SET', key, cmsgpack.pack(rec), 'KEEPTTL')
  return 1
end

-- A restored record (see RESTORED) of the message of owner, made now:
-- dedupe.values.record.pack_restored builds the same array. Its lease and the call waiting
-- in it come after.
local function restored(owner)
  return {owner, RESTORED, RESTORED, 0, server_seconds()}
end

-- The call of the queued record (bytes) waits in rec, another task id's run stored at key:
-- it gets the key when the run ends. The record outlives its lease for it (ttl_ms at least).
-- Returns 2 (waits, now or already), or 0 when another call waits in that run already and
-- was queued before since (when this message was first deferred; nil: any call).
local function wait_in_run(key, rec, owner, queued, ttl_ms, since)
  local waiting = successor(rec)
  if waiting then
    if waits_in(rec, owner) then
      return 2
    end
    local behind = cmsgpack.unpack(waiting)
    if not since or #behind < 3 or #behind > 4 or behind[3] <= since then
      return 0
    end
    -- The call waiting in the run came while this message waited: this one goes first, as a
    -- restored record (see hold_ahead) with that call inside, and gets the key at the run's end.
    local mine = restored(owner)
    mine[6], mine[7] = 0, waiting
    rec[7] = cmsgpack.pack(mine)
    local pttl = math.max(redis.call('PTTL', key), 1)
    redis.call('SET', key, cmsgpack.pack(rec), 'PX', math.max(pttl, ttl_ms))
    return 2
  end
  local pttl = math.max(redis.call('PTTL', key), 1)
  if #rec < 6 then
    -- The record lived for its lease: that lease, carried inside now that it lives longer.
    rec[6] = server_seconds() + math.ceil(pttl / 1000)
  end
  rec[7] = queued
  redis.call('SET', key, cmsgpack.pack(rec), 'PX', math.max(pttl, ttl_ms))
  return 2
end

-- The message of rec (a RESTORED record, its lease ending lease_ms from now) holds key, and
-- the call accepted since (its queued record raw, or none) waits in it: that call's message
-- runs first if it comes first (claim.lua: the message of a restored record comes back).
local function hold_ahead(key, rec, raw, lease_ms, ttl_ms)
  rec[6] = server_seconds() + math.ceil(lease_ms / 1000)
  if raw then
    rec[7] = raw
    ttl_ms = math.max(ttl_ms, redis.call('PTTL', key))
  end
  redis.call('SET', key, cmsgpack.pack(rec), 'PX', ttl_ms)
end

-- The answer of a script refused because key is held: "<pttl>:<record>", one bulk string
-- (dedupe.store.replies reads it). A pttl never holds a colon; the record may.
local function held(key, raw)
  return string.format('%d:', redis.call('PTTL', key)) .. raw
end

-- A duplicate of a debounced or replacing call (enqueue_latest.lua, publish_latest.lua): a
-- holder that has not started (raw, its record) takes this call's arguments for its run, and
-- (debounced) the burst's new deadline: `debounce` after now, at most `max_wait` after the
-- burst's first call (0: no such bound). A running holder takes nothing.
local function leave_latest(key, latest_key, raw, arguments, now, debounce, max_wait)
  local rec = cmsgpack.unpack(raw)
  if run_token(rec) then
    return
  end
  local owner = rec[1]
  local first, deadline = rec[3] or now, 0
  local entry = redis.call('HGET', latest_key, owner)
  if entry then
    first = cmsgpack.unpack(entry)[1]  -- (the burst began before its message was re-sent)
  end
  if debounce > 0 then
    deadline = now + debounce
    if max_wait > 0 then
      deadline = math.min(deadline, first + max_wait)
    end
  end
  redis.call('HSET', latest_key, owner, cmsgpack.pack({first, deadline, arguments}))
  -- The arguments live as long as the record might, and past a deadline that moved on.
  local keep = math.max(redis.call('PTTL', key), 1) + math.ceil(math.max(deadline - now, 0) * 1000)
  if redis.call('PTTL', latest_key) < keep then
    redis.call('PEXPIRE', latest_key, keep)
  end
end

-- Push message to the broker lists KEYS[first .. first + lists - 1], as kombu's Redis
-- transport pushes it, and extend the expiry of the lists after them (KEYS[first + lists ..],
-- queues declared with x-expires) to expire_ms.
local function push_message(first, lists, message, expire_ms)
  for i = first, first + lists - 1 do
    redis.call('LPUSH', KEYS[i], message)
  end
  for i = first + lists, #KEYS do
    redis.call('PEXPIRE', KEYS[i], expire_ms)
  end
end

-- ticket.lua's transition (ticket_publish.lua's too): the task id takes its place at the
-- back of its key's line, or keeps the one it has (a re-sent command, the same task id
-- again); the line's keys live ttl_ms at least. Returns the ticket.
local function take_ticket(line, due, seq, id, ttl_ms)
  local now = server_ms()
  local ticket = redis.call('ZSCORE', line, id)
  if not ticket then
    ticket = redis.call('INCR', seq)
    redis.call('ZADD', line, ticket, id)
    redis.call('ZADD', due, now + ttl_ms, id)
  end
  for _, key in ipairs({line, due, seq}) do
    if redis.call('PTTL', key) < ttl_ms then
      redis.call('PEXPIRE', key, ttl_ms)
    end
  end
  return tonumber(ticket)
end

-- Extend key's expiry to ms at least.
local function keep_alive(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, math.ceil(ms))
  end
end

-- slot.lua's look at a key's slots and line (slot_start.lua's too): dead runs' slots are
-- freed, places whose message never came lapse (a few at a time), a run without a place
-- takes one at the back. Returns true when member holds a slot already; else false and how
-- many calls (this one included) are ahead of a free slot: 0 or less, its turn has come.
local function slot_turn(slots, line, due, seq, id, member, limit, now)
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)  -- (dead runs' slots are free)
  if redis.call('ZSCORE', slots, member) then
    return true, 0
  end
  local lapsed = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, 100)
  for _, gone in ipairs(lapsed) do
    if gone ~= id then
      redis.call('ZREM', line, gone)
      redis.call('ZREM', due, gone)
    end
  end
  if not redis.call('ZSCORE', line, id) then
    -- No place: a message the producer did not see, a retry, a redelivery after its place
    -- lapsed. It goes to the back of the line.
    redis.call('ZADD', line, redis.call('INCR', seq), id)
  end
  local rank = redis.call('ZRANK', line, id)
  local free = limit - redis.call('ZCARD', slots)
  return false, rank - math.max(free, 0) + 1
end

-- The run (member, of task id) whose turn came leaves the line for a slot, leased lease ms.
local function claim_slot(slots, line, due, seq, id, member, lease, now)
  redis.call('ZREM', line, id)
  redis.call('ZREM', due, id)
  if redis.call('EXISTS', line) == 0 then
    redis.call('DEL', seq)  -- (nobody waits: the count starts again, nothing left behind)
  end
  redis.call('ZADD', slots, now + lease, member)
  keep_alive(slots, lease)
end

-- When the nth waiting run is asked back, ms from now: a turn for every limit runs ahead of
-- it (the line moves limit places a run), cap at most. dedupe/worker/limited_runs.py sends the run
-- again with this countdown; its place must outlive it (keep_place).
local function come_back(ahead, limit, turn, cap)
  return math.min(turn * math.ceil(ahead / math.max(limit, 1)), cap)
end

-- A run that waits keeps its place: it lapses a lease after the run is due back (come_back
-- ms from now), if it never comes (its worker died with the message); the line lives ttl ms.
local function keep_place(line, due, seq, id, now, come_back, lease, ttl)
  redis.call('ZADD', due, now + come_back + lease, id)
  local keep = math.max(ttl, come_back + lease)
  for _, key in ipairs({line, due, seq}) do
    keep_alive(key, keep)
  end
end

-- start.lua's clock of a key's starts (slot_start.lua's too): a start made at s counts until
-- s + period, that ms included (the clock is read in whole ms, so a start let in at exactly
-- s + period could be less than a period after s); a reserved start is forgotten a period on.
local function forget_starts(starts, plan, now, period)
  redis.call('ZREMRANGEBYSCORE', starts, '-inf', '(' .. (now - period))
  redis.call('ZREMRANGEBYSCORE', plan, '-inf', now - period)
end

-- The starts made in the last period, as ZRANGE WITHSCORES gives them (the last n at most):
-- a run may start now when fewer than n are there; else not before the first is a period
-- old (+1 ms, see forget_starts).
local function last_starts(starts, n)
  return redis.call('ZRANGE', starts, -n, -1, 'WITHSCORES')
end

-- publish.lua's transition (publish_latest.lua's too), on the script's KEYS and ARGV: the
-- broker lists are KEYS[first .. first + n - 1], the lists to keep alive after them; a
-- duplicate calls on_held(raw) before it answers with its holder.
local function publish_call(first, on_held)
  local raw = redis.call('GET', KEYS[1])
  local mine = not raw or (ARGV[3] ~= '' and raw == ARGV[3])
  if raw and raw == ARGV[1] then
    return 2
  end
  if not mine and ARGV[6] ~= 'force' then
    if on_held then
      on_held(raw)
    end
    return held(KEYS[1], raw)
  end
  if mine then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  end
  push_message(first, tonumber(ARGV[5]), ARGV[4], ARGV[7])
  if mine then
    return 1
  end
  return 3
end

-- enqueue.lua's transition for one call (enqueue_many.lua makes it for many): create the
-- provisional record if the key is absent; 1 created, 2 these very bytes (a resend), else
-- the holder's answer (see held), after on_held(raw) if given (enqueue_latest.lua's).
local function enqueue_call(key, record, ttl, on_held)
  local raw = redis.call('GET', key)
  if not raw then
    redis.call('SET', key, record, 'PX', ttl)
    return 1
  end
  if raw == record then
    return 2
  end
  if on_held then
    on_held(raw)
  end
  return held(key, raw)
end

-- enqueue_latest.lua's transition for one call (enqueue_latest_many.lua makes it for many):
-- enqueue_call's, and a duplicate leaves its arguments for the holder's run (leave_latest).
-- The strings of `now`, `debounce` and `max_wait` as the scripts get them.
local function enqueue_latest_call(key, latest_key, record, ttl, arguments, now, debounce, max_wait)
  return enqueue_call(key, record, ttl, function(raw)
    leave_latest(key, latest_key, raw, arguments, tonumber(now), tonumber(debounce),
      tonumber(max_wait))
  end)
end

-- start.lua's plan of a key's starts (start_publish.lua's too): the first start at or after
-- earliest that keeps every window of a period at n starts or fewer, among the starts made
-- and reserved, is reserved for id. Returns it (server ms).
local function plan_start(starts, plan, id, n, period, earliest, now)
  -- The scores that read(set) finds in the starts made and in the plan, together, sorted.
  local function times_of(read)
    local times = {}
    for _, set in ipairs({starts, plan}) do
      local found = read(set)
      for i = 2, #found, 2 do
        times[#times + 1] = tonumber(found[i])
      end
    end
    table.sort(times)
    return times
  end

  -- Would a start at t keep every window of a period at N starts or fewer?
  local function fits(t)
    local times = times_of(function(set)
      return redis.call('ZRANGEBYSCORE', set, '(' .. (t - period), '(' .. (t + period),
        'WITHSCORES')
    end)
    times[#times + 1] = t
    table.sort(times)
    for i = n + 1, #times do
      if times[i] - times[i - n] < period then
        return false
      end
    end
    return true
  end

  local at = earliest
  if not fits(at) then
    -- The next free start: after every start made or reserved, a period after the Nth last
    -- (the last n of each set: a long plan is never read whole).
    local times = times_of(function(set)
      return redis.call('ZRANGE', set, -n, -1, 'WITHSCORES')
    end)
    at = math.max(earliest, times[#times])
    if #times >= n then
      at = math.max(at, times[#times - n + 1] + period)
    end
  end
  redis.call('ZADD', plan, at, id)
  keep_alive(plan, at - now + period)
  return at
end

-- start.lua's "call" (start_publish.lua's): a producer reserves its call's start, the next
-- free one earliest_ms from now or later; a task id that has one keeps it (a re-sent
-- command, the same task id again). Returns the start (server ms) and now.
local function reserve_start(starts, plan, id, n, period, earliest_ms)
  local now = server_ms()
  forget_starts(starts, plan, now, period)
  local reserved = redis.call('ZSCORE', plan, id)
  if reserved then
    return tonumber(reserved), now
  end
  return plan_start(starts, plan, id, n, period, now + math.max(earliest_ms, 0), now), now
end

-- The UTC time of ms (server ms since the epoch) as Celery writes an eta (the isoformat of
-- an aware UTC datetime): "2026-11-27T15:04:05.123000+00:00". The date by days-to-civil
-- (H. Hinnant's algorithm: eras of 400 years, years from March, so a leap day is last).
local function iso_utc(ms)
  ms = math.floor(ms)
  local seconds = math.floor(ms / 1000)
  local days = math.floor(seconds / 86400)
  local time_of_day = seconds - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor(
    (doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local day = doy - math.floor((153 * mp + 2) / 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400
  if month <= 2 then
    year = year + 1
  end
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03d000+00:00', year, month, day,
    math.floor(time_of_day / 3600), math.floor(time_of_day % 3600 / 60), time_of_day % 60,
    ms - seconds * 1000)
end

-- The wait (ms) to a call's reserved start at (start_publish.lua's, start_ticket_publish.lua's)
-- and the JSON value of its message's eta: the start's when it is later than the call's own
-- earliest (ms from now), else the call's own eta (own, JSON: null when it has none).
local function eta_for(at, now, earliest, own)
  local wait = math.max(math.ceil(at - now), 0)
  if wait > math.max(earliest, 1) then
    return wait, '"' .. iso_utc(at) .. '"'
  end
  return wait, own
end

-- A key_concurrency line whose waiting calls are held in Redis and handed on (issue 41):
-- hold_or_push.lua, turn.lua, end_turn.lua, leave_turn.lua, hand_on.lua. Its keys, KEYS[1..6]
-- of each (line_keys):
--   slots    sorted set: "<id> <run token>" a run, "<id> handed" a message handed a slot and
--            not started yet; score (server ms) when its lease ends
--   line     sorted set: the waiting calls (and the handed ones until they start), task id
--            -> ticket (call order)
--   held     hash: task id -> what publishes its message: "P" .. a JSON array {message, lists,
--            expiring lists, expiry ms} that a script pushes as kombu's Redis transport would;
--            "C" .. Celery's options, which a worker publishes (dedupe.brokers.hand_off)
--   seq      the key's ticket counter
--   started  sorted set: task ids handed more than once (a handed slot lapsed and went to
--            them again): -1 until one of their copies starts, then when the others are
--            forgotten (server ms); a later copy is dropped meanwhile
--   index    sorted set of every line with waiting calls, of the key prefix: member
--            "<limit>|<lease ms>|<key>", score when its first lease ends (hand_on.lua looks)
--   due      sorted set: the places taken by a call before its message was published, on a
--            broker where no script pushes it (ticket.lua), task id -> when the place lapses
--            if its message has not come (a lease): it keeps call order for a message that
--            comes, and never holds the line long for one that never does
local HANDED = 'handed'

local function line_keys(first)
  return {slots = KEYS[first], line = KEYS[first + 1], held = KEYS[first + 2],
    seq = KEYS[first + 3], started = KEYS[first + 4], index = KEYS[first + 5],
    due = KEYS[first + 6]}
end

-- The same keys for the line of key (hand_on.lua: many lines in one script, one server).
local function line_keys_of(key, index)
  return {slots = key .. ':slots', line = key .. ':line', held = key .. ':held',
    seq = key .. ':seq', started = key .. ':started', index = index, due = key .. ':due'}
end

-- True while the lines settle after the dedup Redis lost its data (settle.lua): no new start
-- is let in, nor a slot handed on, until the live runs' heartbeats counted their slots again.
local function settling(k)
  return redis.call('EXISTS', k.index .. ':hold') == 1
end

-- Places whose message never came within their lease lapse (a lost or interrupted publish).
local function lapse_places(k, now)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', k.due, '-inf', now, 'LIMIT', 0, 100)) do
    redis.call('ZREM', k.due, id)
    if redis.call('HGET', k.held, id) == false then
      redis.call('ZREM', k.line, id)
    end
  end
end

-- Slots whose lease is over are free: a dead run's (its acks_late message, if it comes back,
-- runs again: no longer "started"), or a handed message's that never started (a killed
-- worker's prefetch, a lost publish, a releasing worker that died): that call is handed on
-- again, as it is still in line with what publishes it; its copies to come are then dropped
-- once one of them started.
local function lapse_slots(k, now)
  lapse_places(k, now)
  local gone = redis.call('ZRANGEBYSCORE', k.slots, '-inf', now)
  for _, member in ipairs(gone) do
    local id, token = string.match(member, '^(.*) (%S+)$')
    if id then
      if token == HANDED then
        if redis.call('HGET', k.held, id) ~= false then
          redis.call('ZADD', k.started, -1, id)
        end
      else
        redis.call('ZREM', k.started, id)
      end
    end
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', k.slots, '-inf', now)
  end
  redis.call('ZREMRANGEBYSCORE', k.started, 0, now)
end

-- The number of handed messages in slots (they are in line too, until they start).
local function handed_count(k)
  local count = 0
  for _, member in ipairs(redis.call('ZRANGE', k.slots, 0, -1)) do
    if string.sub(member, -#HANDED - 1) == ' ' .. HANDED then
      count = count + 1
    end
  end
  return count
end

-- Push a held "P" payload (see line_keys) as kombu's Redis transport would push it.
local function push_held(payload)
  local held = cjson.decode(string.sub(payload, 2))
  local message, lists, expiring, expire_ms = held[1], held[2], held[3], held[4]
  for _, list in ipairs(lists) do
    redis.call('LPUSH', list, message)
  end
  for _, list in ipairs(expiring) do
    redis.call('PEXPIRE', list, expire_ms)
  end
end

-- Free slots go to the calls at the head of the line, in call order: each gets a handed slot
-- (leased lease ms) and its message is pushed here ("P") or, appended to out as {id, options},
-- published by the worker that asked ("C"); its place and what publishes it stay until its
-- run starts (turn.lua), for a lapse to hand it on again. Appends {id, ''} for a push.
local function hand_on(k, limit, lease, now, out)
  local taken = redis.call('ZCARD', k.slots)
  local free = limit - taken
  if free <= 0 or settling(k) then
    return
  end
  for _, id in ipairs(redis.call('ZRANGE', k.line, 0, free + taken - 1)) do
    if free <= 0 then
      break
    end
    if not redis.call('ZSCORE', k.slots, id .. ' ' .. HANDED) then
      local payload = redis.call('HGET', k.held, id)
      free = free - 1  -- (a place whose message is on its way keeps its turn: it comes)
      if payload then
        redis.call('ZADD', k.slots, now + lease, id .. ' ' .. HANDED)
        if string.sub(payload, 1, 1) == 'P' then
          push_held(payload)
          out[#out + 1] = {id, ''}
        else
          out[#out + 1] = {id, string.sub(payload, 2)}
        end
      end
    end
  end
  keep_alive(k.slots, 2 * lease + 1000)  -- (a lapse is seen before the set expires)
end

-- A script's reply: first (none when nil), then each call handed a slot on the way and the
-- options its worker publishes it with ('' when the script pushed it).
local function with_handed(first, handed)
  local reply = {}
  if first ~= nil then
    reply[1] = first
  end
  for _, entry in ipairs(handed) do
    reply[#reply + 1] = entry[1]
    reply[#reply + 1] = entry[2]
  end
  return reply
end

-- Keep the index's entry of this line (member) right: looked at when its first lease ends
-- while calls wait or are handed (a lapse then hands on), else none.
local function index_line(k, member)
  if redis.call('EXISTS', k.held) == 1 then
    local at = nil
    for _, set in ipairs({k.slots, k.due}) do
      local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
      if first[2] and (not at or tonumber(first[2]) < at) then
        at = tonumber(first[2])
      end
    end
    redis.call('ZADD', k.index, at or 0, member)
    -- (The index lives as long as the lines it names: a prefix no worker looks at any more
    -- leaves no key behind.)
    local ttl = redis.call('PTTL', k.held)
    if ttl > 0 then
      keep_alive(k.index, ttl + 1000)
    end
  else
    redis.call('ZREM', k.index, member)
  end
  if redis.call('EXISTS', k.line) == 0 then
    redis.call('DEL', k.seq)  -- (nobody waits: the count starts again)
  end
end

-- A call waits: it takes its place at the back of the line, with what publishes it; the
-- line's keys live ttl ms at least. Returns how many calls (itself included) are ahead of a
-- free slot.
local function hold(k, id, payload, ttl)
  if not redis.call('ZSCORE', k.line, id) then
    redis.call('ZADD', k.line, redis.call('INCR', k.seq), id)
  end
  redis.call('ZREM', k.due, id)  -- (held: its place lives as long as it waits)
  redis.call('HSET', k.held, id, payload)
  for _, key in ipairs({k.line, k.held, k.seq}) do
    keep_alive(key, ttl)
  end
  return redis.call('ZRANK', k.line, id) - handed_count(k) + 1
end

-- A free slot for a call nobody waits before, now: true when one was free (after lapses).
local function free_now(k, limit)
  if settling(k) then
    return false
  end
  local waiting = redis.call('ZCARD', k.line) - handed_count(k)
  return waiting <= 0 and redis.call('ZCARD', k.slots) < limit
end
