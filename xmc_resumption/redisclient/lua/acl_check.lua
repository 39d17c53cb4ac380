-- Which commands the calling ACL user may run, without running them (redis.acl_check_cmd, Redis 7.0).
-- KEYS[1] a key of the slot to ask (the task stream: on a Redis Cluster the node holding it); not read
-- ARGV[1] a JSON array of commands, each an array: the command's name and its arguments (keys among them)
-- Returns a JSON array of booleans, one per command: true when the user may run it (false for a
-- command Redis does not know). Reads and writes nothing.
local checks = cjson.decode(ARGV[1])
local allowed = {}
for i, cmd in ipairs(checks) do
  local ok, may = pcall(redis.acl_check_cmd, unpack(cmd))
  allowed[i] = ok and may == true
end
return cjson.encode(allowed)
