-- Release the claim and revoke its token, and record what was released with which outcome.
-- KEYS[1] fence counter, KEYS[2] claim hash, KEYS[3] state, KEYS[4] publish record
-- ARGV[1] token, or 0 when the caller does not know it (a run cancelled before its claim's reply
--         was recorded): then the claim is released if ARGV[2] owns it
-- ARGV[2] owner, ARGV[3] '1' to move a `resuming` experiment back to `paused` (a cancelled replay)
-- KEYS[5] the stream's fair-share replayers (sorted set) and ARGV[4] the experiment ID: a released
--         replay stops counting in the others' shares at once, not when its lease ends (a KEYS[5]
--         of another type is left alone: the release never fails on the stream's shared key)
-- KEYS[6] replay record (hash: `moved`, the tasks the resume in progress moved; publish.lua),
-- KEYS[7] release log (list: the last 16 releases, tokens.lua's xmc_released), KEYS[8] held stream,
-- ARGV[5] the outcome the caller ends with (1..32 of a-z and _; '' is recorded as `released`)
-- The fence counter is bumped, so the released token can never publish again (a zombie attempt of
-- the released run is fenced at the resource). The release is recorded in the release log with the
-- resume's count and the held tasks left; once the experiment is no longer `resuming` (paused,
-- or running: drained) the resume has ended and its count is dropped from the replay record.
-- Returns JSON {token (the released token, a decimal string; '0' when nothing was released: a
-- newer claim owns the experiment, or the owner holds no claim), outcome, replayed (absent when
-- unknown), remaining, repeated}: a release of a token this script released before (a retry, or a
-- re-executed turn) changes nothing and returns that release's record with repeated true (it
-- rewrites the fence counter with its own value, so that a WAIT after this call covers that release).
-- Every argument and every key read is checked before the first write.
local token = ARGV[1]
local outcome = ARGV[5] or ''
if not string.match(outcome, '^[a-z_]*$') or #outcome > 32 then
  return redis.error_reply('XMCARG outcome must be 0..32 of a-z and _, got ' .. string.format('%q', string.sub(outcome, 1, 40)))
end
if outcome == '' then outcome = 'released' end
local log = KEYS[7]
if token == '0' and redis.call('HGET', KEYS[2], 'owner') == ARGV[2] then
  token = redis.call('HGET', KEYS[2], 'token') or '0'
end
if token ~= '0' and xmc_fence(KEYS[1]) ~= token then
  local r = log and xmc_released(log, token)
  if r then
    xmc_touch(KEYS[1])  -- so that a WAIT after this call covers the release it reports (tokens.lua)
    return cjson.encode({token = token, outcome = r.outcome, replayed = r.replayed, remaining = r.remaining,
                         repeated = true})
  end
end
if token == '0' or xmc_fence(KEYS[1]) ~= token then
  return cjson.encode({token = '0', outcome = outcome, remaining = log and redis.call('XLEN', KEYS[8]) or 0,
                       repeated = false})
end
local state = redis.call('GET', KEYS[3])  -- read before the first write (a key of the wrong type fails here)
local replayers = KEYS[5] and ARGV[4] and ARGV[4] ~= '' and KEYS[5]
if replayers and redis.call('TYPE', replayers)['ok'] ~= 'zset' then
  -- absent, or of the wrong type (the stream's fair publishes fail on it, named): it holds no
  -- entry of this replay, so there is nothing to leave, and the experiment is handed back all the same
  replayers = false
end
local replayed, remaining = nil, 0
if log then
  -- the resume's count; without one (a resume begun before the replay record existed), the
  -- claim's own count in the publish record
  replayed = redis.call('HGET', KEYS[6], 'moved')
  if not replayed and redis.call('HGET', KEYS[4], 'token') == token then
    replayed = redis.call('HGET', KEYS[4], 'moved')
  end
  replayed = tonumber(replayed)
  remaining = redis.call('XLEN', KEYS[8])
  redis.call('LRANGE', log, 0, 0)  -- (its type, before the first write)
end
redis.call('INCR', KEYS[1])
redis.call('DEL', KEYS[2], KEYS[4])
if ARGV[3] == '1' and state == 'resuming' then
  redis.call('SET', KEYS[3], 'paused')
  state = 'paused'
end
if replayers then
  redis.call('ZREM', replayers, ARGV[4])
end
if log then
  redis.call('LPUSH', log, table.concat({token, outcome, replayed and string.format('%d', replayed) or '-', remaining}, ' '))
  redis.call('LTRIM', log, 0, 15)
  if state ~= 'resuming' then
    redis.call('DEL', KEYS[6])  -- the resume ended (paused, or drained): the next one counts afresh
  end
end
return cjson.encode({token = token, outcome = outcome, replayed = replayed, remaining = remaining, repeated = false})
