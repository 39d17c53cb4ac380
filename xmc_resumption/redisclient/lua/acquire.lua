-- Take the claim on an experiment's resumption: a new fencing token, newest claim wins.
-- KEYS[1] fence counter, KEYS[2] claim hash, KEYS[3] state, KEYS[4] held stream, KEYS[5] publish
-- record, KEYS[6] acquire log (a list of the last 16 'request:token' pairs), KEYS[7] replay record
-- (hash: `moved`, the tasks the resume in progress moved, and `redelivered`, those of them moved
-- again after Redis lost their move; publish.lua counts, release.lua drops it)
-- ARGV[1] owner, ARGV[2] lease in milliseconds, ARGV[3] request ID (the caller's idempotency key),
-- ARGV[4] moved_through (optional; '' for none): the last held entry ID the caller was told a
--         resumption of this experiment moved (redelivery.lua): held entries at or below it are
--         tasks Redis holds again after losing their move, counted in the reply (`held_again`)
-- The token is the larger of the fence counter plus one and the clock's floor (tokens.lua's
-- xmc_token_floor), so it is above every token handed out before, also when Redis lost the
-- counter's last increments.
-- A repeated request ID returns the token it was given and changes nothing (but rewrites the fence
-- counter with its own value, so that a WAIT after this call covers the claim it reports: tokens.lua's
-- xmc_touch), so an attempt that reaches Redis late (after its retry succeeded) cannot fence its own
-- replayer.
-- Moves the experiment to `resuming` (starting the replay is the resume) when it is paused, holds
-- a value the contract does not know, or when its state key is gone but tasks are still held.
-- A claim that starts a resume (the experiment was not `resuming`) sets the resume's count to 0; one
-- that takes over a resume in progress (a reset workflow, a newer start, a run that never handed
-- back) keeps it, so `replayed` counts every task of the resume whatever claim moved it.
-- Returns JSON {token (a decimal string), state, previous_state (before this claim), held, repeated,
-- replayed (the resume's count; absent when unknown: a resume begun before the record existed),
-- redelivered (of those, the tasks moved again after Redis lost their move; absent with replayed),
-- held_again (held entries at or below ARGV[4], up to 1,000), held_again_capped (more than that)}.
-- A fence counter that is not a token fails the call before any write (tokens.lua), and so does a
-- maxmemory-policy that could evict the replay's keys (XMCEVICTION, memory.lua), or an ARGV[4] that
-- is no entry ID (XMCARG), a repeated request ID too.
xmc_require_noeviction(xmc_memory())
local moved_through = xmc_arg_entry_id('moved_through (ARGV[4])', ARGV[4])
local held_again, held_again_capped = xmc_count_through(KEYS[4], moved_through)
local prefix = ARGV[3] .. ':'
for _, entry in ipairs(redis.call('LRANGE', KEYS[6], 0, -1)) do
  if string.sub(entry, 1, #prefix) == prefix then
    local state = xmc_known_state(redis.call('GET', KEYS[3]))
    local replayed = KEYS[7] and tonumber(redis.call('HGET', KEYS[7], 'moved')) or nil
    local redelivered = replayed and tonumber(redis.call('HGET', KEYS[7], 'redelivered') or '0') or nil
    xmc_fence(KEYS[1])  -- (a counter that is no token fails before the write below)
    xmc_touch(KEYS[1])
    return cjson.encode({token = string.sub(entry, #prefix + 1), state = state,
                         held = redis.call('XLEN', KEYS[4]), repeated = true, replayed = replayed,
                         redelivered = redelivered,
                         held_again = held_again, held_again_capped = held_again_capped})
  end
end
-- every read that can fail (a key of the wrong type) comes before the first write
local state = redis.call('GET', KEYS[3])
local previous = xmc_known_state(state)
local held = redis.call('XLEN', KEYS[4])
redis.call('HGET', KEYS[2], 'token')
redis.call('HGET', KEYS[5], 'token')
local replayed = KEYS[7] and redis.call('HGET', KEYS[7], 'moved')
local redelivered = replayed and (redis.call('HGET', KEYS[7], 'redelivered') or '0')
local floor = xmc_token_floor()
if xmc_token_cmp(xmc_fence(KEYS[1]), '9223372036854775806') >= 0
   or xmc_token_cmp(floor, '9223372036854775806') > 0 then
  -- the release of the next token must still be able to revoke it with INCR (2^63 - 1 at most)
  return redis.error_reply('XMCEXHAUSTED ' .. KEYS[1] .. ' has no fencing token left (64-bit INCR limit)')
end
redis.call('INCR', KEYS[1])
local token = redis.call('GET', KEYS[1])
if xmc_token_cmp(token, floor) < 0 then
  -- the counter is behind the clock's floor (it is ahead only within the microsecond of a claim):
  -- the floor it is, so a counter that lost increments never hands out a token again
  redis.call('SET', KEYS[1], floor)
  token = floor
end
redis.call('LPUSH', KEYS[6], prefix .. token)
redis.call('LTRIM', KEYS[6], 0, 15)
redis.call('DEL', KEYS[2], KEYS[5])
redis.call('HSET', KEYS[2], 'token', token, 'owner', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
if KEYS[7] and state ~= 'resuming' then
  -- a new resume (paused, running, or a value the contract does not know): its counts start at 0
  redis.call('HSET', KEYS[7], 'moved', 0, 'redelivered', 0)
  replayed, redelivered = '0', '0'
end
if (state and state ~= 'resuming') or (not state and held > 0) then
  -- paused, a value the contract does not know, or gone while tasks are held: resuming, so
  -- producers keep queueing behind the held tasks until the replay drains them
  redis.call('SET', KEYS[3], 'resuming')
  state = 'resuming'
end
return cjson.encode({token = token, state = state or 'running', previous_state = previous, held = held,
                     repeated = false, replayed = tonumber(replayed), redelivered = tonumber(redelivered),
                     held_again = held_again,
                     held_again_capped = held_again_capped})
