-- Measure the backlog of the consumer groups of stream KEYS[1] (backlog.lua).
-- KEYS[2] the stream's backlog records `{S}:backlog` (hash; optional: without it no record is read or
-- written, and a lag Redis cannot give exactly is counted; the script writes nothing then).
-- ARGV[1] the consumer group (it must exist), ARGV[2] threshold (entries), ARGV[3] byte budget (bytes
-- read at most, about, per group), ARGV[4] missing-group policy ('wait' | 'zero' | 'error'),
-- ARGV[5] groups ('*': ARGV[1] and every group of the stream with a consumer; else names separated by single spaces, ARGV[1]
-- among them). Every argument is checked (an XMCARG error reply) before the only write: the records.
-- Returns the reading as JSON (see backlog.lua), without its records.
local a = xmc_backlog_args(ARGV[1], ARGV[4], ARGV[5], ARGV[2], ARGV[3])
local b = xmc_backlog(KEYS[1], a, KEYS[2])
xmc_backlog_save(KEYS[2], b)
b.records, b.drops = nil, nil
return cjson.encode(b)
