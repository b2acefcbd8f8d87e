-- restore_run_lock: the run lock of a unique_until="started" message the broker holds for a
-- worker (delivered, not acked: reserved, running, or its worker dead) is written back after
-- Redis lost it (absent -> restored), as restore.lua writes a "finished" message's key: no
-- other run of its key starts beside it while it may be running. Its live run's heartbeat
-- takes it back as its own (renew.lua); its call key is restored later, and only if no live
-- run took the lock back (restore.lua's KEYS[2]): a running message's calls go after it.
--
-- KEYS[1]  run lock
-- ARGV[1]  the restored record (dedupe.values.record.pack_restored)
-- ARGV[2]  time to live, ms: until the broker gives the message back, and a lease more
-- ARGV[3]  lease, ms
--
-- Returns 1 restored, 0 left alone (a run holds the lock: its own, taken back already, or
-- another task id's, which this message waits for as any other would)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
hold_ahead(KEYS[1], cmsgpack.unpack(ARGV[1]), nil, tonumber(ARGV[3]), tonumber(ARGV[2]))
return 1
