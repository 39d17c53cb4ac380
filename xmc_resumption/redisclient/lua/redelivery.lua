-- Tasks Redis holds again after it lost their move (a fragment: scripts.py prepends it to the
-- scripts that take the claim, publish, or look for such tasks), so the rule lives once.
-- The replay moves held entries oldest first, so the tasks a caller was told were moved are the
-- held entries up to the last one moved, by entry ID: `moved_through`, which the caller keeps
-- from the replies (`last_moved_id`) and passes back. A held entry at or below it was moved
-- before, and its first delivery may have been read: Redis lost the move (a crash failover to a
-- replica that never got it, issue 23). The publish moves it again, marked with the field
-- XMC_REDELIVERY_FIELD = '<experiment ID> <held entry ID>' appended to its field map, and counts
-- it (docs/contract.md, "Redelivered tasks").

local XMC_REDELIVERY_FIELD = 'xmc-redelivery'

-- Held entries counted at most by xmc_count_through (a count past it is reported as capped).
local XMC_HELD_AGAIN_CAP = 1000

-- -1, 0 or 1 as canonical decimal string a is below, equal to or above b.
local function xmc_decimal_cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end

-- -1, 0 or 1 as stream entry ID a is below, equal to or above b ('<ms>-<seq>', canonical).
local function xmc_id_cmp(a, b)
  local ams, aseq = string.match(a, '^(%d+)%-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)%-(%d+)$')
  local c = xmc_decimal_cmp(ams, bms)
  if c ~= 0 then return c end
  return xmc_decimal_cmp(aseq, bseq)
end

-- A canonical part of an entry ID: 1..20 digits, no leading zero, at most 2^64 - 1.
local function xmc_id_part(p)
  return p ~= nil and #p <= 20 and (p == '0' or string.sub(p, 1, 1) ~= '0')
         and xmc_decimal_cmp(p, '18446744073709551615') <= 0
end

-- True when v is a canonical stream entry ID '<ms>-<seq>'.
local function xmc_entry_id_ok(v)
  local ms, seq = string.match(v, '^(%d+)%-(%d+)$')
  return xmc_id_part(ms) and xmc_id_part(seq)
end

-- The `moved_through` argument: nil for '' or an absent argument, else a canonical entry ID
-- '<ms>-<seq>'; anything else raises an XMCARG error reply naming `what` (before any write).
local function xmc_arg_entry_id(what, v)
  if v == nil or v == '' then return nil end
  if not xmc_entry_id_ok(v) then
    error({err = 'XMCARG ' .. what .. ' must be a stream entry ID <ms>-<seq> or empty, got '
                 .. string.format('%q', string.sub(v, 1, 48))})
  end
  return v
end

-- Entries of stream `key` with IDs at or below `through` (nil: none), counted up to
-- XMC_HELD_AGAIN_CAP: {count, capped}. Reads pages of at most 100 entries (O(count)).
local function xmc_count_through(key, through)
  if not through then return 0, false end
  local n, start = 0, '-'
  while n <= XMC_HELD_AGAIN_CAP do
    local page = redis.call('XRANGE', key, start, through, 'COUNT', math.min(100, XMC_HELD_AGAIN_CAP + 1 - n))
    n = n + #page
    if #page == 0 or n > XMC_HELD_AGAIN_CAP then break end
    start = '(' .. page[#page][1]
  end
  if n > XMC_HELD_AGAIN_CAP then return XMC_HELD_AGAIN_CAP, true end
  return n, false
end
