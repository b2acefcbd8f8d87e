-- free_tick: a beat whose send of a tick failed gives up its claim of that tick (claimed ->
-- absent), so that the next beat to fire for it sends it.
--
-- KEYS[1]  tick key (dedupe.values.keys.tick_key)
-- ARGV[1]  the claimant this beat claimed it with
--
-- Returns 1 if the claim was freed, else 0: a claim that expired, or that another beat made
-- since (never deleted: that beat may be sending the tick).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
