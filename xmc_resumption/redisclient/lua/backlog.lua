-- Backlog of the consumer groups of a stream (docs/contract.md, "Backlog"; docs/memory.md). This
-- file is a fragment: scripts.py prepends it to every script that measures the backlog, so the rule
-- lives in one place.
--
-- backlog(g) = pending (the group's PEL size, from XINFO GROUPS)
--            + entries whose ID is greater than the group's last-delivered-id (XRANGE, exclusive start)
-- The XRANGE is capped: skipped when pending alone reaches the threshold, else it reads at most
-- threshold - pending + 1 entries, so the cost is O(threshold) whatever the stream's length; and it
-- reads at most about `budget` bytes (xmc_read), so large entries cannot block Redis for long: an
-- undelivered part larger than the budget counts as a full backlog (`bytes_capped`, headroom 0).
-- XINFO's own `lag` is returned for logging only: on Redis 7.0 it is NULL or wrong after XDEL,
-- XTRIM, XGROUP SETID and for groups created at `$`.
--
-- Every group (docs/memory.md): the replay is bounded by the largest backlog among the groups it
-- measures: every group of the stream (groups spec '*'), or the groups it names. The group with the
-- largest backlog is the `limiting_group` (the first measured on a tie; the required group is
-- measured first). Counting stops early: once one group's backlog reaches the threshold, the lag of
-- the groups after it is not counted (`counted` false), since the headroom is 0 whatever they hold.
-- At most XMC_MAX_GROUPS groups are measured; a stream with more refuses (name them instead).
--
-- Missing stream or required group (the consumer group, or every named one), by policy:
--   wait:  headroom 0 (nothing moves until it exists);
--   zero:  the missing group's backlog is the stream's own entries, counted from its start with the
--          same caps, so at most `threshold` entries go into a stream no group reads;
--   error: headroom 0, and the caller refuses (MissingConsumerGroupError / status 'no_group').
--
-- The throttle rule lives here, once: `headroom` = threshold - the largest backlog, at least 0 (0 when
-- a count stopped at the byte budget); the replay waits when it is 0 (backlog >= threshold) and a
-- publish moves at most min(batch, headroom) entries.
--
-- xmc_backlog returns a table: status ('ok' | 'no_stream' | 'no_group'), then the limiting group's
-- pending, lag, capped (bool), bytes_capped (bool), lag_bytes (bytes read counting its lag),
-- last_delivered_id and xinfo_lag (number or false); headroom; limiting_group; missing_group (the
-- first required group not found, '' when none); groups (each measured group: name, pending, lag,
-- capped, bytes_capped, counted, missing). A key of another type raises WRONGTYPE.
local XMC_MAX_ID = '18446744073709551615-18446744073709551615'
local XMC_MAX_GROUPS = 64
local XMC_MAX_THRESHOLD = 1000000
local XMC_MAX_BUDGET = 512 * 1024 * 1024
local XMC_POLICIES = {wait = true, zero = true, error = true}

-- Error replies for a bad argument, raised before any write: 'XMCARG <what> ...'.
local function xmc_arg_error(what, v)
  error({err = 'XMCARG ' .. what .. ', got ' .. string.format('%q', string.sub(tostring(v), 1, 40))})
end

-- ARGV value `v` as an integer lo..hi, else an XMCARG error naming `what`.
local function xmc_arg_int(what, v, lo, hi)
  local n = type(v) == 'string' and string.match(v, '^%d+$') and tonumber(v)
  if not n or n < lo or n > hi then
    xmc_arg_error(what .. ' must be an integer ' .. lo .. '..' .. hi, v)
  end
  return n
end

-- ARGV value `v` as a name (1..200 of letters, digits and . _ : / @ + = -: keys.py's rule).
local function xmc_arg_name(what, v)
  if type(v) ~= 'string' or #v < 1 or #v > 200 or string.find(v, '[^%w%._:/@%+=%-]') then
    xmc_arg_error(what .. ' must be 1..200 of letters, digits and . _ : / @ + = -', v)
  end
  return v
end

-- The backlog arguments, checked: the required group, the missing-group policy, the groups spec
-- ('*': every group of the stream; '': the required group alone, any name Redis accepts, as found in
-- XINFO GROUPS; else names separated by single spaces, the required group among them, at most
-- XMC_MAX_GROUPS, no repeats), the threshold (entries) and the byte budget. Out of the spec '' the
-- required group follows keys.py's name rule.
-- Returns {group, policy, names (nil for every group), threshold, budget}.
local function xmc_backlog_args(group, policy, spec, threshold, budget)
  local a = {threshold = xmc_arg_int('threshold', threshold, 1, XMC_MAX_THRESHOLD),
             budget = xmc_arg_int('byte budget', budget, 1, XMC_MAX_BUDGET)}
  if not XMC_POLICIES[policy] then xmc_arg_error('missing-group policy must be wait, zero or error', policy) end
  a.policy = policy
  if spec == '' then
    if type(group) ~= 'string' then xmc_arg_error('consumer group must be a string', group) end
    a.group, a.names = group, {group}
    return a
  end
  a.group = xmc_arg_name('consumer group', group)
  if spec == '*' then return a end
  if type(spec) ~= 'string' then xmc_arg_error('groups must be * or names separated by spaces', spec) end
  local names, seen, required = {}, {}, false
  for name in string.gmatch(spec, '[^ ]+') do
    xmc_arg_name('consumer group in groups', name)
    if seen[name] then xmc_arg_error('groups names a group twice', name) end
    seen[name] = true
    required = required or name == group
    names[#names + 1] = name
  end
  if #names == 0 or #names > XMC_MAX_GROUPS or string.find(spec, '  ') or string.find(spec, '^ ') then
    xmc_arg_error('groups must name 1..' .. XMC_MAX_GROUPS .. ' groups separated by single spaces', spec)
  end
  if not required then xmc_arg_error('groups must include the consumer group ' .. group, spec) end
  a.names = names
  return a
end

-- Bytes of an entry as XRANGE returns it: its ID, field names and values.
local function xmc_entry_bytes(e)
  local n = #e[1]
  for _, v in ipairs(e[2]) do n = n + #v end
  return n
end

-- Read the entries of stream `key` from `start` (an XRANGE start: '-' or '(' .. ID), oldest
-- first, calling visit(entry) on each, until `limit` entries are read, or about `budget` bytes
-- (at least one entry), or the stream ends. Chunks grow from 1 entry, at most doubling, and are
-- sized by the largest entry so far, so a read of like-sized entries passes the budget by about
-- one entry; after a run of small entries, a chunk of larger ones can pass it by more (bounded by
-- the chunk: at most twice the entries read before it).
-- Returns: entries read, bytes read, true when it stopped at the budget with entries left.
local function xmc_read(key, start, limit, budget, visit)
  local count, bytes, chunk, largest = 0, 0, 1, 1
  while count < limit do
    local want = math.min(chunk, limit - count)
    local got = redis.call('XRANGE', key, start, '+', 'COUNT', want)
    for _, e in ipairs(got) do
      local size = xmc_entry_bytes(e)
      count = count + 1
      bytes = bytes + size
      largest = math.max(largest, size)
      start = '(' .. e[1]
      visit(e)
    end
    if #got < want then
      return count, bytes, false
    end
    if bytes >= budget then
      return count, bytes, count < limit
    end
    chunk = math.max(1, math.min(chunk * 2, math.floor((budget - bytes) / largest)))
  end
  return count, bytes, false
end

local function xmc_skip() end

-- One group's reading before its lag is counted: XINFO GROUPS entry `f` (field -> value).
local function xmc_group_of(f, threshold)
  local pending = tonumber(f['pending'])
  return {name = f['name'], pending = pending, lag = 0, lag_bytes = 0, capped = pending >= threshold,
          bytes_capped = false, counted = pending >= threshold, missing = false,
          last_delivered_id = f['last-delivered-id'], xinfo_lag = f['lag'] or false}
end

-- Count group g's lag (entries after its last-delivered-id), capped at threshold - pending + 1
-- entries and the byte budget; `from` overrides the start ('-': a missing group, the whole stream).
local function xmc_count_lag(stream, g, threshold, budget, from)
  g.counted = true
  if g.capped or g.last_delivered_id == XMC_MAX_ID then return end
  -- '(' makes the start exclusive; at the maximum ID that is an error, and nothing can follow it
  local k = threshold - g.pending + 1
  g.lag, g.lag_bytes, g.bytes_capped = xmc_read(stream, from or ('(' .. g.last_delivered_id), k, budget, xmc_skip)
  g.capped = g.lag >= k or g.bytes_capped
end

local function xmc_full(g, threshold)
  return g.bytes_capped or g.pending + g.lag >= threshold
end

-- The reading of stream `stream` for checked arguments `a` (xmc_backlog_args): see the header.
local function xmc_backlog(stream, a)
  local threshold, budget = a.threshold, a.budget
  local required = a.names or {a.group}
  local measured, status, missing = {}, 'ok', ''
  if redis.call('EXISTS', stream) == 0 then
    status, missing = 'no_stream', required[1]
    for _, name in ipairs(required) do
      measured[#measured + 1] = {name = name, pending = 0, lag = 0, lag_bytes = 0, capped = false, bytes_capped = false,
                                 counted = true, missing = true, last_delivered_id = '', xinfo_lag = false}
    end
  else
    local found, order = {}, {}
    for _, raw in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
      local f = {}
      for i = 1, #raw, 2 do f[raw[i]] = raw[i + 1] end
      found[f['name']] = f
      order[#order + 1] = f['name']
    end
    local names = a.names
    if not names then
      if #order > XMC_MAX_GROUPS then
        error({err = 'XMCGROUPS stream ' .. stream .. ' has ' .. #order .. ' consumer groups; the replay measures at most '
                     .. XMC_MAX_GROUPS .. ': name the groups that bound it (consumer_groups)'})
      end
      names = {a.group}
      for _, name in ipairs(order) do
        if name ~= a.group then names[#names + 1] = name end
      end
    end
    for _, name in ipairs(names) do
      if found[name] then
        measured[#measured + 1] = xmc_group_of(found[name], threshold)
      else
        if missing == '' then status, missing = 'no_group', name end
        measured[#measured + 1] = {name = name, pending = 0, lag = 0, lag_bytes = 0, capped = false, bytes_capped = false,
                                   counted = false, missing = true, last_delivered_id = '', xinfo_lag = false}
      end
    end
    -- count lags only while the headroom may be left: a group whose pending alone fills it ends the count
    local full = status ~= 'ok' and a.policy ~= 'zero'
    for _, g in ipairs(measured) do full = full or g.capped end
    local stream_count = nil
    for _, g in ipairs(measured) do
      if full then
        -- not counted: the headroom is 0 already (a full group, or a missing one under wait or error)
      elseif g.missing then
        -- zero: the stream's entries are this group's backlog (one count, shared by every missing group)
        if not stream_count then
          xmc_count_lag(stream, g, threshold, budget, '-')
          stream_count = g
        else
          g.counted, g.lag, g.lag_bytes, g.capped, g.bytes_capped =
            true, stream_count.lag, stream_count.lag_bytes, stream_count.capped, stream_count.bytes_capped
        end
        full = xmc_full(g, threshold)
      else
        xmc_count_lag(stream, g, threshold, budget)
        full = xmc_full(g, threshold)
      end
    end
  end
  local limit = measured[1]
  for _, g in ipairs(measured) do
    if (g.bytes_capped and not limit.bytes_capped) or (g.pending + g.lag > limit.pending + limit.lag and not limit.bytes_capped) then
      limit = g
    end
  end
  local headroom = math.max(0, threshold - (limit.pending + limit.lag))
  if limit.bytes_capped or (status ~= 'ok' and a.policy ~= 'zero') then headroom = 0 end
  local groups = {}
  for i, g in ipairs(measured) do
    groups[i] = {name = g.name, pending = g.pending, lag = g.lag, capped = g.capped, bytes_capped = g.bytes_capped,
                 counted = g.counted, missing = g.missing}
  end
  return {status = status, pending = limit.pending, lag = limit.lag, capped = limit.capped, headroom = headroom,
          bytes_capped = limit.bytes_capped, lag_bytes = limit.lag_bytes, last_delivered_id = limit.last_delivered_id,
          xinfo_lag = limit.xinfo_lag, limiting_group = limit.name, missing_group = missing, groups = groups}
end
