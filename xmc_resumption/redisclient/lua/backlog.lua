-- Backlog of the consumer groups of a stream (docs/contract.md, "Backlog";
-- docs/memory.md, "How the lag is measured"). This file is a fragment: scripts.py prepends it to every
-- script that measures the backlog, so the rule lives in one place.
--
-- backlog(g) = pending (the group's PEL size, from XINFO GROUPS)
--            + lag: the entries that exist with an ID greater than the group's last-delivered-id L
--
-- The lag is known in O(1) from Redis's own counters where they are exact, else counted; the cost of
-- one reading does not grow with the threshold (docs/memory.md has the proofs and the figures):
--   caught_up: the stream is empty or L >= last-generated-id: lag 0;
--   behind:    L < the first entry's ID (recorded-first-entry-id): every entry is after L, lag = XLEN;
--   recorded:  a record of the group (the companion hash `{S}:backlog`, field = the group's name) says
--              its entries-read was exact at an ID L0 <= L, and nothing has been deleted or trimmed
--              from the stream since (entries-added - XLEN unchanged): entries-read is exact still,
--              lag = entries-added - entries-read;
--   counted:   else an XRANGE after L, at most threshold - pending + 1 entries and what is left of the
--              script's count budget (XMC_COUNT_ENTRIES entries and about XMC_COUNT_BYTES bytes, or the
--              byte budget if smaller, over every group; xmc_read); a count that ends exact writes a new
--              record when entries-read agrees;
--   bound:     a count cut short by the count or byte budget: the least of two upper bounds, XLEN and
--              entries-added - entries-read (Redis 7.0 lets entries-read fall behind, never run ahead,
--              when a group reads past a deleted or trimmed entry; NULL gives no bound).
-- XINFO's own `lag` field is returned for logging only: on Redis 7.0 it is NULL or wrong after XDEL,
-- XTRIM, XGROUP SETID and for groups created at `$`.
--
-- Which groups bound the replay (docs/memory.md): the groups it names (consumer_groups), each of which
-- must exist; else (groups spec '*') the consumer group and every group of the stream that has a
-- consumer. A group with no consumer at all is measured and reported (`bounds` false, in the reading's
-- `unattended`) but does not hold the replay: libraries leave such groups behind (taskiq-redis creates
-- its `taskiq` group at broker start-up). The group with the largest backlog among those that bound is
-- the `limiting_group` (the first measured on a tie; the required group is measured first). Counting
-- stops early: once one bounding group is full, later groups are not counted (`counted` false) unless
-- their lag is known in O(1). Every group of the stream is measured, however many (each costs O(1)
-- besides its count, and counts share one budget).
--
-- Missing stream or required group (the consumer group, or every named one), by policy:
--   wait:  headroom 0 (nothing moves until it exists);
--   zero:  the missing group's backlog is the stream's own entries (XLEN), so at most `threshold`
--          entries go into a stream no group reads;
--   error: headroom 0, and the caller refuses (MissingConsumerGroupError / status 'no_group').
--
-- The throttle rule lives here, once: `headroom` = threshold - the largest backlog, at least 0; the
-- replay waits when it is 0 (backlog >= threshold) and a
-- publish moves at most min(batch, headroom) entries.
--
-- xmc_backlog returns a table: status ('ok' | 'no_stream' | 'no_group'), then the limiting group's
-- pending, lag, capped (bool: a lower bound at or past the threshold), bytes_capped (bool), lag_bytes
-- (bytes read counting its lag), last_delivered_id, xinfo_lag (number or false), lag_source (above) and
-- exact (bool); headroom; limiting_group; missing_group (the first required group not found, '' when
-- none); groups (each measured group: name, pending, lag, capped, bytes_capped, counted, missing,
-- consumers, bounds, lag_source, exact); unattended (the groups that do not bound: name, pending, lag,
-- exact); limiting_idle_ms (with headroom 0, the least idle time of the limiting group's consumers,
-- XINFO CONSUMERS; -1: not read, or no consumer); records (the record fields to write, for
-- xmc_backlog_save). A key of another type raises WRONGTYPE.
local XMC_MAX_ID = '18446744073709551615-18446744073709551615'
local XMC_MAX_GROUPS = 64
-- entries one script counts at most, over every group (about 3 ms of Redis at 10-byte tasks; docs/memory.md)
local XMC_COUNT_ENTRIES = 1000
-- bytes of entries one script counts at most, over every group (about 1 ms of Redis at 4.5 ms per MiB)
local XMC_COUNT_BYTES = 256 * 1024
-- counters past this are not exact in a Lua number: no O(1) rule uses them
local XMC_EXACT = 2 ^ 53
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

-- Compare two decimal strings without leading zeros (any length: IDs pass 2^53): -1, 0 or 1.
local function xmc_dec_cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end

-- Compare two entry IDs 'ms-seq' as Redis does: -1, 0 or 1.
local function xmc_id_cmp(a, b)
  local am, as = string.match(a, '^(%d+)%-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)%-(%d+)$')
  local c = xmc_dec_cmp(am, bm)
  if c ~= 0 then return c end
  return xmc_dec_cmp(as, bs)
end

-- A flat XINFO reply {k1, v1, k2, v2, ...} as a table.
local function xmc_fields(raw)
  local f = {}
  for i = 1, #raw, 2 do f[raw[i]] = raw[i + 1] end
  return f
end

-- An exact counter of Redis, or nil (NULL, or past what a Lua number holds exactly).
local function xmc_counter(v)
  local n = tonumber(v)
  if n and n >= 0 and n < XMC_EXACT then return n end
  return nil
end

-- The stream's own counters (XINFO STREAM, Redis 7.0): length, last-generated-id, first (the first
-- entry's ID, recorded-first-entry-id), max_deleted, added (entries-added) and removed (entries deleted
-- or trimmed since the stream was made: entries-added - length); added and removed nil when not exact.
local function xmc_stream_facts(stream)
  local f = xmc_fields(redis.call('XINFO', 'STREAM', stream))
  local s = {length = tonumber(f['length']), last_id = f['last-generated-id'], first = f['recorded-first-entry-id'],
             max_deleted = f['max-deleted-entry-id'], added = xmc_counter(f['entries-added'])}
  if s.added then s.removed = s.added - s.length end
  return s
end

-- A group's record ('L entries-read entries-added removed'), parsed; nil when absent or damaged (a
-- record is a cache: one that cannot be read is ignored, and written again when the lag is exact).
local function xmc_record_of(v)
  if type(v) ~= 'string' then return nil end
  local id, read, added, removed = string.match(v, '^(%d+%-%d+) (%d+) (%d+) (%d+)$')
  if not id then return nil end
  return {id = id, read = xmc_counter(read), added = xmc_counter(added), removed = xmc_counter(removed)}
end

-- True when record `rec` of group g still holds: entries-read was exact at rec.id, with nothing after
-- rec.id removed then; since, nothing was removed from the stream (entries-added - XLEN unchanged), the
-- group did not move back (last-delivered-id and entries-read not below the record's) and the stream was
-- not made anew (entries-added not below the record's). Every read since went one entry at a time over
-- entries that all exist, so entries-read is exact still.
local function xmc_record_holds(s, g, rec)
  local read = g.entries_read
  return rec.read and rec.added and rec.removed and s.added and read and read >= rec.read and read <= s.added
         and s.added >= rec.added and s.removed == rec.removed and xmc_id_cmp(g.last_delivered_id, rec.id) >= 0
end

-- The lag of group g known in O(1) (see the header), or nil. Sets g.lag, g.lag_source, g.exact; g.record
-- when the group's entries-read is exact now (a record to write), g.drop when its record no longer holds.
local function xmc_lag_o1(s, g, rec)
  local L, read = g.last_delivered_id, g.entries_read
  local holds = rec and xmc_record_holds(s, g, rec)
  g.drop = rec and not holds
  if s.length == 0 or xmc_id_cmp(L, s.last_id) >= 0 then
    g.lag, g.lag_source = 0, 'caught_up'
    -- every entry ever added is at or before L: entries-read is exact when it equals entries-added
    if s.added and xmc_id_cmp(L, s.last_id) >= 0 and read == s.added then g.record = true end
  elseif xmc_id_cmp(L, s.first) < 0 then
    g.lag, g.lag_source = s.length, 'behind'
  elseif holds then
    g.lag, g.lag_source, g.record = s.added - read, 'recorded', true
  else
    return nil
  end
  g.exact, g.counted = true, true
  return g.lag
end

-- Count group g's lag after its last-delivered-id: at most `cap` entries (threshold - pending + 1),
-- `left` entries of the count budget and about `budget` bytes. Returns the entries and bytes it read.
local function xmc_count(stream, s, g, cap, left, budget)
  g.counted = true
  local k = math.min(cap, left)
  local n, bytes, cut = xmc_read(stream, '(' .. g.last_delivered_id, k, budget, xmc_skip)
  g.lag, g.lag_bytes, g.bytes_capped = n, bytes, cut
  if n < k and not cut then
    g.lag_source, g.exact = 'counted', true
    -- no entry after L was removed (the first entry and every deletion are at or before L): entries-read
    -- is exact when it equals entries-added - lag
    if s.added and g.entries_read == s.added - n and xmc_id_cmp(s.max_deleted, g.last_delivered_id) <= 0 then
      g.record = true
    end
  elseif n >= cap then
    g.lag_source, g.capped = 'counted', true  -- at or past the threshold: a lower bound
  else
    -- the bound covers what the count could not read (so the byte budget holds nothing back)
    local bound = s.length
    if s.added and g.entries_read and s.added - g.entries_read < bound then bound = s.added - g.entries_read end
    g.lag, g.lag_source, g.bytes_capped = math.max(bound, n), 'bound', false
  end
  return n, bytes
end

-- A group as XINFO GROUPS reports it, before its lag is known.
local function xmc_group_of(f)
  return {name = f['name'], pending = tonumber(f['pending']), consumers = tonumber(f['consumers']), lag = 0,
          lag_bytes = 0, capped = false, bytes_capped = false, counted = false, missing = false, bounds = true,
          exact = false, lag_source = 'not_counted', last_delivered_id = f['last-delivered-id'],
          entries_read = xmc_counter(f['entries-read']), xinfo_lag = f['lag'] or false}
end

local function xmc_missing(name)
  return {name = name, pending = 0, consumers = 0, lag = 0, lag_bytes = 0, capped = false, bytes_capped = false,
          counted = false, missing = true, bounds = true, exact = false, lag_source = 'missing',
          last_delivered_id = '', xinfo_lag = false}
end

-- True when group g's backlog leaves no headroom.
local function xmc_full(g, threshold)
  return g.pending + g.lag >= threshold
end

-- The reading of stream `stream` for checked arguments `a` (xmc_backlog_args), with the records of
-- hash `record_key` (nil: none read or written): see the header.
local function xmc_backlog(stream, a, record_key)
  local threshold, budget = a.threshold, a.budget
  local required = a.names or {a.group}
  local measured, status, missing = {}, 'ok', ''
  local s = nil
  if redis.call('EXISTS', stream) == 0 then
    status, missing = 'no_stream', required[1]
    for _, name in ipairs(required) do
      local g = xmc_missing(name)
      g.counted, g.exact = true, true  -- no stream: no entry
      measured[#measured + 1] = g
    end
  else
    local found, order = {}, {}
    for _, raw in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
      local f = xmc_fields(raw)
      found[f['name']] = f
      order[#order + 1] = f['name']
    end
    s = xmc_stream_facts(stream)
    local names = a.names
    if not names then
      names = {a.group}
      for _, name in ipairs(order) do
        if name ~= a.group then names[#names + 1] = name end
      end
    end
    for _, name in ipairs(names) do
      local g
      if found[name] then
        g = xmc_group_of(found[name])
        -- every group but the consumer group bounds when named, or when it has a consumer
        g.bounds = a.names ~= nil or name == a.group or g.consumers > 0
      else
        if missing == '' then status, missing = 'no_group', name end
        g = xmc_missing(name)
      end
      measured[#measured + 1] = g
    end
    local recs = {}
    if record_key then
      local ask = {}
      for _, g in ipairs(measured) do
        if not g.missing then ask[#ask + 1] = g.name end
      end
      if #ask > 0 then
        local got = redis.call('HMGET', record_key, unpack(ask))
        for i, name in ipairs(ask) do recs[name] = xmc_record_of(got[i]) end
      end
    end
    -- O(1) first, for every group; then counts while the headroom may be left, bounding groups first
    local full = status ~= 'ok' and a.policy ~= 'zero'
    for _, g in ipairs(measured) do
      if g.missing then
        if a.policy == 'zero' then
          -- zero: the stream's entries are this group's backlog
          g.lag, g.counted, g.exact, g.lag_source = s.length, true, true, 'stream'
        end
      else
        xmc_lag_o1(s, g, recs[g.name])
      end
      if g.bounds and (g.counted or g.pending >= threshold) and xmc_full(g, threshold) then full = true end
    end
    local left, left_bytes = XMC_COUNT_ENTRIES, math.min(budget, XMC_COUNT_BYTES)
    for pass = 1, 2 do
      for _, g in ipairs(measured) do
        if not g.counted and not g.missing and (pass == 1) == g.bounds then
          if g.pending >= threshold then
            g.capped = true  -- pending alone fills it: no count needed
          elseif not full and (g.bounds or (left > 0 and left_bytes > 0)) then
            -- a bounding group past the count budget takes its upper bound without a count
            local n, bytes = xmc_count(stream, s, g, threshold - g.pending + 1, left_bytes > 0 and left or 0,
                                       math.max(1, left_bytes))
            left, left_bytes = left - n, left_bytes - bytes
            if g.bounds and xmc_full(g, threshold) then full = true end
          end
        end
      end
    end
  end
  -- the limiting group: the largest backlog (the first on a tie)
  local limit = nil
  for _, g in ipairs(measured) do
    if g.bounds and (limit == nil or g.pending + g.lag > limit.pending + limit.lag) then limit = g end
  end
  local headroom = math.max(0, threshold - (limit.pending + limit.lag))
  if status ~= 'ok' and a.policy ~= 'zero' then headroom = 0 end
  -- with no headroom: how long the limiting group's consumers have been idle (a group that does not drain)
  local idle = -1
  if headroom == 0 and status == 'ok' and limit.consumers > 0 then
    for _, raw in ipairs(redis.call('XINFO', 'CONSUMERS', stream, limit.name)) do
      local c = tonumber(xmc_fields(raw)['idle'])
      if c and (idle < 0 or c < idle) then idle = c end
    end
  end
  local groups, unattended, records, drops = {}, {}, {}, {}
  for i, g in ipairs(measured) do
    groups[i] = {name = g.name, pending = g.pending, lag = g.lag, capped = g.capped, bytes_capped = g.bytes_capped,
                 counted = g.counted, missing = g.missing, consumers = g.consumers, bounds = g.bounds,
                 lag_source = g.lag_source, exact = g.exact}
    if not g.bounds then
      unattended[#unattended + 1] = {name = g.name, pending = g.pending, lag = g.lag, exact = g.exact}
    end
    if g.drop and not g.record then drops[#drops + 1] = g.name end
    if g.record then
      records[#records + 1] = g.name
      records[#records + 1] = g.last_delivered_id .. ' ' .. string.format('%d', g.entries_read) .. ' '
                              .. string.format('%d', s.added) .. ' ' .. string.format('%d', s.removed)
    end
  end
  return {status = status, pending = limit.pending, lag = limit.lag, capped = limit.capped, headroom = headroom,
          bytes_capped = limit.bytes_capped, lag_bytes = limit.lag_bytes, last_delivered_id = limit.last_delivered_id,
          xinfo_lag = limit.xinfo_lag, lag_source = limit.lag_source, exact = limit.exact,
          limiting_group = limit.name, missing_group = missing, groups = groups, unattended = unattended,
          limiting_idle_ms = idle, records = records, drops = drops}
end

-- Write the records a reading found (xmc_backlog's `records`) into hash `record_key` (nil: none kept).
-- Call it after every check of the calling script: it writes.
local function xmc_backlog_save(record_key, b)
  if record_key and b.records and #b.records > 0 then
    redis.call('HSET', record_key, unpack(b.records))
  end
  if record_key and b.drops and #b.drops > 0 then
    redis.call('HDEL', record_key, unpack(b.drops))
  end
end
