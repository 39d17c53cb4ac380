-- Take the claim on an experiment's resumption: a new fencing token, newest claim wins.
-- KEYS[1] fence counter, KEYS[2] claim hash, KEYS[3] state, KEYS[4] held stream, KEYS[5] publish record
-- ARGV[1] owner, ARGV[2] lease in milliseconds
-- Moves the experiment paused -> resuming (starting the replay is the resume).
-- Returns JSON {token, state, held}.
local token = redis.call('INCR', KEYS[1])
redis.call('DEL', KEYS[2], KEYS[5])
redis.call('HSET', KEYS[2], 'token', token, 'owner', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
local state = redis.call('GET', KEYS[3])
if state == 'paused' then
  redis.call('SET', KEYS[3], 'resuming')
  state = 'resuming'
end
return cjson.encode({token = token, state = state or 'running', held = redis.call('XLEN', KEYS[4])})
