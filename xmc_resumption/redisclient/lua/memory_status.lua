-- Redis's memory settings, for the worker's start and `xmc status` (memory.lua's rule).
-- KEYS[1] a key of the slot to ask (the task stream: on a Redis Cluster the node holding it); not read
-- Returns JSON {policy, used_memory, maxmemory, problem} (bytes; maxmemory 0: no limit; problem: the
-- XMCEVICTION text without its prefix, absent under noeviction).
local m = xmc_memory()
m.problem = xmc_eviction_problem(m)
return cjson.encode(m)
