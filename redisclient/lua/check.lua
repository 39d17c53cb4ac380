-- Check the pause state and the fencing token, and extend the claim's lease.
-- KEYS[1] fence counter, KEYS[2] claim hash, KEYS[3] state, KEYS[4] held stream
-- ARGV[1] token, ARGV[2] owner, ARGV[3] lease in milliseconds
-- The fence counter is the authority: the token is current while no newer one was issued. A lease
-- that lapsed (a worker down longer than the lease) is re-established for the current token.
-- Returns JSON {fenced, current_token, state, held, reestablished}.
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local state = redis.call('GET', KEYS[3]) or 'running'
local held = redis.call('XLEN', KEYS[4])
if current ~= tonumber(ARGV[1]) then
  return cjson.encode({fenced = true, current_token = current, state = state, held = held, reestablished = false})
end
local reestablished = false
if redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then
  redis.call('HSET', KEYS[2], 'token', ARGV[1], 'owner', ARGV[2])
  reestablished = true
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return cjson.encode({fenced = false, current_token = current, state = state, held = held, reestablished = reestablished})
