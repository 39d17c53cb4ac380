-- Redis's memory settings as the replay needs them (a fragment: scripts.py prepends it to the
-- scripts that take the claim or publish, and to memory_status.lua), so the rule lives once.
-- Read from INFO memory: CONFIG is not allowed in scripts (and not granted to a least-privilege
-- ACL user); INFO is, on Redis 7.0, also after a write (scripts replicate their effects).
--
-- The policy rule: only `noeviction` keeps every key of the replay. allkeys-* evict any key (the
-- held stream: tasks lost; the fence counter: a stale replayer writes again); volatile-* evict
-- keys with a TTL, and the claim hash has one (its lease), so it would be the first to go under
-- memory pressure. A script that would take the claim or move tasks under another policy fails
-- before its first write with an error reply starting `XMCEVICTION`.

-- The memory settings: {policy (maxmemory-policy), used_memory (bytes), maxmemory (bytes, 0: no
-- limit)}. Raises an error reply when INFO lacks one of them (it never does on Redis >= 4).
local function xmc_memory()
  local info = redis.call('INFO', 'memory')
  local policy = string.match(info, '\nmaxmemory_policy:([%w%-]+)')
  local used = tonumber(string.match(info, '\nused_memory:(%d+)'))
  local max = tonumber(string.match(info, '\nmaxmemory:(%d+)'))
  if not policy or not used or not max then
    error({err = 'XMCINFO INFO memory lacks maxmemory_policy, used_memory or maxmemory'})
  end
  return {policy = policy, used_memory = used, maxmemory = max}
end

-- What is wrong with memory `m`'s eviction policy for the replay (one line), or nil under noeviction.
local function xmc_eviction_problem(m)
  if m.policy == 'noeviction' then return nil end
  return 'maxmemory-policy ' .. m.policy .. ': the replay needs noeviction (this policy can evict the held '
         .. 'tasks, the fence counter or the claim); set maxmemory-policy noeviction on this Redis, then '
         .. 'resume again'
end

-- Raises the error reply 'XMCEVICTION <problem>' unless memory `m` (xmc_memory) is under noeviction.
local function xmc_require_noeviction(m)
  local problem = xmc_eviction_problem(m)
  if problem then error({err = 'XMCEVICTION ' .. problem}) end
end

-- The memory fraction argument: nil (off) for '' or an absent argument, else a number with
-- 0 < f <= 1; anything else raises an error reply (before any write).
local function xmc_memory_fraction(arg)
  if arg == nil or arg == '' then return nil end
  local f = tonumber(arg)
  if not f or f ~= f or f <= 0 or f > 1 then
    error({err = 'XMCARG max memory fraction must be a number with 0 < f <= 1, got ' .. string.sub(arg, 1, 40)})
  end
  return f
end

-- True when used memory has reached `fraction` of maxmemory (>=: at the fraction exactly, the
-- replay stops); never with fraction nil or no limit. Compared as the ratio used / max, not as
-- used >= fraction x max: the product rounds up past the exact bound (0.55 x 104857600 =
-- 57671680.00000001), so memory exactly at the fraction would not stop the replay; the quotient
-- and the fraction are the same double when the two are equal.
local function xmc_memory_full(m, fraction)
  return fraction ~= nil and m.maxmemory > 0 and m.used_memory / m.maxmemory >= fraction
end
