-- Pause-aware enqueue of one or more tasks of one experiment, with optional idempotency keys.
-- The producers' contract: docs/producers.md. This file is complete as it is (no fragment is
-- prepended): a producer in any language loads its text and runs it with EVALSHA.
-- KEYS[1] task stream S, KEYS[2] {S}:experiment:E:state, KEYS[3] {S}:experiment:E:held,
-- KEYS[4] {S}:experiment:E:idempotency (hash: idempotency key -> '<destination> <entry ID> <request ID>'),
-- KEYS[5] {S}:experiment:E:idempotency-previous (the record's previous generation, same layout)
-- ARGV[1] the number of tasks N, 1..XMC_MAX_TASKS; ARGV[2] the call's request ID ('' for none, else
-- 1..XMC_MAX_REQUEST_BYTES bytes, any bytes: the same for every resend of one call, new for each call);
-- then for each task, in order:
--   its idempotency key ('' for none, else 1..XMC_MAX_KEY_BYTES bytes, any bytes),
--   its field count F (1..XMC_MAX_FIELDS), then its F field/value pairs, stored byte for byte.
-- All arguments together hold at most XMC_MAX_BYTES bytes.
--
-- Hold rule: running (no state key and nothing held) -> XADD to S; anything else (paused,
-- resuming, a state value the contract does not know, or held tasks waiting without a state key)
-- -> XADD to the held stream, so a task never overtakes a held one.
-- Idempotency: a task whose key is in the record (either generation) is not added again; its reply
-- is the first enqueue's destination and entry ID, flagged as a duplicate unless the record names
-- this call's request ID (a resend of the call that added it, after a lost reply: the same answer
-- as the first time). The same key again later in one call is a duplicate too. A new key is
-- recorded with the entry ID and the request ID; the record is a hash of at most XMC_RECORD_KEYS
-- keys: when full it becomes the previous generation (RENAME, which drops the one before) and a new
-- one starts. Each keyed enqueue sets the record's TTL to XMC_RECORD_TTL_MS, so a key is remembered
-- for XMC_RECORD_TTL_MS after it was written, or until XMC_RECORD_KEYS later keys of the experiment
-- were written, whichever ends first.
-- A call that answers from the record rewrites one recorded entry with its own value, so that a WAIT
-- after it covers the enqueue it reports.
--
-- Returns one reply per task, in order: {destination ('stream' | 'held'), entry ID, duplicate (0 | 1)};
-- duplicate 0: this call (or an earlier send of the same request ID) added the task.
-- Errors, before any write: 'XMCARG <what>' for malformed arguments; 'WRONGTYPE <key> is a <type>,
-- expected a <type>' for a key of the wrong type; 'XMCCORRUPT <what>' for a record entry this script
-- did not write.
local XMC_MAX_TASKS = 1000
local XMC_MAX_FIELDS = 3995  -- field names and values pass through unpack, which stops near 8,000 values
local XMC_MAX_KEY_BYTES = 256
local XMC_MAX_REQUEST_BYTES = 128
local XMC_MAX_BYTES = 64 * 1024 * 1024
local XMC_RECORD_KEYS = 10000
local XMC_RECORD_TTL_MS = 86400000

local function count(v, low, high)
  local n = type(v) == 'string' and string.match(v, '^%d+$') and #v <= 9 and tonumber(v)
  if n and n >= low and n <= high then return n end
  return nil
end

local function bad(what)
  return redis.error_reply('XMCARG ' .. what)
end

local function quoted(v)
  return string.format('%q', string.sub(tostring(v), 1, 40))
end

-- every argument is checked before the first write
local n = count(ARGV[1], 1, XMC_MAX_TASKS)
if not n then
  return bad('the number of tasks (ARGV[1]) must be 1..' .. XMC_MAX_TASKS .. ', got ' .. quoted(ARGV[1]))
end
local bytes = 0
for i = 1, #ARGV do bytes = bytes + #ARGV[i] end
if bytes > XMC_MAX_BYTES then
  return bad('the arguments hold ' .. bytes .. ' bytes, more than ' .. XMC_MAX_BYTES)
end
local request = ARGV[2]
if request == nil or #request > XMC_MAX_REQUEST_BYTES then
  return bad('the request ID (ARGV[2]) must be 0..' .. XMC_MAX_REQUEST_BYTES .. ' bytes, got '
             .. (request and #request .. ' bytes' or 'none'))
end
local tasks, at = {}, 3
for i = 1, n do
  local key, fields = ARGV[at], ARGV[at + 1]
  if fields == nil then
    return bad('task ' .. i .. ' of ' .. n .. ': missing its idempotency key or field count (ARGV[' .. at .. '])')
  end
  if #key > XMC_MAX_KEY_BYTES then
    return bad('task ' .. i .. ': an idempotency key has at most ' .. XMC_MAX_KEY_BYTES .. ' bytes, got ' .. #key)
  end
  local f = count(fields, 1, XMC_MAX_FIELDS)
  if not f then
    return bad('task ' .. i .. ': the field count must be 1..' .. XMC_MAX_FIELDS .. ', got ' .. quoted(fields))
  end
  if at + 1 + 2 * f > #ARGV then
    return bad('task ' .. i .. ': ' .. f .. ' fields need ' .. 2 * f .. ' values, got ' .. (#ARGV - at - 1))
  end
  tasks[i] = {key = key, first = at + 2, last = at + 1 + 2 * f}
  at = at + 2 + 2 * f
end
if at <= #ARGV then
  return bad((#ARGV - at + 1) .. ' arguments after the last of ' .. n .. ' tasks')
end
for i, expected in ipairs({'stream', 'string', 'stream', 'hash', 'hash'}) do
  local t = redis.call('TYPE', KEYS[i]).ok
  -- any type of state key holds tasks (only its existence counts)
  if t ~= 'none' and t ~= expected and i ~= 2 then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' is a ' .. t .. ', expected a ' .. expected)
  end
end

-- the record's answers for the keys given, read (and checked) before the first write:
-- '<destination> <entry ID>', then ' <request ID>' when the call that added it had one
local recorded = {}
for i, task in ipairs(tasks) do
  local v = task.key ~= '' and (redis.call('HGET', KEYS[4], task.key) or redis.call('HGET', KEYS[5], task.key))
  if v then
    local first, id, rest = string.match(v, '^(%a+) (%d+%-%d+)(.*)$')
    if (first ~= 'stream' and first ~= 'held') or (rest ~= '' and string.sub(rest, 1, 1) ~= ' ') then
      return redis.error_reply('XMCCORRUPT the idempotency record of ' .. KEYS[4] .. ' holds ' .. quoted(v)
                               .. ' for task ' .. i .. "'s key, not '<stream|held> <entry ID> [<request ID>]'")
    end
    -- added by an earlier send of this very call: its first answer, not a duplicate
    local mine = request ~= '' and string.sub(rest, 2) == request
    recorded[i] = {first, id, mine and 0 or 1}
  end
end

local dest, where = KEYS[1], 'stream'
if redis.call('EXISTS', KEYS[2]) == 1 or redis.call('XLEN', KEYS[3]) > 0 then
  dest, where = KEYS[3], 'held'
end
local replies, added = {}, {}
local stamp = request ~= '' and (' ' .. request) or ''
for i, task in ipairs(tasks) do
  local earlier = task.key ~= '' and added[task.key]
  if earlier then
    replies[i] = {earlier[1], earlier[2], 1}  -- the same key earlier in this call
  elseif recorded[i] then
    replies[i] = recorded[i]
    added[task.key] = recorded[i]
  else
    local values = {}
    for j = task.first, task.last do values[#values + 1] = ARGV[j] end
    local id = redis.call('XADD', dest, '*', unpack(values))
    if task.key ~= '' then
      if redis.call('HLEN', KEYS[4]) >= XMC_RECORD_KEYS then
        redis.call('RENAME', KEYS[4], KEYS[5])
      end
      redis.call('HSET', KEYS[4], task.key, where .. ' ' .. id .. stamp)
      redis.call('PEXPIRE', KEYS[4], XMC_RECORD_TTL_MS)
      added[task.key] = {where, id}
    end
    replies[i] = {where, id, 0}
  end
end
-- a recorded answer reports an enqueue of an earlier call: its record entry is rewritten with its
-- own value, a write that reaches the replicas after that enqueue, so that WAIT on the caller's
-- connection (replica acknowledgements, docs/producers.md) covers it too
for i, task in ipairs(tasks) do
  if recorded[i] then
    for _, record in ipairs({KEYS[4], KEYS[5]}) do
      local v = redis.call('HGET', record, task.key)
      if v then
        redis.call('HSET', record, task.key, v)
        break
      end
    end
    break
  end
end
return replies
