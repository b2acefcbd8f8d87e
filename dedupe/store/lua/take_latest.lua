-- take_latest: the run of a debounced or replacing call takes the arguments its duplicates
-- left (enqueue_latest.lua), or, debounced, learns that it came before its deadline.
--
-- KEYS[1]  the call's latest-arguments hash
-- KEYS[2]  the call's ended runs (end_latest.lua's tombstones)
-- ARGV[1]  owner (packed task id)
-- ARGV[2]  now, seconds (the worker's clock): only look (nothing is taken), and say whether
--          the deadline passed; 0: take the arguments (the run claimed its key)
-- ARGV[3]  the delivery's retry count (request.retries)
--
-- Returns
--   {2}              this task id's run of this retry count has ended already: the message
--                    is delivered again (its ack was lost), and must not run again
--   nil              nothing was left for this task id: the message's own arguments stand
--   {1, entry}       taken (or, when looking, due): entry is msgpack {first, deadline, args}
--   {0, entry}       looking, and the deadline has not come: the message is early
--
-- A take is kept in the field "taken" ({owner, entry, retry count}; no owner is packed to
-- that name), so that the same take sent again (its reply lost with its connection) answers
-- as it did: only the key's one claimed run takes, so the last take is the only one to keep.
-- A retry of the run (another retry count) is not that take: its message's arguments stand
-- (the ones its body gave self.retry, or the taken ones Celery's retry sends by default).
local now = tonumber(ARGV[2])
local ended = redis.call('ZSCORE', KEYS[2], cmsgpack.pack({ARGV[1], tonumber(ARGV[3])}))
if ended and tonumber(ended) > server_ms() then
  return {2}
end
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if not entry then
  local taken = now == 0 and redis.call('HGET', KEYS[1], 'taken')
  if taken then
    taken = cmsgpack.unpack(taken)
    if taken[1] == ARGV[1] and taken[3] == tonumber(ARGV[3]) then
      return {1, taken[2]}
    end
  end
  return nil
end
if now > 0 then
  if cmsgpack.unpack(entry)[2] > now then
    return {0, entry}
  end
  return {1, entry}
end
-- (The HDEL of the hash's last field deletes the hash: the HSET writes it anew, with the
-- ttl it had, else it would live forever.)
local ttl = redis.call('PTTL', KEYS[1])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], 'taken', cmsgpack.pack({ARGV[1], entry, tonumber(ARGV[3])}))
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {1, entry}
