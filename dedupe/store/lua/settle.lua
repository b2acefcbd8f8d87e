-- settle: a worker's look at whether the dedup Redis was restarted or failed over since its
-- last look (its run id changed: its data may be lost): then the lines of key_concurrency
-- keys settle for a lease (no new start, no hand-on: settling() in the prelude) while the
-- live runs' heartbeats count their slots again (renew_slot.lua), so that never more than
-- the limit run at once across the loss.
--
-- KEYS[1]  the prefix's lines index (its ":hold" key is named after it)
-- ARGV[1]  the server's run id this worker saw at its last look ('' for none yet)
-- ARGV[2]  the server's run id now (INFO's, read by the worker just before)
-- ARGV[3]  how long the lines settle, ms (a lease)
--
-- Returns 1 when the lines settle from now, else 0. A worker that never looked (a new one)
-- holds nothing: it cannot tell a restart from a first use.
local seen, run = ARGV[1], ARGV[2]
if seen ~= '' and run ~= '' and seen ~= run and redis.call('EXISTS', KEYS[1] .. ':hold') == 0 then
  redis.call('SET', KEYS[1] .. ':hold', run, 'PX', tonumber(ARGV[3]))
  return 1
end
return 0
