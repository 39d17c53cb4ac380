-- Count the tasks an experiment holds again after Redis lost their move (read only).
-- KEYS[1] held stream, KEYS[2] state, KEYS[3] fence counter
-- ARGV[1] moved_through: the last held entry ID a resumption of the experiment was told it moved
--         (its result's; redelivery.lua), or '' (then nothing is held again)
-- A completed resumption whose held entries at or below ARGV[1] are held again was undone by Redis
-- (a crash failover to a replica that never got its moves): its tasks were delivered once, and a
-- resume delivers them again, marked (publish.lua).
-- Returns JSON {held_again (entries at or below ARGV[1], up to 1,000), held_again_capped (more than
-- that), held (entries), state (tokens.lua's xmc_known_state), token (the fence counter, a decimal
-- string)}. An ARGV[1] that is no entry ID fails with XMCARG, a counter that is no token with
-- XMCCORRUPT.
local through = xmc_arg_entry_id('moved_through (ARGV[1])', ARGV[1])
local again, capped = xmc_count_through(KEYS[1], through)
return cjson.encode({held_again = again, held_again_capped = capped, held = redis.call('XLEN', KEYS[1]),
                     state = xmc_known_state(redis.call('GET', KEYS[2])), token = xmc_fence(KEYS[3])})
