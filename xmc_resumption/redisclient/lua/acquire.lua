-- Take the claim on an experiment's resumption: a new fencing token, newest claim wins.
-- KEYS[1] fence counter, KEYS[2] claim hash, KEYS[3] state, KEYS[4] held stream, KEYS[5] publish
-- record, KEYS[6] acquire log (a list of the last 16 'request:token' pairs), KEYS[7] replay record
-- (hash: `moved`, the tasks the resume in progress moved; publish.lua counts, release.lua drops it)
-- ARGV[1] owner, ARGV[2] lease in milliseconds, ARGV[3] request ID (the caller's idempotency key)
-- A repeated request ID returns the token it was given and changes nothing, so an attempt that
-- reaches Redis late (after its retry succeeded) cannot fence its own replayer.
-- Moves the experiment to `resuming` (starting the replay is the resume) when it is paused, holds
-- a value the contract does not know, or when its state key is gone but tasks are still held.
-- A claim that starts a resume (the experiment was not `resuming`) sets the resume's count to 0; one
-- that takes over a resume in progress (a reset workflow, a newer start, a run that never handed
-- back) keeps it, so `replayed` counts every task of the resume whatever claim moved it.
-- Returns JSON {token (a decimal string), state, previous_state (before this claim), held, repeated,
-- replayed (the resume's count; absent when unknown: a resume begun before the record existed)}. A fence counter that is not a
-- token fails the call before any write (tokens.lua), and so does a maxmemory-policy that could
-- evict the replay's keys (XMCEVICTION, memory.lua), a repeated request ID too.
xmc_require_noeviction(xmc_memory())
local prefix = ARGV[3] .. ':'
for _, entry in ipairs(redis.call('LRANGE', KEYS[6], 0, -1)) do
  if string.sub(entry, 1, #prefix) == prefix then
    local state = xmc_known_state(redis.call('GET', KEYS[3]))
    return cjson.encode({token = string.sub(entry, #prefix + 1), state = state,
                         held = redis.call('XLEN', KEYS[4]), repeated = true,
                         replayed = KEYS[7] and tonumber(redis.call('HGET', KEYS[7], 'moved')) or nil})
  end
end
-- every read that can fail (a key of the wrong type) comes before the first write
local state = redis.call('GET', KEYS[3])
local previous = xmc_known_state(state)
local held = redis.call('XLEN', KEYS[4])
redis.call('HGET', KEYS[2], 'token')
redis.call('HGET', KEYS[5], 'token')
local replayed = KEYS[7] and redis.call('HGET', KEYS[7], 'moved')
if xmc_token_cmp(xmc_fence(KEYS[1]), '9223372036854775806') >= 0 then
  -- the release of the next token must still be able to revoke it with INCR (2^63 - 1 at most)
  return redis.error_reply('XMCEXHAUSTED ' .. KEYS[1] .. ' has no fencing token left (64-bit INCR limit)')
end
redis.call('INCR', KEYS[1])
local token = redis.call('GET', KEYS[1])
redis.call('LPUSH', KEYS[6], prefix .. token)
redis.call('LTRIM', KEYS[6], 0, 15)
redis.call('DEL', KEYS[2], KEYS[5])
redis.call('HSET', KEYS[2], 'token', token, 'owner', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
if KEYS[7] and state ~= 'resuming' then
  -- a new resume (paused, running, or a value the contract does not know): its count starts at 0
  redis.call('HSET', KEYS[7], 'moved', 0)
  replayed = '0'
end
if (state and state ~= 'resuming') or (not state and held > 0) then
  -- paused, a value the contract does not know, or gone while tasks are held: resuming, so
  -- producers keep queueing behind the held tasks until the replay drains them
  redis.call('SET', KEYS[3], 'resuming')
  state = 'resuming'
end
return cjson.encode({token = token, state = state or 'running', previous_state = previous, held = held,
                     repeated = false, replayed = tonumber(replayed)})
