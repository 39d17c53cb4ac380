-- Pause-aware enqueue (DESIGN.md section 3).
-- KEYS[1] task stream, KEYS[2] experiment state, KEYS[3] held stream
-- ARGV: the task's field/value pairs, stored byte for byte.
-- running (state absent) -> XADD task stream; paused or resuming -> XADD held stream, so tasks
-- produced while a replay runs queue up behind the held ones and order is kept.
-- Returns {destination ('stream' | 'held'), entry ID}.
local state = redis.call('GET', KEYS[2])
local key, where = KEYS[1], 'stream'
if state == 'paused' or state == 'resuming' then
  key, where = KEYS[3], 'held'
end
return {where, redis.call('XADD', key, '*', unpack(ARGV))}
