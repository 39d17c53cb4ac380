-- Check the pause state and the fencing token, and extend the claim's lease.
-- KEYS[1] fence counter, KEYS[2] claim hash, KEYS[3] state, KEYS[4] held stream, KEYS[5] release log
-- (optional: `{S}:experiment:E:released`, tokens.lua's xmc_released), KEYS[6] replay record (optional)
-- ARGV[1] token, ARGV[2] owner, ARGV[3] lease in milliseconds
-- The fence counter is the authority: the token is current while no newer one was issued. A lease
-- that lapsed (a worker down longer than the lease) is re-established for the current token.
-- A fence counter below the token means Redis lost data (a restart without persistence), not a
-- takeover: `fence_lost`. Returns JSON {fenced, fence_lost, current_token (a decimal string), state,
-- held, reestablished, released, replayed (the resume's count, absent when unknown)}: released, only when fenced by this very token's own release (a
-- re-executed turn of a run that already released its claim), is that release's record
-- {outcome, replayed (absent when unknown), remaining}.
local current = xmc_fence(KEYS[1])
local state = xmc_known_state(redis.call('GET', KEYS[3]))
local held = redis.call('XLEN', KEYS[4])
local cmp = xmc_token_cmp(current, ARGV[1])
local replayed = KEYS[6] and tonumber(redis.call('HGET', KEYS[6], 'moved')) or nil
if cmp ~= 0 then
  local released = cmp > 0 and KEYS[5] and xmc_released(KEYS[5], ARGV[1]) or nil
  return cjson.encode({fenced = cmp > 0, fence_lost = cmp < 0, current_token = current, state = state,
                       held = held, reestablished = false, released = released, replayed = replayed})
end
local reestablished = false
if redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then
  redis.call('HSET', KEYS[2], 'token', ARGV[1], 'owner', ARGV[2])
  reestablished = true
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return cjson.encode({fenced = false, fence_lost = false, current_token = current, state = state, held = held,
                     reestablished = reestablished, replayed = replayed})
