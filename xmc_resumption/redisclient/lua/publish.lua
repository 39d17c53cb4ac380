-- The atomic publish (docs/contract.md, "The loop", step 2): move the oldest held tasks into the task stream.
-- KEYS[1] task stream, KEYS[2] held stream, KEYS[3] state, KEYS[4] fence counter, KEYS[5] claim hash,
-- KEYS[6] publish record (the idempotency record: token, seq, result, `moved`, the tasks this
--         token moved in all, the authority for the run's count, and `last_moved_id`, the latest
--         held entry ID this token moved; it does not lapse with the lease),
-- KEYS[7] the stream's weights hash, KEYS[8] its active replayers (fair.lua),
-- KEYS[9] the stream's rate cap `{S}:rate` (rate.lua): a token bucket shared by every replay of S,
-- KEYS[10] replay record (hash: `moved`, the tasks the resume in progress moved, whatever claim moved
--          them: the authority for a resumption's `replayed`; acquire.lua starts it, release.lua ends it),
-- KEYS[11] release log (tokens.lua's xmc_released); KEYS[10] and KEYS[11] may be left out (then the
--          claim's own count is the reply's `replayed`),
-- KEYS[12] the stream's backlog records `{S}:backlog` (backlog.lua; may be left out, with KEYS[10] and
--          KEYS[11] given: then no record is read or written)
-- ARGV[1] token, ARGV[2] seq (the caller's turn number, strictly increasing per token),
-- ARGV[3] batch size, ARGV[4] threshold, ARGV[5] consumer group (it must exist),
-- ARGV[6] missing-group policy ('wait' | 'zero' | 'error'), ARGV[7] lease in milliseconds, ARGV[8] owner,
-- ARGV[9] byte budget: the backlog count and the move each read about this many bytes at most,
-- ARGV[10] memory fraction: '' (off) or 0 < f <= 1: nothing moves while used_memory >= f x maxmemory,
-- ARGV[11] fair share ('1' on, '0' off), ARGV[12] experiment ID,
-- ARGV[13] groups whose backlog bounds the move ('*': ARGV[5] and every group with a consumer; else names
--          separated by single spaces, ARGV[5] among them; backlog.lua)
-- ARGV[14] moved_through (optional; '' for none): the last held entry ID the caller was told was
--          moved (its replies' `last_moved_id`, by this resumption or one before it that it knows
--          of; redelivery.lua),
-- ARGV[15] replayed (optional; '' for none): the resume's count of tasks moved the caller was last
--          told (the replies' `replayed`), 0..2^53
-- Every argument is checked before the first write (an XMCARG error reply: nothing written).
--
-- In one step, so that a retried or zombie call can never duplicate, lose or overshoot:
--   fencing: a token other than the fence counter's moves nothing ('fenced'; 'fence_lost' when the
--            counter is below the token: Redis lost data, e.g. restarted without persistence);
--   idempotency: a repeated seq returns the recorded result (with `repeated` true), an older seq
--                moves nothing ('stale');
--   released: a token fenced by its own release (a re-executed turn of a run that already released
--             its claim) moves nothing ('released', with that release's outcome, replayed and remaining);
--   pause: a paused experiment moves nothing ('paused');
--   group: a missing stream or required group moves nothing under 'wait' ('waiting_for_group', nothing
--          written, unless nothing is held: then it completes) and 'error' ('no_group'); under 'zero'
--          the stream's entries count as its backlog;
--   bound: moves at most min(batch, headroom) entries, headroom = threshold - the largest backlog of
--          the groups from the shared backlog rule ('throttled' when that is 0); with the fair share on, headroom is the
--          caller's share of it (fair.lua), and the caller's lease among the replayers is renewed;
--   memory: a maxmemory-policy other than noeviction fails the call (XMCEVICTION, memory.lua); with
--           headroom left, Redis's used memory at or above the fraction of maxmemory moves nothing
--           ('memory'; no limit set: never);
--   rate: with a stream-wide cap set, moves at most the whole tokens its bucket holds
--         ('rate_limited' when that is 0 while there is headroom);
--   move: XADD to the task stream with the field map byte for byte, then XDEL from the held stream,
--         oldest first, stopping once the entries moved reach the byte budget (at least one moves),
--         and before an entry too large to pass to XADD from a script (`poison_id`: the caller sets
--         it aside into the experiment's dead-letter stream);
--   done: when the held stream is empty the experiment is running again ('completed');
--   behind: Redis behind what the caller was told (a crash failover lost writes, issue 23) is
--           said, never silent: a replay record below ARGV[15] is reported as `behind` (the moves
--           Redis lost by its count), and every task moved with a held entry ID at or below
--           ARGV[14] (one the caller was told was moved: Redis lost its move, and its first
--           delivery may have been read) is moved again marked with the field
--           `xmc-redelivery` = '<experiment ID> <held entry ID>' appended to its field map, and
--           counted in `redelivered` (redelivery.lua).
-- A repeated seq returns the recorded result and rewrites the fence counter with its own value, so
-- that a WAIT after this call covers the publish it reports (tokens.lua's xmc_touch).
-- Tokens are decimal strings compared exactly (tokens.lua).
-- Returns JSON {status, moved, moved_bytes, poison_id ('' or the entry that stopped the move),
-- total_moved (this token's tasks moved in all), replayed (the resume's tasks moved in all, whatever claim
-- moved them; absent when unknown), outcome (with 'released': the release's), repeated (only in a recorded
-- result returned again), backlog, remaining, pending, lag, capped, bytes_capped,
-- headroom, last_delivered_id, group_status, limiting_group, missing_group, last_seq, used_memory, maxmemory,
-- rate_limit, rate_limited, rate_wait_ms, redelivered, behind, last_moved_id, redelivered_total, and from the
-- reading lag_source, exact, unattended, limiting_idle_ms (backlog.lua; absent when the script refused before
-- measuring)}: backlog (of the limiting group) and headroom as measured before the
-- move; last_seq is the recorded seq, with 'stale';
-- used_memory and maxmemory (bytes) as read before the move (0 when the script refused before reading them);
-- rate_limit (the stream's cap, tasks/s; 0: none), rate_limited (the cap cut this move short), rate_wait_ms
-- (with rate_limited: ms until the bucket holds what the move wanted, at most its capacity);
-- redelivered: tasks of this move moved again, marked (at or below ARGV[14]); behind: ARGV[15] minus
-- the replay record's count before the move, when that is above 0 (else 0; with the token current);
-- last_moved_id: the latest held entry ID this token moved, by this call or an earlier one (the publish
-- record's; '' when it moved none, or the record is another token's), in every reply, so that a call
-- asked again after a lost reply still names what the lost one moved; redelivered_total: the
-- resume's tasks moved again in all (the replay record's `redelivered`; absent when its count is unknown).
-- the arguments, checked before anything is read or written
local token = ARGV[1]
if type(token) ~= 'string' or not string.match(token, '^%d+$') or #token > 19 then
  xmc_arg_error('token must be a decimal integer of 1..19 digits', token)
end
local seq = xmc_arg_int('seq', ARGV[2], 1, 2 ^ 53)
local batch = xmc_arg_int('batch size', ARGV[3], 1, 1000000)
local args = xmc_backlog_args(ARGV[5], ARGV[6], ARGV[13], ARGV[4], ARGV[9])
local threshold, budget = args.threshold, args.budget
xmc_arg_int('lease', ARGV[7], 1, XMC_MAX_LEASE_MS)
if type(ARGV[8]) ~= 'string' or ARGV[8] == '' or #ARGV[8] > 1000 then
  xmc_arg_error('owner must be 1..1000 bytes', ARGV[8])
end
local fraction = xmc_memory_fraction(ARGV[10])
if ARGV[11] ~= '0' and ARGV[11] ~= '1' then xmc_arg_error('fair share must be 0 or 1', ARGV[11]) end
xmc_arg_name('experiment ID', ARGV[12])
local moved_through = xmc_arg_entry_id('moved_through (ARGV[14])', ARGV[14])
local told = (ARGV[15] ~= nil and ARGV[15] ~= '') and xmc_arg_int('replayed (ARGV[15])', ARGV[15], 0, 2 ^ 53) or nil
-- field names and values of one entry that XADD can take from a script: Lua's unpack stops near
-- 8,000 values (LUAI_MAXCSTACK), so a longer entry is never passed to it
local XMC_MAX_VALUES = 7990
local poison_id = nil
local redelivered, behind = 0, 0
local memory = {used_memory = 0, maxmemory = 0}
local rate_cap = {limit = 0, cut = false, wait_ms = 0}

-- tasks this token has moved so far: the publish record's count (the authority for `replayed`).
-- A record of this token written before the count existed has none: then no count is kept (the
-- caller keeps its own) rather than one that starts at 0 in the middle of the resumption.
local own = redis.call('HGET', KEYS[6], 'token') == token
-- the latest held entry ID this token moved (an ID by the rule of redelivery.lua, checked before any write)
local last_moved_id = own and redis.call('HGET', KEYS[6], 'last_moved_id') or ''
if last_moved_id ~= '' and not xmc_entry_id_ok(last_moved_id) then
  error({err = 'XMCCORRUPT ' .. KEYS[6] .. ' field last_moved_id holds '
               .. string.format('%q', string.sub(last_moved_id, 1, 48)) .. ', not a stream entry ID'})
end
local recorded = own and redis.call('HGET', KEYS[6], 'moved')
local counting = (not own) or (recorded ~= false)
local total = tonumber(recorded or '0')
local lease_token = redis.call('HGET', KEYS[5], 'token')  -- read before any write
-- the resume's count (the replay record); without one (a resume begun before the record existed),
-- the claim's own count, if any
local resume = tonumber((KEYS[10] and redis.call('HGET', KEYS[10], 'moved')) or (counting and total) or nil)
-- the resume's tasks moved again so far (the replay record's `redelivered`), with its count only
local resume_redelivered = KEYS[10] and redis.call('HGET', KEYS[10], 'moved')
                           and tonumber(redis.call('HGET', KEYS[10], 'redelivered') or '0') or nil
local released = nil

local function reply(status, moved, b, remaining, last_seq, moved_bytes)
  return cjson.encode({status = status, moved = moved, moved_bytes = moved_bytes or 0,
                       poison_id = poison_id or '',
                       total_moved = counting and (total + moved) or nil,
                       replayed = released and released.replayed or (resume and (resume + moved)) or nil,
                       outcome = released and released.outcome or '', backlog = b.pending + b.lag, remaining = remaining,
                       pending = b.pending, lag = b.lag, capped = b.capped, bytes_capped = b.bytes_capped or false,
                       headroom = b.headroom, last_delivered_id = b.last_delivered_id or '',
                       group_status = b.status, limiting_group = b.limiting_group or '',
                       missing_group = b.missing_group or '', last_seq = last_seq or 0,
                       used_memory = memory.used_memory, maxmemory = memory.maxmemory,
                       rate_limit = rate_cap.limit, rate_limited = rate_cap.cut, rate_wait_ms = rate_cap.wait_ms,
                       redelivered = redelivered, behind = behind, last_moved_id = last_moved_id,
                       redelivered_total = resume_redelivered and (resume_redelivered + redelivered) or nil,
                       lag_source = b.lag_source, exact = b.exact, unattended = b.unattended,
                       limiting_idle_ms = b.limiting_idle_ms})
end
local none = {status = 'ok', pending = 0, lag = 0, capped = false, headroom = 0}

local fence = xmc_token_cmp(xmc_fence(KEYS[4]), token)
if fence ~= 0 then
  -- a newer token took over, or the counter went back below ours: Redis lost data (the record,
  -- if any, is another token's: no count to report)
  counting, resume, resume_redelivered = false, nil, nil
  released = fence > 0 and KEYS[11] and xmc_released(KEYS[11], token) or nil
  if released then
    return reply('released', 0, none, released.remaining)
  end
  return reply(fence > 0 and 'fenced' or 'fence_lost', 0, none, redis.call('XLEN', KEYS[2]))
end
if told and told > (resume or 0) then
  -- the caller was told more tasks moved than Redis counts now: Redis lost moves
  behind = told - (resume or 0)
end
if own then
  local last_seq = tonumber(redis.call('HGET', KEYS[6], 'seq') or '0')
  if seq == last_seq then
    -- the recorded result, marked: it moved nothing now (a metric counts only fresh moves)
    xmc_touch(KEYS[4])
    return '{"repeated":true,' .. string.sub(redis.call('HGET', KEYS[6], 'result'), 2)
  elseif seq < last_seq then
    return reply('stale', 0, none, redis.call('XLEN', KEYS[2]), last_seq)
  end
end
if redis.call('GET', KEYS[3]) == 'paused' then
  return reply('paused', 0, none, redis.call('XLEN', KEYS[2]))
end

local b = xmc_backlog(KEYS[1], args, KEYS[12])
if b.status ~= 'ok' and args.policy == 'error' then
  return reply('no_group', 0, b, redis.call('XLEN', KEYS[2]))
elseif b.status ~= 'ok' and args.policy == 'wait' and redis.call('XLEN', KEYS[2]) > 0 then
  -- (nothing held: nothing to wait for; the move below moves nothing and completes)
  return reply('waiting_for_group', 0, b, redis.call('XLEN', KEYS[2]))
end
-- fair share (fair.lua): the headroom this caller may take; reads only, validated before any write
local fair = ARGV[11] == '1' and xmc_fair_read(KEYS[7], KEYS[8], ARGV[12], ARGV[7]) or nil
if fair then b.headroom = xmc_fair_share(fair, b.headroom) end
-- fair share: end
local room = math.min(batch, b.headroom)
-- memory guard (memory.lua): reads only, before the first write -----------------------------------
memory = xmc_memory()
xmc_require_noeviction(memory)
local memory_full = xmc_memory_full(memory, fraction) and room > 0
if memory_full then room = 0 end
-- end of the memory guard ----------------------------------------------------------------------------
-- stream-wide rate cap (rate.lua): reads only, before the first write
local rate = xmc_rate_read(KEYS[9])
local wanted = room
if rate then
  rate_cap.limit = rate.limit
  if room > math.floor(rate.tokens) then
    rate_cap.cut = true
    room = math.floor(rate.tokens)
  end
end
-- rate cap: end
local moved, moved_bytes, last_here = 0, 0, nil
if room > 0 then
  -- read first, write after: an entry with more fields than a script can pass to XADD stops the
  -- move before it (it is reported, and set aside by the caller), so no call fails half done
  local entries = {}
  xmc_read(KEYS[2], '-', room, budget, function(e) entries[#entries + 1] = e end)
  for _, e in ipairs(entries) do
    if moved_bytes >= budget then
      break  -- the read may pass the budget by more than one entry (its chunks); the move never does
    end
    -- a task the caller was told was moved before: moved again, marked (redelivery.lua)
    local again = moved_through ~= nil and xmc_id_cmp(e[1], moved_through) <= 0
    if #e[2] + (again and 2 or 0) > XMC_MAX_VALUES then
      poison_id = e[1]
      break
    end
    local bytes = xmc_entry_bytes(e)
    local fields = e[2]
    if again then
      fields[#fields + 1] = XMC_REDELIVERY_FIELD
      fields[#fields + 1] = ARGV[12] .. ' ' .. e[1]
      redelivered = redelivered + 1
    end
    redis.call('XADD', KEYS[1], '*', unpack(fields))
    redis.call('XDEL', KEYS[2], e[1])
    moved = moved + 1
    moved_bytes = moved_bytes + bytes
    last_here = e[1]  -- the held stream is read in ID order: the last task moved is this script's latest
  end
end
if last_here and (last_moved_id == '' or xmc_id_cmp(last_here, last_moved_id) > 0) then
  last_moved_id = last_here  -- (tasks moved again, below it, leave it)
end
-- rate cap (rate.lua): take what moved from the bucket
if rate and moved > 0 then xmc_rate_take(KEYS[9], rate, moved) end
if rate_cap.cut then
  rate.tokens = rate.tokens - moved
  rate_cap.wait_ms = xmc_rate_wait_ms(rate, wanted)
end
-- rate cap: end
local remaining = redis.call('XLEN', KEYS[2])
local status = 'published'
if remaining == 0 then
  -- drained: new tasks go straight to the task stream again
  redis.call('DEL', KEYS[3], KEYS[2])
  status = 'completed'
elseif memory_full then
  status = 'memory'
elseif rate_cap.cut and moved == 0 then
  status = 'rate_limited'
elseif room <= 0 then
  status = 'throttled'
end
-- fair share (fair.lua): renew the caller's lease among the replayers, or leave once drained
if fair and status == 'completed' then
  xmc_fair_leave(KEYS[8], ARGV[12])
elseif fair then
  xmc_fair_register(KEYS[8], ARGV[12], fair)
end
-- fair share: end
local result = reply(status, moved, b, remaining, 0, moved_bytes)
xmc_backlog_save(KEYS[12], b)
redis.call('HSET', KEYS[6], 'token', token, 'seq', seq, 'result', result, 'last_moved_id', last_moved_id)
if counting then
  redis.call('HSET', KEYS[6], 'moved', total + moved)
end
if KEYS[10] and resume and moved > 0 then
  redis.call('HSET', KEYS[10], 'moved', resume + moved)
end
if resume_redelivered and redelivered > 0 then
  redis.call('HSET', KEYS[10], 'redelivered', resume_redelivered + redelivered)
end
if lease_token ~= token then
  redis.call('HSET', KEYS[5], 'token', token, 'owner', ARGV[8])  -- a lapsed lease, taken again
end
redis.call('PEXPIRE', KEYS[5], ARGV[7])
return result
