-- Fencing tokens, exactly, and the experiment's state as the contract knows it (a fragment:
-- scripts.py prepends it to every script that reads tokens or the state).
-- A token is the fence counter's value: a decimal integer up to Redis's 64-bit INCR limit. Lua
-- numbers are doubles and cjson writes 14 significant digits, so tokens stay strings here: read
-- with GET (never the number INCR returns), compared as canonical decimal strings, and written to
-- JSON as strings.

-- -1, 0 or 1 as canonical token string a is below, equal to or above b.
local function xmc_token_cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end

-- The fence counter of `key` as a canonical token string ('0' when absent). Raises an error reply
-- naming the key, before any write, when it holds anything else (a negative number, text, a
-- leading zero, more than INCR's 9223372036854775807): redisclient/fencing.py parse_token's rule.
local function xmc_fence(key)
  local v = redis.call('GET', key)
  if not v then return '0' end
  if not string.match(v, '^%d+$') or #v > 19 or (#v > 1 and string.sub(v, 1, 1) == '0')
     or xmc_token_cmp(v, '9223372036854775807') > 0 then
    error({err = 'XMCCORRUPT ' .. key .. ' holds ' .. string.format('%q', string.sub(v, 1, 40))
                 .. ', not a fencing token (a non-negative integer)'})
  end
  return v
end

-- The smallest token a claim may hand out now: Redis's clock (TIME) in microseconds since the
-- epoch, times 1,000 (the last three digits are the counter's tiebreak), as a canonical string of
-- 19 digits until the year 2262. A claim takes the larger of this and the fence counter plus one,
-- so a token handed out after Redis lost the counter's last increments (a crash failover to a
-- replica that never got them, a restart without persistence) is still above every token handed
-- out before: those were at most their own floor plus the few increments of its microsecond, and
-- the clock has moved on since (docs/contract.md, "Fencing tokens").
local function xmc_token_floor()
  local now = redis.call('TIME')
  return now[1] .. string.format('%06d', tonumber(now[2])) .. '000'
end

-- Rewrites string key `key` with the value it holds, when it exists: a write that changes nothing
-- but reaches the replicas after every write before it. A script that answers from a record of an
-- earlier call (a repeated request) calls it, so that WAIT on the caller's connection, which counts
-- the replicas that have the connection's last write, covers that earlier write too.
local function xmc_touch(key)
  local v = redis.call('GET', key)
  if v then redis.call('SET', key, v, 'KEEPTTL') end
end

-- An experiment's state (GET's reply) as the contract knows it: 'paused', 'resuming', or
-- 'running' when the key is absent; any other value is reported as 'unknown' (and treated as
-- holding: enqueue.lua, acquire.lua).
local function xmc_known_state(v)
  if not v then return 'running' end
  if v == 'paused' or v == 'resuming' then return v end
  return 'unknown'
end

-- The release log (`{S}:experiment:E:released`, a list of the last 16 releases, newest first, each
-- '<token> <outcome> <replayed> <remaining>', replayed '-' when unknown; release.lua writes it): the
-- record of `token`'s release as {outcome, replayed (nil when unknown), remaining}, or nil when the
-- token was not released (or not among the last 16). A re-executed turn of a run that released its
-- own claim finds here what it released, instead of taking its own revoked token for a takeover.
local function xmc_released(key, token)
  for _, entry in ipairs(redis.call('LRANGE', key, 0, -1)) do
    local t, outcome, replayed, remaining = string.match(entry, '^(%d+) (%S+) (%S+) (%d+)$')
    if t == token then
      return {outcome = outcome, replayed = tonumber(replayed), remaining = tonumber(remaining)}
    end
  end
  return nil
end
