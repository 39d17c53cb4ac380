-- Stream-wide rate cap (a fragment: scripts.py prepends it to publish.lua; docs/pacing.md).
--
-- The hash `{S}:rate` caps how many held tasks all the replays of task stream S together move per
-- second: a token bucket on Redis's clock, shared by every replay because every publish of the
-- stream reads and writes the same key in the same step as its move. Fields:
--   limit   tasks per second (a decimal number in [XMC_MIN_TASK_RATE, XMC_MAX_TASK_RATE]), set by an operator;
--   tokens  whole or fractional tasks the bucket held at `at` (absent: a full bucket);
--   at      when `tokens` was written (milliseconds on Redis's clock; absent: now).
-- The bucket holds at most max(1, limit * XMC_RATE_BURST_SECONDS) tokens and refills at `limit`
-- per second, so over any window of w seconds at most limit * w + that capacity tasks move. No key:
-- no cap. A publish moves at most the whole tokens the bucket holds.
-- Reads (xmc_rate_read) validate everything before the caller's first write; the write
-- (xmc_rate_take) comes after the move.

local XMC_MAX_TASK_RATE = 1000000
local XMC_MIN_TASK_RATE = 0.001
local XMC_RATE_BURST_SECONDS = 1

-- `v` (an HMGET reply) as a finite number in [low, high]; an error reply naming the key and field,
-- raised before any write, for anything else.
local function xmc_rate_number(key, field, v, low, high)
  local n = tonumber(v)
  if not n or n ~= n or n < low or n > high then
    error({err = 'XMCCORRUPT ' .. key .. ' field ' .. field .. ' holds ' .. string.format('%q', string.sub(v, 1, 40))
                 .. ', not a number in [' .. low .. ', ' .. high .. ']'})
  end
  return n
end

-- The stream's bucket now: nil when `key` does not exist (no cap), else {limit (tasks/s),
-- capacity (tasks), tokens (tasks available now), now (ms, Redis's clock)}. A key of another type
-- raises WRONGTYPE; a field that is no number in bounds raises XMCCORRUPT.
local function xmc_rate_read(key)
  local v = redis.call('HMGET', key, 'limit', 'tokens', 'at')
  if not v[1] then
    if redis.call('EXISTS', key) == 1 then
      error({err = 'XMCCORRUPT ' .. key .. ' has no field limit (set it with xmc rate --set, or delete the key)'})
    end
    return nil
  end
  local limit = xmc_rate_number(key, 'limit', v[1], XMC_MIN_TASK_RATE, XMC_MAX_TASK_RATE)
  local capacity = math.max(1, limit * XMC_RATE_BURST_SECONDS)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local tokens, at = capacity, now
  if v[2] then tokens = xmc_rate_number(key, 'tokens', v[2], 0, XMC_MAX_TASK_RATE * XMC_RATE_BURST_SECONDS) end
  if v[3] then at = xmc_rate_number(key, 'at', v[3], 0, 2 ^ 53) end
  tokens = math.min(capacity, tokens + math.max(0, now - at) * limit / 1000)
  return {limit = limit, capacity = capacity, tokens = tokens, now = now}
end

-- Milliseconds until the bucket `r` holds min(`want`, its capacity) tokens (0 when it does).
local function xmc_rate_wait_ms(r, want)
  local need = math.min(want, r.capacity) - r.tokens
  if need <= 0 then return 0 end
  return math.ceil(need * 1000 / r.limit)
end

-- Take `moved` tokens from the bucket `r` (read by xmc_rate_read in the same script).
local function xmc_rate_take(key, r, moved)
  redis.call('HSET', key, 'tokens', string.format('%.17g', math.max(0, r.tokens - moved)), 'at', r.now)
end
