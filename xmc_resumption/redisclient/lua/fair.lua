-- Fair share of a shared threshold (issue 8; a fragment: scripts.py prepends it to publish.lua).
--
-- The replays of every experiment on one task stream share its consumer group's threshold. Without
-- a share, whichever replay's wait ends first takes the headroom, up to its batch. With the fair
-- share on (the input's `fair_share`), one publish moves at most
--   share = max(1, floor(headroom * w_e / sum of w over the active replayers))
-- where the weights come from the hash `{S}:weights` (field: experiment ID, value: an integer
-- 1..XMC_MAX_WEIGHT; a missing field weighs 1), and the active replayers are the members of the
-- sorted set `{S}:replayers` (member: experiment ID, score: the end of its lease, in milliseconds on
-- Redis's clock) whose lease has not ended, the caller always among them. Each fair publish renews
-- the caller's lease, so a replay that died or was paused stops counting once its lease ends; one
-- that completed leaves at once. At least 1 moves while there is headroom, so nobody starves.
-- The model is Temporal's task-queue fairness (fairness keys with weights: a key's share of
-- dispatch is its weight over the sum of the weights of the keys with work).
-- Corrupt entries touch only their own experiment: a weight that is no integer 1..XMC_MAX_WEIGHT
-- fails the publish of the experiment it belongs to (XMCCORRUPT, naming the key and the field),
-- and counts as the default weight 1 in everybody else's share; a lease end further ahead than
-- the longest lease (XMC_MAX_LEASE_MS) was never written by a replay: it counts for nobody and is
-- dropped with the next registration. (A key of the wrong type is the stream's, so it fails every
-- fair publish on the stream, named; the release skips it: release.lua.)
-- Reads (xmc_fair_read) validate everything before the caller's first write; writes
-- (xmc_fair_register, xmc_fair_leave) come after.

local XMC_MAX_WEIGHT = 1000
local XMC_MAX_LEASE_MS = 604800000  -- a week: redisclient/fencing.py MAX_LEASE_MS, the input's bound
local XMC_HMGET_CHUNK = 1000  -- fields per HMGET: unpack stops near 8,000 values

-- The weight `v` (HGET's reply) of field `field` of hash `key`: 1 when absent or, for another
-- experiment than the caller (`own` false), when it is no weight; for the caller's own field, an
-- error reply naming the key and field, raised before any write, for anything but an integer
-- 1..XMC_MAX_WEIGHT.
local function xmc_weight(key, field, v, own)
  if not v then return 1 end
  local n = string.match(v, '^%d+$') and tonumber(v)
  if not n or n < 1 or n > XMC_MAX_WEIGHT then
    if not own then return 1 end
    error({err = 'XMCCORRUPT ' .. key .. ' field ' .. field .. ' holds ' .. string.format('%q', string.sub(v, 1, 40))
                 .. ', not a weight (an integer 1..' .. XMC_MAX_WEIGHT .. ')'})
  end
  return n
end

-- Read the fair share's inputs: Redis's clock (ms), the caller's weight and the sum of the weights
-- of the active replayers (the caller included: those whose lease ends after now and at most the
-- longest lease ahead), and check the lease it registers with (`lease_ms`, an integer of
-- milliseconds, 1..XMC_MAX_LEASE_MS). Returns {now, own, total, active, lease}.
local function xmc_fair_read(weights_key, replayers_key, experiment, lease_ms)
  if type(experiment) ~= 'string' or experiment == '' then
    error({err = 'ERR fair share: the experiment ID (ARGV) is missing or empty'})
  end
  local lease = tonumber(lease_ms)
  if not lease or lease < 1 or lease ~= math.floor(lease) or lease > XMC_MAX_LEASE_MS then
    error({err = 'ERR fair share: lease ' .. tostring(lease_ms) .. ' is not a whole number of milliseconds 1..'
                 .. XMC_MAX_LEASE_MS})
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local members = {experiment}
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', replayers_key, '(' .. now, now + XMC_MAX_LEASE_MS)) do
    if m ~= experiment then members[#members + 1] = m end
  end
  local own, total = 0, 0
  for i = 1, #members, XMC_HMGET_CHUNK do
    local chunk = {}
    for j = i, math.min(#members, i + XMC_HMGET_CHUNK - 1) do chunk[#chunk + 1] = members[j] end
    local ws = redis.call('HMGET', weights_key, unpack(chunk))
    for j, m in ipairs(chunk) do
      local w = xmc_weight(weights_key, m, ws[j], m == experiment)
      total = total + w
      if m == experiment then own = w end
    end
  end
  return {now = now, own = own, total = total, active = #members, lease = lease}
end

-- The caller's share of `headroom` (entries): 0 when there is none, else at least 1.
local function xmc_fair_share(f, headroom)
  if headroom <= 0 then return 0 end
  return math.max(1, math.floor(headroom * f.own / f.total))
end

-- Drop the replayers whose lease ended, and those whose lease end no replay could have written
-- (further ahead than the longest lease), and renew the caller's lease (checked by xmc_fair_read).
local function xmc_fair_register(replayers_key, experiment, f)
  redis.call('ZREMRANGEBYSCORE', replayers_key, '-inf', f.now)
  redis.call('ZREMRANGEBYSCORE', replayers_key, '(' .. (f.now + XMC_MAX_LEASE_MS), '+inf')
  redis.call('ZADD', replayers_key, f.now + f.lease, experiment)
end

-- The caller's replay completed: it no longer takes a share.
local function xmc_fair_leave(replayers_key, experiment)
  redis.call('ZREM', replayers_key, experiment)
end
