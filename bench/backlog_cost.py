"""Cost of the backlog measurement (figure c), and the capped count against an uncapped one.

Figure c (``backlog_cost``): ``measure_backlog`` at threshold 500 on a stream whose group was set
at its first entry without entries-read (so Redis keeps no count for it and the script counts: up
to the threshold's cap, or its count budget, then an upper bound), on 1e3 and 1e6 small entries
(about 100 B) and on 520 entries of 1 KiB and of 1 MiB. For each: Redis-side time per call
(``INFO commandstats``, ``usec_per_call`` of ``evalsha``, after ``CONFIG RESETSTAT``), the client's
round trip minus a PING round trip, and the PING latency another client (a thread with its own
process) sees while the measurements run, next to its latency on an idle server.

``python -m bench.backlog_cost`` prints the older table: the capped count next to an uncapped count of
every entry after the group's last-delivered-id, both inside Redis, as the stream grows.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import sys
import time
from asyncio.subprocess import PIPE
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from xmc_resumption.redisclient.backlog import DEFAULT_BYTE_BUDGET, MAX_BYTE_BUDGET, measure_backlog
from xmc_resumption.services import local_redis

STREAM, GROUP, THRESHOLD = "bench-stream", "bench-group", 500
SIZES = (10_000, 100_000, 1_000_000)
ROUNDS = 5
KIB = 1024
MIB = 1024 * KIB
PIPELINE_BYTES = 8 * MIB
"""Bytes of entries per pipeline round trip when filling."""


async def fill(redis: Redis, upto: int, payload_bytes: int = 100, stream: str = STREAM) -> None:
    """Grow ``stream`` to ``upto`` entries of about ``payload_bytes`` each.

    Creates the group at 0 the first time.
    """
    have = await redis.xlen(stream) if await redis.exists(stream) else 0
    per_pipe = max(1, min(5_000, PIPELINE_BYTES // max(payload_bytes, 1)))
    payload = "x" * payload_bytes
    for start in range(have, upto, per_pipe):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(start, min(start + per_pipe, upto)):
                pipe.xadd(stream, {"task": f"t{i}", "payload": payload})
            await pipe.execute()
    if not have:
        await redis.xgroup_create(stream, GROUP, id="0")


@dataclass(frozen=True)
class CostCase:
    """One row of figure c: ``entries`` entries of ``payload_bytes`` each, measured ``calls`` times.

    With a byte budget of ``max_bytes`` per call (the product's default unless said).
    """

    name: str
    entries: int
    payload_bytes: int
    calls: int
    max_bytes: int = DEFAULT_BYTE_BUDGET


FULL_CASES = (
    CostCase("1e3 x 100 B", 1_000, 100, 200),
    CostCase("1e6 x 100 B", 1_000_000, 100, 200),
    CostCase("520 x 1 KiB", 520, KIB, 200),
    CostCase("520 x 1 MiB", 520, MIB, 5),
    CostCase("520 x 1 MiB, no byte budget", 520, MIB, 5, MAX_BYTE_BUDGET),
)
SMOKE_CASES = (
    CostCase("1e3 x 100 B", 1_000, 100, 50),
    CostCase("1e4 x 100 B", 10_000, 100, 50),
    CostCase("520 x 1 KiB", 520, KIB, 50),
    CostCase("520 x 64 KiB", 520, 64 * KIB, 10),
    CostCase("520 x 64 KiB, no byte budget", 520, 64 * KIB, 10, MAX_BYTE_BUDGET),
)


def _summary(latencies_ms: list[float]) -> dict[str, float]:
    """Median, 99th percentile and maximum of latencies (ms)."""
    ordered = sorted(latencies_ms) or [0.0]
    return {
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "max": ordered[-1],
    }


async def _pings(url: str, work: Callable[[], Awaitable[float]]) -> tuple[float, dict[str, float]]:
    """Run ``work`` while another client PINGs from its own process (``bench.pinger``).

    Returns the work's seconds (``work`` returns them) and the PING latencies (ms).
    """
    pinger = await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.pinger", url, stdin=PIPE, stdout=PIPE)
    assert pinger.stdin is not None and pinger.stdout is not None
    await pinger.stdout.readline()  # "ready": connected
    try:
        seconds = await work()
    finally:
        pinger.stdin.close()
        out, _ = await pinger.communicate()
    return seconds, _summary(json.loads(out))


async def _evalsha_usec_per_call(redis: Redis) -> float:
    """``usec_per_call`` of ``evalsha`` since the last ``CONFIG RESETSTAT`` (microseconds)."""
    stats = await redis.info("commandstats")
    return float(stats["cmdstat_evalsha"]["usec_per_call"])


async def _ping_round_trip_ms(redis: Redis, rounds: int = 200) -> float:
    """Mean PING round trip of ``redis`` (ms)."""
    started = time.perf_counter()
    for _ in range(rounds):
        await redis.ping()
    return (time.perf_counter() - started) / rounds * 1000


async def measure_case(redis: Redis, url: str, case: CostCase) -> dict[str, Any]:
    """Fill a stream for ``case``, time ``measure_backlog`` on it, delete it; one row of figure c."""
    stream = f"bench-c-{case.entries}-{case.payload_bytes}"
    await fill(redis, case.entries, case.payload_bytes, stream)
    first: Any = await redis.xrange(stream, count=1)
    await redis.xgroup_setid(stream, GROUP, first[0][0])  # inside the stream, entries-read NULL: a count
    reading = await measure_backlog(redis, stream, GROUP, THRESHOLD, max_bytes=case.max_bytes)  # loads the script
    ping_ms = await _ping_round_trip_ms(redis)
    _, idle_pings = await _pings(url, lambda: asyncio.sleep(0.3, result=0.3))
    await redis.config_resetstat()

    async def calls() -> float:
        started = time.perf_counter()
        for _ in range(case.calls):
            await measure_backlog(redis, stream, GROUP, THRESHOLD, max_bytes=case.max_bytes)
        return time.perf_counter() - started

    seconds, busy_pings = await _pings(url, calls)
    redis_ms = await _evalsha_usec_per_call(redis) / 1000
    await redis.delete(stream)
    client_ms = seconds / case.calls * 1000
    return {
        "case": case.name,
        "entries": case.entries,
        "entry_bytes": case.payload_bytes,
        "calls": case.calls,
        "threshold": THRESHOLD,
        "max_bytes": case.max_bytes,
        "backlog": reading.backlog,
        "capped": reading.capped,
        "bytes_capped": reading.bytes_capped,
        "lag_source": str(reading.lag_source),
        "redis_ms_per_call": redis_ms,
        "client_ms_per_call": client_ms,
        "client_minus_ping_ms": client_ms - ping_ms,
        "ping_ms_idle": idle_pings,
        "ping_ms_during": busy_pings,
    }


async def backlog_cost(redis: Redis, url: str, cases: tuple[CostCase, ...]) -> dict[str, Any]:
    """Figure c: a row per case and the ratios of the small-entry rows and of the large-entry rows.

    The ratios are of Redis-side time: more entries / fewer entries, larger / smaller entries.
    """
    rows = [await measure_case(redis, url, case) for case in cases]
    small, big = rows[:2], rows[2:4]
    unbounded = rows[4:5]
    return {
        "rows": rows,
        **({"ratio_no_budget": unbounded[0]["redis_ms_per_call"] / big[1]["redis_ms_per_call"]} if unbounded else {}),
        "ratio_entries": small[1]["redis_ms_per_call"] / small[0]["redis_ms_per_call"],
        "ratio_entry_size": big[1]["redis_ms_per_call"] / big[0]["redis_ms_per_call"],
        "ratio_entries_label": f"{small[1]['case']} / {small[0]['case']}",
        "ratio_entry_size_label": f"{big[1]['case']} / {big[0]['case']}",
    }


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
    """Pending + every entry after the group's last-delivered-id, counted inside Redis (entries)."""
    return int(await redis.eval(UNCAPPED, 1, STREAM, GROUP))


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    """Mean milliseconds of ``ROUNDS`` calls of ``fn``."""
    start = time.perf_counter()
    for _ in range(ROUNDS):
        await fn()
    return (time.perf_counter() - start) / ROUNDS * 1000


async def main() -> None:
    """Print the capped-against-uncapped table on a throwaway redis-server."""
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
