-- Measure the backlog of the consumer groups of stream KEYS[1] (backlog.lua).
-- ARGV[1] the consumer group (it must exist), ARGV[2] threshold (entries), ARGV[3] byte budget (bytes
-- read at most, about, per group), ARGV[4] missing-group policy ('wait' | 'zero' | 'error'),
-- ARGV[5] groups ('*': every group of the stream; else names separated by single spaces, ARGV[1]
-- among them). Every argument is checked (an XMCARG error reply); the script writes nothing.
-- Returns the reading as JSON (see backlog.lua).
local a = xmc_backlog_args(ARGV[1], ARGV[4], ARGV[5], ARGV[2], ARGV[3])
return cjson.encode(xmc_backlog(KEYS[1], a))
