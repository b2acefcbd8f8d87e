-- end_latest: the run of a debounced or replacing call, which claimed its key, has ended. The
-- take it kept for a resend (take_latest.lua) is dropped, and with it the hash when nothing
-- else is left in it; and the run leaves its tombstone: its task id and retry count, no
-- arguments, for as long as the broker may deliver its message again (an ack lost after the
-- run: a broker cut, a worker killed before the ack). That delivery finds it in its take and
-- does not run again, with its message's own arguments, older than those the run took.
--
-- KEYS[1]  the call's latest-arguments hash
-- KEYS[2]  the call's ended runs: a sorted set, member msgpack {owner, retries}, scored by
--          when the tombstone lapses (server ms)
-- ARGV[1]  owner (packed task id)
-- ARGV[2]  the run's retry count (request.retries): a retry of the task id is a new run
-- ARGV[3]  ms the tombstone lives: the message's redelivery horizon
--
-- Returns 1 the take dropped, 0 the kept take was another run's (or gone); the tombstone is
-- left either way.
local now = server_ms()
local horizon = tonumber(ARGV[3])
-- (Lapsed tombstones go as new ones come: the set holds the runs of one horizon at most.)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + horizon, cmsgpack.pack({ARGV[1], tonumber(ARGV[2])}))
if redis.call('PTTL', KEYS[2]) < horizon then
  redis.call('PEXPIRE', KEYS[2], horizon)
end
local taken = redis.call('HGET', KEYS[1], 'taken')
if taken and cmsgpack.unpack(taken)[1] == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'taken')
  return 1
end
return 0
