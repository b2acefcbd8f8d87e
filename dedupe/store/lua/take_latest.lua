-- take_latest: the run of a debounced or replacing call takes the arguments its duplicates
-- left (enqueue_latest.lua), or, debounced, learns that it came before its deadline.
--
-- KEYS[1]  the call's latest-arguments hash
-- ARGV[1]  owner (packed task id)
-- ARGV[2]  now, seconds (the worker's clock): only look (nothing is taken), and say whether
--          the deadline passed; 0: take the arguments (the run claimed its key)
--
-- Returns
--   nil              nothing was left for this task id: the message's own arguments stand
--   {1, entry}       taken (or, when looking, due): entry is msgpack {first, deadline, args}
--   {0, entry}       looking, and the deadline has not come: the message is early
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if not entry then
  return nil
end
local now = tonumber(ARGV[2])
if now > 0 then
  if cmsgpack.unpack(entry)[2] > now then
    return {0, entry}
  end
  return {1, entry}
end
redis.call('HDEL', KEYS[1], ARGV[1])
return {1, entry}
