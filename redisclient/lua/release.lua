-- Release the claim, only if the token is still current.
-- KEYS[1] fence counter, KEYS[2] claim hash, KEYS[3] state
-- ARGV[1] token, ARGV[2] '1' to move a `resuming` experiment back to `paused` (a cancelled replay)
-- Returns 1 when released, 0 when the token was stale (a newer claim owns the experiment).
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[2])
if ARGV[2] == '1' and redis.call('GET', KEYS[3]) == 'resuming' then
  redis.call('SET', KEYS[3], 'paused')
end
return 1
