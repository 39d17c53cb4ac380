-- Backlog of one consumer group (docs/contract.md, "Backlog"). This file is a fragment: scripts.py
-- prepends it to every script that measures the backlog, so the rule lives in one place.
--
-- backlog = pending (the group's PEL size, from XINFO GROUPS)
--         + entries whose ID is greater than the group's last-delivered-id (XRANGE, exclusive start)
-- The XRANGE is capped: skipped when pending alone reaches the threshold, else it reads at most
-- threshold - pending + 1 entries, so the cost is O(threshold) whatever the stream's length; and it
-- reads at most about `budget` bytes (xmc_read), so large entries cannot block Redis for long: an
-- undelivered part larger than the budget counts as a full backlog (`bytes_capped`, headroom 0).
-- XINFO's own `lag` is returned for logging only: on Redis 7.0 it is NULL or wrong after XDEL,
-- XTRIM, XGROUP SETID and for groups created at `$`.
--
-- The throttle rule lives here, once: `headroom` = threshold - backlog, at least 0 (0 when the
-- count stopped at the byte budget); the replay waits when it is 0 (backlog >= threshold) and a
-- publish moves at most min(batch, headroom) entries.
--
-- Returns a table: status ('ok' | 'no_stream' | 'no_group'), pending, lag, capped (bool), headroom,
-- bytes_capped (bool), lag_bytes (bytes read counting the lag), last_delivered_id, xinfo_lag
-- (number or false). A key of another type raises WRONGTYPE.
local XMC_MAX_ID = '18446744073709551615-18446744073709551615'

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

local function xmc_backlog(stream, group, threshold, budget)
  if redis.call('EXISTS', stream) == 0 then
    return {status = 'no_stream', pending = 0, lag = 0, capped = false, headroom = threshold,
            bytes_capped = false, lag_bytes = 0, last_delivered_id = '', xinfo_lag = false}
  end
  local groups = redis.call('XINFO', 'GROUPS', stream)
  for _, g in ipairs(groups) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    if f['name'] == group then
      local pending = tonumber(f['pending'])
      local last = f['last-delivered-id']
      local lag, lag_bytes, capped, bytes_capped = 0, 0, false, false
      if pending >= threshold then
        capped = true
      elseif last ~= XMC_MAX_ID then
        -- '(' makes the start exclusive; at the maximum ID that is an error, and nothing can follow it
        local k = threshold - pending + 1
        lag, lag_bytes, bytes_capped = xmc_read(stream, '(' .. last, k, budget, xmc_skip)
        capped = lag >= k or bytes_capped
      end
      local headroom = math.max(0, threshold - (pending + lag))
      if bytes_capped then headroom = 0 end
      return {status = 'ok', pending = pending, lag = lag, capped = capped, headroom = headroom,
              bytes_capped = bytes_capped, lag_bytes = lag_bytes, last_delivered_id = last,
              xinfo_lag = f['lag'] or false}
    end
  end
  return {status = 'no_group', pending = 0, lag = 0, capped = false, headroom = threshold,
          bytes_capped = false, lag_bytes = 0, last_delivered_id = '', xinfo_lag = false}
end
