"""Figure f: how long the product's scripts block Redis during a replay (issue 8, item 1).

A whole replay through the workflow (the worker in its own process), at the input's defaults
(batch 100, threshold 500, byte budget 4 MiB, memory fraction 0.9) but the ``adaptive`` policy, so
the stream stays near the threshold and every backlog count reads undelivered tasks; consumers
drain the group meanwhile. For tasks of 1 KiB and of 1 MiB:

- another client's PING latency (``bench.pinger``: its own process, a PING every millisecond),
  p50 / p99 / max during the replay, next to the same client on the idle server just before;
- every command's Redis-side time from ``SLOWLOG`` (threshold 0 for the replay's length): the
  longest call of each of the product's scripts (named by their SHA1), the consumers' longest
  command for comparison, and the calls over the target.

The target (issue 8): no single script of the product blocks Redis more than ``TARGET_MS`` at the
defaults. ``python -m bench --only f``.
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import time
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from bench.backlog_cost import _pings
from bench.env import BenchEnv, worker_process
from bench.replay import build_input, run_resumption
from bench.tasks import check_replay, hold_tasks
from xmc_resumption.consumer import run_consumer
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys
from xmc_resumption.redisclient.scripts import source

TARGET_MS = 50.0
"""The most one script of the product may block Redis (ms), issue 8."""

SCRIPTS = ("acquire", "check", "measure", "publish", "release")
"""The scripts a replay runs (``redisclient/lua``)."""

SLOWLOG_MAX_LEN = 200_000
"""SLOWLOG entries kept during one case: every command of the replay and the consumers."""

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class BlockingCase:
    """One row of figure f: ``tasks`` held tasks of ``payload_bytes`` each.

    Drained by ``consumers`` consumers reading ``count`` entries a call at ``rate`` tasks/s in all.
    """

    name: str
    tasks: int
    payload_bytes: int
    rate: float
    count: int
    consumers: int = 2


FULL_CASES = (
    BlockingCase("1 KiB", 20_000, KIB, 4_000, 50),
    BlockingCase("1 MiB", 400, MIB, 80, 1),
)
SMOKE_CASES = (
    BlockingCase("1 KiB", 2_000, KIB, 2_000, 50),
    BlockingCase("64 KiB", 200, 64 * KIB, 200, 2),
)


def _script_names() -> dict[str, str]:
    """SHA1 (hex, as EVALSHA takes it) of each script's source -> its name."""
    return {hashlib.sha1(source(name).encode()).hexdigest(): name for name in SCRIPTS}


def _command_name(args: list[bytes], scripts: dict[str, str]) -> str:
    """A SLOWLOG entry's command as a name: the script's name for an EVALSHA/EVAL of the product."""
    if not args:
        return "?"
    command = args[0].decode(errors="replace").lower()
    if command == "evalsha" and len(args) > 1:
        return "script:" + scripts.get(args[1].decode(errors="replace"), "other")
    return command


async def _slowlog(redis: Redis) -> list[tuple[list[bytes], float]]:
    """Every SLOWLOG entry as (arguments, duration in ms), oldest first."""
    raw = await redis.execute_command("SLOWLOG", "GET", "-1")
    return [(list(entry[3]), entry[2] / 1000) for entry in reversed(raw)]


def _durations(entries: list[tuple[list[bytes], float]]) -> dict[str, dict[str, float]]:
    """Per command or script name: calls, p50, p99 and max of its Redis-side time (ms)."""
    scripts = _script_names()
    by_name: dict[str, list[float]] = {}
    for args, ms in entries:
        by_name.setdefault(_command_name(args, scripts), []).append(ms)
    out = {}
    for name, values in sorted(by_name.items()):
        ordered = sorted(values)
        out[name] = {
            "calls": len(ordered),
            "p50_ms": statistics.median(ordered),
            "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
            "max_ms": ordered[-1],
        }
    return out


async def blocking_case(env: BenchEnv, case: BlockingCase) -> dict[str, Any]:
    """One row of figure f: replay ``case.tasks`` held tasks with consumers draining.

    Another client PINGs meanwhile, and every command is logged.
    """
    redis = env.redis
    keys = ExperimentKeys(DEFAULT_STREAM, f"bench-f-{case.payload_bytes}-{time.monotonic_ns() % 10**8}")
    await redis.delete(DEFAULT_STREAM)
    await redis.xgroup_create(DEFAULT_STREAM, DEFAULT_GROUP, id="$", mkstream=True)
    await hold_tasks(redis, keys, case.tasks, case.payload_bytes)
    _, idle = await _pings(env.redis_url, lambda: asyncio.sleep(1.0, result=1.0))
    await redis.config_set("slowlog-max-len", str(SLOWLOG_MAX_LEN))
    await redis.config_set("slowlog-log-slower-than", "0")
    await redis.slowlog_reset()
    stop = asyncio.Event()
    consumed: list[bytes] = []
    rate = case.rate / case.consumers
    consumers = [
        asyncio.create_task(
            run_consumer(redis, DEFAULT_STREAM, DEFAULT_GROUP, f"c{i}", stop, consumed, count=case.count, rate=rate)
        )
        for i in range(case.consumers)
    ]
    inp = build_input({"experiment_id": keys.experiment_id, "throttle_policy": "adaptive"})

    async def replay() -> float:
        run = await run_resumption(env, inp)
        return run.wall_s

    try:
        wall, during = await _pings(env.redis_url, replay)
    finally:
        stop.set()
        await asyncio.gather(*consumers)
    entries = await _slowlog(redis)
    await redis.config_set("slowlog-log-slower-than", "10000")
    await redis.slowlog_reset()
    check = await check_replay(redis, keys, case.tasks)
    await redis.delete(DEFAULT_STREAM)
    durations = _durations(entries)
    ours = {name: d for name, d in durations.items() if name.startswith("script:")}
    others = {name: d for name, d in durations.items() if not name.startswith("script:")}
    script_max = max((d["max_ms"] for d in ours.values()), default=0.0)
    return {
        "case": case.name,
        "tasks": case.tasks,
        "payload_bytes": case.payload_bytes,
        "consumer_rate": case.rate,
        "wall_s": wall,
        "ping_ms_idle": idle,
        "ping_ms_during": during,
        "scripts": ours,
        "script_max_ms": script_max,
        "scripts_over_target": sum(1 for args, ms in entries if ms > TARGET_MS and args[:1] == [b"EVALSHA"]),
        "other_max_ms": max((d["max_ms"] for d in others.values()), default=0.0),
        "other_slowest": max(others, key=lambda n: others[n]["max_ms"], default=""),
        "exactly_once": check.exactly_once,
        "within_target": script_max <= TARGET_MS,
    }


async def blocking(env: BenchEnv, cases: tuple[BlockingCase, ...]) -> dict[str, Any]:
    """Figure f: one row per case, under one worker process."""
    rows = []
    async with worker_process(env, "worker-f"):
        for case in cases:
            print(f"f: {case.tasks} x {case.name}", flush=True)
            rows.append(await blocking_case(env, case))
    return {"target_ms": TARGET_MS, "rows": rows}


def lines(f: dict[str, Any]) -> list[str]:
    """Figure f's table."""
    out = [f"f. Redis blocking during a replay (defaults, adaptive; target: no script > {f['target_ms']:g} ms)"]
    out.append(
        f"{'tasks':>12} {'PING idle p50/p99/max ms':>26} {'PING replay p50/p99/max ms':>28} "
        f"{'script max ms':>13} {'publish p50/max':>16} {'measure max':>11} {'other max (cmd)':>22}"
    )
    for r in f["rows"]:
        idle, during, scripts = r["ping_ms_idle"], r["ping_ms_during"], r["scripts"]
        publish = scripts.get("script:publish", {"p50_ms": 0.0, "max_ms": 0.0})
        measure = scripts.get("script:measure", {"max_ms": 0.0})
        out.append(
            f"{r['tasks']:>6} x {r['case']:<5}"
            f" {idle['p50']:>8.2f}/{idle['p99']:>7.2f}/{idle['max']:>8.2f}"
            f" {during['p50']:>10.2f}/{during['p99']:>7.2f}/{during['max']:>8.2f}"
            f" {r['script_max_ms']:>13.2f} {publish['p50_ms']:>7.2f}/{publish['max_ms']:>7.2f}"
            f" {measure['max_ms']:>11.2f} {r['other_max_ms']:>9.2f} ({r['other_slowest']})"
        )
    return out
