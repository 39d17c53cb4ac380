-- Backlog of one consumer group (DESIGN.md section 4). This file is a fragment: scripts.py
-- prepends it to every script that measures the backlog, so the rule lives in one place.
--
-- backlog = pending (the group's PEL size, from XINFO GROUPS)
--         + entries whose ID is greater than the group's last-delivered-id (XRANGE, exclusive start)
-- The XRANGE is capped: skipped when pending alone reaches the threshold, else it reads at most
-- threshold - pending + 1 entries, so the cost is O(threshold) whatever the stream's length.
-- XINFO's own `lag` is returned for logging only: on Redis 7.0 it is NULL or wrong after XDEL,
-- XTRIM, XGROUP SETID and for groups created at `$`.
--
-- The throttle rule lives here, once: `headroom` = threshold - backlog, at least 0; the replay waits
-- when it is 0 (backlog >= threshold) and a publish moves at most min(batch, headroom) entries.
--
-- Returns a table: status ('ok' | 'no_stream' | 'no_group'), pending, lag, capped (bool), headroom,
-- last_delivered_id, xinfo_lag (number or false). A key of another type raises WRONGTYPE.
local XMC_MAX_ID = '18446744073709551615-18446744073709551615'

local function xmc_backlog(stream, group, threshold)
  if redis.call('EXISTS', stream) == 0 then
    return {status = 'no_stream', pending = 0, lag = 0, capped = false, headroom = threshold,
            last_delivered_id = '', xinfo_lag = false}
  end
  local groups = redis.call('XINFO', 'GROUPS', stream)
  for _, g in ipairs(groups) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    if f['name'] == group then
      local pending = tonumber(f['pending'])
      local last = f['last-delivered-id']
      local lag = 0
      local capped = false
      if pending >= threshold then
        capped = true
      elseif last ~= XMC_MAX_ID then
        -- '(' makes the start exclusive; at the maximum ID that is an error, and nothing can follow it
        local k = threshold - pending + 1
        lag = #redis.call('XRANGE', stream, '(' .. last, '+', 'COUNT', k)
        capped = lag >= k
      end
      return {status = 'ok', pending = pending, lag = lag, capped = capped,
              headroom = math.max(0, threshold - (pending + lag)), last_delivered_id = last,
              xinfo_lag = f['lag'] or false}
    end
  end
  return {status = 'no_group', pending = 0, lag = 0, capped = false, headroom = threshold,
          last_delivered_id = '', xinfo_lag = false}
end
