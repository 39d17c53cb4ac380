-- Release the claim and revoke its token.
-- KEYS[1] fence counter, KEYS[2] claim hash, KEYS[3] state, KEYS[4] publish record
-- ARGV[1] token, or 0 when the caller does not know it (a run cancelled before its claim's reply
--         was recorded): then the claim is released if ARGV[2] owns it
-- ARGV[2] owner, ARGV[3] '1' to move a `resuming` experiment back to `paused` (a cancelled replay)
-- KEYS[5] the stream's fair-share replayers (sorted set) and ARGV[4] the experiment ID: a released
--         replay stops counting in the others' shares at once, not when its lease ends (a KEYS[5]
--         of another type is left alone: the release never fails on the stream's shared key)
-- The fence counter is bumped, so the released token can never publish again (a zombie attempt of
-- the released run is fenced at the resource). Returns the released token, or 0 when it was not
-- current (a newer claim owns the experiment, or the owner holds no claim): nothing changes then.
-- Tokens are decimal strings (tokens.lua); the reply too ('0' when nothing was released).
local token = ARGV[1]
if token == '0' and redis.call('HGET', KEYS[2], 'owner') == ARGV[2] then
  token = redis.call('HGET', KEYS[2], 'token') or '0'
end
if token == '0' or xmc_fence(KEYS[1]) ~= token then
  return '0'
end
local state = redis.call('GET', KEYS[3])  -- read before the first write (a key of the wrong type fails here)
local replayers = KEYS[5] and ARGV[4] and ARGV[4] ~= '' and KEYS[5]
if replayers and redis.call('TYPE', replayers)['ok'] ~= 'zset' then
  -- absent, or of the wrong type (the stream's fair publishes fail on it, named): it holds no
  -- entry of this replay, so there is nothing to leave, and the experiment is handed back all the same
  replayers = false
end
redis.call('INCR', KEYS[1])
redis.call('DEL', KEYS[2], KEYS[4])
if ARGV[3] == '1' and state == 'resuming' then
  redis.call('SET', KEYS[3], 'paused')
end
if replayers then
  redis.call('ZREM', replayers, ARGV[4])
end
return token
