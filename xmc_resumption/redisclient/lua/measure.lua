-- Measure the backlog of group ARGV[1] on stream KEYS[1] against threshold ARGV[2] (entries),
-- reading at most about ARGV[3] bytes of entries. Returns the reading as JSON (see backlog.lua).
return cjson.encode(xmc_backlog(KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])))
