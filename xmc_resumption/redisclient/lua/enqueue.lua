-- Pause-aware enqueue (docs/contract.md, "The state machine").
-- KEYS[1] task stream, KEYS[2] experiment state, KEYS[3] held stream
-- ARGV: the task's field/value pairs, stored byte for byte.
-- running (state absent, nothing held) -> XADD task stream; otherwise -> XADD held stream, so tasks
-- produced while a replay runs queue up behind the held ones and order is kept.
-- Returns {destination ('stream' | 'held'), entry ID}.
-- Any state value (paused, resuming, or one the contract does not know) holds the task, and so do
-- held tasks waiting without a state key: a task never overtakes held ones.
local key, where = KEYS[1], 'stream'
if redis.call('EXISTS', KEYS[2]) == 1 or redis.call('XLEN', KEYS[3]) > 0 then
  key, where = KEYS[3], 'held'
end
return {where, redis.call('XADD', key, '*', unpack(ARGV))}
