"""Figure k: one backlog measurement's Redis CPU at the largest threshold, with 1, 16 and 64 groups.

Each group is just under the threshold behind (``threshold - 1 - i`` entries for the i-th group), on a
stream of tasks of 10 bytes, so no group is full and every group's lag must be known. Three ways a
group got there (``lua/backlog.lua``'s rules):

- ``recorded``: it read the stream's end once (a reading then wrote its record) and then fell behind
  through XREADGROUP: entries-added - entries-read, O(1);
- ``from 0``: it was created at 0 and read its way in (entries-read exact, no record): the script's
  count budget, then the upper bound;
- ``no entries-read``: created at an ID (entries-read NULL): the count budget, then XLEN as the bound.

And, side by side in the same run, the rule of 72bd4ad (``OLD_RULE``: pending + an XRANGE capped at
``threshold - pending + 1`` per group; 1 and 16 groups, one call each: at 64 groups one call blocks
Redis for about 20 s).

Redis CPU per measurement: the redis-server's own CPU time (``/proc/<pid>/schedstat``, nanoseconds on
CPU) over ``CALLS`` calls, divided by the calls; ``INFO commandstats``'s ``usec_per_call`` of the script
beside it. Target (issue 25): at most 10 ms at every row of the current rule.
"""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from xmc_resumption.redisclient.backlog import measure_backlog
from xmc_resumption.services import local_redis

THRESHOLD = 100_000
GROUP_COUNTS = (1, 16, 64)
OLD_GROUP_COUNTS = (1, 16)
CALLS = 20
TARGET_MS = 10.0
STREAM = "bench-k"
TASK = "t" * 10

OLD_RULE = """
-- the backlog rule of 72bd4ad, as it counted (no byte budget: 10-byte tasks never reach it)
local threshold, worst = tonumber(ARGV[1]), 0
for _, raw in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local f = {}
  for i = 1, #raw, 2 do f[raw[i]] = raw[i + 1] end
  local pending, lag = tonumber(f['pending']), 0
  if pending < threshold then
    local k, start = threshold - pending + 1, '(' .. f['last-delivered-id']
    local chunk = 1
    while lag < k do
      local got = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', math.min(chunk, k - lag))
      for _, e in ipairs(got) do lag = lag + 1; start = '(' .. e[1] end
      if #got < math.min(chunk, k - lag + #got) then break end
      chunk = chunk * 2
    end
  end
  worst = math.max(worst, pending + lag)
  if worst >= threshold then break end
end
return worst
"""


async def _cpu_ns(redis: Redis) -> int:
    """The redis-server's CPU time so far (ns), from /proc/<pid>/schedstat (it runs on this machine)."""
    pid = (await redis.info("server"))["process_id"]
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


async def _fill(redis: Redis, entries: int) -> None:
    for start in range(0, entries, 5_000):
        async with redis.pipeline(transaction=False) as pipe:
            for _ in range(start, min(start + 5_000, entries)):
                pipe.xadd(STREAM, {"task": TASK})
            await pipe.execute()


async def _groups(redis: Redis, groups: int, how: str) -> None:
    """``groups`` groups ``g00``.., the i-th ``THRESHOLD - 1 - i`` entries behind, arrived at ``how``."""
    await redis.delete(STREAM, "{" + STREAM + "}:backlog")
    entries = THRESHOLD + groups
    names = [f"g{i:02}" for i in range(groups)]
    if how == "recorded":
        await _fill(redis, 1)
        for name in names:
            await redis.xgroup_create(STREAM, name, id="0")
            await redis.xreadgroup(name, "c", {STREAM: ">"}, count=1, noack=True)  # the end: entries-read exact
        await measure_backlog(redis, STREAM, names[0], THRESHOLD, records=True)  # writes every group's record
        await _fill(redis, entries - 1)
        for i, name in enumerate(names):
            await redis.xreadgroup(name, "c", {STREAM: ">"}, count=groups + i, noack=True)
        return
    await _fill(redis, entries)
    head: Any = await redis.xrange(STREAM, count=1)
    first = head[0][0]
    for i, name in enumerate(names):
        if how == "from 0":
            await redis.xgroup_create(STREAM, name, id="0")
            await redis.xreadgroup(name, "c", {STREAM: ">"}, count=groups + 1 + i, noack=True)
        else:  # created at an entry's ID: Redis keeps no entries-read
            upto: Any = await redis.xrange(STREAM, min=first, count=groups + 1 + i)
            await redis.xgroup_create(STREAM, name, id=upto[-1][0])
            await redis.xgroup_createconsumer(STREAM, name, "c")


async def _measure(redis: Redis, groups: int, calls: int, old: bool) -> dict[str, Any]:
    """Redis CPU per measurement (ms) over ``calls`` calls, and the reading."""
    old_rule = redis.register_script(OLD_RULE)
    run = (
        (lambda: old_rule(keys=[STREAM], args=[THRESHOLD]))
        if old
        else (lambda: measure_backlog(redis, STREAM, "g00", THRESHOLD, records=True))
    )
    first: Any = await run()  # loads the script
    await redis.config_resetstat()
    before = await _cpu_ns(redis)
    started = time.perf_counter()
    for _ in range(calls):
        await run()
    wall = time.perf_counter() - started
    cpu_ms = (await _cpu_ns(redis) - before) / calls / 1e6
    stats = (await redis.info("commandstats")).get("cmdstat_evalsha", {})
    row: dict[str, Any] = {
        "groups": groups,
        "calls": calls,
        "redis_cpu_ms": cpu_ms,
        "usec_per_call": float(stats.get("usec_per_call", 0.0)),
        "client_ms": wall / calls * 1000,
    }
    if old:
        row["backlog"] = int(first)
    else:
        row.update(backlog=first.backlog, lag_source=str(first.lag_source), headroom=first.headroom)
    return row


async def group_cost(redis: Redis, counts: tuple[int, ...] = GROUP_COUNTS, calls: int = CALLS) -> dict[str, Any]:
    """Figure k: a row per (how the groups got there, groups), and the rule of 72bd4ad at 1 and 16 groups."""
    rows = []
    for how in ("recorded", "from 0", "no entries-read"):
        for groups in counts:
            await _groups(redis, groups, how)
            rows.append({"case": how, **await _measure(redis, groups, calls, old=False)})
    old = []
    for groups in [g for g in OLD_GROUP_COUNTS if g in counts]:
        await _groups(redis, groups, "from 0")
        old.append({"case": "rule of 72bd4ad", **await _measure(redis, groups, 1, old=True)})
    await redis.delete(STREAM, "{" + STREAM + "}:backlog")
    return {"threshold": THRESHOLD, "rows": rows, "old": old, "target_ms": TARGET_MS,
            "within_target": all(r["redis_cpu_ms"] <= TARGET_MS for r in rows)}  # fmt: skip


def lines(k: dict[str, Any]) -> list[str]:
    """Figure k's table."""
    out = [f"k. one measurement's Redis CPU at threshold {k['threshold']:,}, each group just under it behind "
           f"(10-byte tasks; redis-server schedstat over the calls; target <= {k['target_ms']:g} ms)"]  # fmt: skip
    out.append(
        f"{'case':>16} {'groups':>6} {'calls':>5} {'CPU ms':>8} {'usec/call':>10} {'backlog':>8} {'lag from':>10}"
    )
    for r in k["rows"] + k["old"]:
        out.append(
            f"{r['case']:>16} {r['groups']:>6} {r['calls']:>5} {r['redis_cpu_ms']:>8.3f} {r['usec_per_call']:>10.0f} "
            f"{r['backlog']:>8} {r.get('lag_source', 'count'):>10}"
        )
    return out


async def main() -> None:
    """Print figure k on a throwaway redis-server."""
    with local_redis() as url:
        redis = Redis.from_url(url, socket_timeout=None)
        print("\n".join(lines(await group_cost(redis))))
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main())
    gc.collect()
