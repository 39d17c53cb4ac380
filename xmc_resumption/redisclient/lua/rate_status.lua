-- The stream-wide rate cap as every publish reads it (rate.lua's rule, so a key a publish would refuse is
-- refused here too), for `xmc rate`, `xmc plan` and `xmc resume`'s check before a start. Writes nothing.
-- KEYS[1] the rate cap {S}:rate
-- Returns JSON {limit (tasks/s), capacity (tasks), tokens (what the bucket holds now, Redis's clock)}, or {}
-- when the stream has no cap. Errors as a publish's: XMCCORRUPT (a field that is no number in bounds, a
-- hash without limit), WRONGTYPE (a key of another type).
local r = xmc_rate_read(KEYS[1])
if not r then return '{}' end
return cjson.encode({limit = r.limit, capacity = r.capacity, tokens = r.tokens})
