"""Cost of the backlog measurement against the stream's length: ``python -m bench.backlog_cost``.

The capped count (DESIGN.md section 4: XRANGE reads at most threshold - pending + 1 entries) next
to an uncapped count of every entry after the group's last-delivered-id, on the same redis-server in
the same run, both counted inside Redis by a Lua script (so the cost is Redis's, which is what
blocks other clients). Prints milliseconds per measurement and their ratio; the capped one should
stay flat as the stream grows, the uncapped one grows with it.
"""

from __future__ import annotations

import asyncio
import gc
import time

from redis.asyncio import Redis

from redisclient.backlog import measure_backlog
from xmc.services import local_redis

STREAM, GROUP, THRESHOLD = "bench-stream", "bench-group", 500
SIZES = (10_000, 100_000, 1_000_000)
ROUNDS = 5


async def fill(redis: Redis, upto: int) -> None:
    have = await redis.xlen(STREAM) if await redis.exists(STREAM) else 0
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(have, upto):
            pipe.xadd(STREAM, {"task": f"t{i}", "payload": "x" * 100})
            if len(pipe) >= 5_000:
                await pipe.execute()
        await pipe.execute()
    if not have:
        await redis.xgroup_create(STREAM, GROUP, id="0")


UNCAPPED = """
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  if f['name'] == ARGV[1] then
    return f['pending'] + #redis.call('XRANGE', KEYS[1], '(' .. f['last-delivered-id'], '+')
  end
end
return 0
"""


async def uncapped(redis: Redis) -> int:
    return int(await redis.eval(UNCAPPED, 1, STREAM, GROUP))


async def timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for _ in range(ROUNDS):
        await fn()
    return (time.perf_counter() - start) / ROUNDS * 1000


async def main() -> None:
    with local_redis() as url:
        redis = Redis.from_url(url, socket_timeout=None)
        print(f"threshold {THRESHOLD} entries, {ROUNDS} rounds each, entries of about 120 bytes")
        print(f"{'entries':>9} {'capped ms':>10} {'uncapped ms':>12} {'ratio':>7}")
        for size in SIZES:
            await fill(redis, size)
            capped_ms = await timed(lambda: measure_backlog(redis, STREAM, GROUP, THRESHOLD))
            uncapped_ms = await timed(lambda: uncapped(redis))
            print(f"{size:>9} {capped_ms:>10.2f} {uncapped_ms:>12.1f} {uncapped_ms / capped_ms:>6.0f}x", flush=True)
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main())
    gc.collect()
