"""Figure m: many concurrent replays of one stream (issue 25, items 2 and 5; ``python -m bench --only m``).

Each row resumes N experiments at once on one task stream and one consumer group, 60,000 tasks in all
(10 x 6,000, 100 x 600, 1,000 x 60), adaptive, batch 100, threshold 500, the rest of the input as
shipped, under two fresh ``python -m worker`` processes, while paced consumers drain the stream at
R = 2,000/s (figure g's harness, ``bench.scale``). Reported per row:

- ``x ideal``: workflow starts -> the consumers' last read, over N tasks / R measured (the target of
  issue 25: 1.1); ``wall/ideal``: starts -> last result, over the same. Both count the starts, which
  the bench sends at once (one ``asyncio.gather``); ``starts_s`` says how long they took;
- worker CPU seconds per 1,000 tasks (both workers, ``/proc``), and over the first row's (target 1.2);
- Redis calls per 1,000 tasks (Redis's command counts; the set-up, consumers, sampler and check left
  out, a few calls a replay for its set-up and check left in);
- history events per 1,000 tasks: every run of every chain, continue-as-new runs included (one
  reverse history read a run, ``bench.replay.chain_lengths``);
- the highest sampled backlog against the threshold, exactly once and in order;
- the workers' free task slots (the SDK's defaults, which the product keeps: 100 workflow tasks, 100
  activities and 100 local activities a worker): the fewest free seen and the share of readings
  with none free, per kind, from the workers' Prometheus metrics read every ``SLOT_EVERY_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from bench import scale
from bench.env import BenchEnv, WorkerProcess, worker_process
from xmc_resumption.services import free_port
from xmc_resumption.workflows.models import ResumptionInput


@dataclass(frozen=True)
class ManySize:
    """Figure m's rows: ``(replays, tasks each)``, consumer rate R (entries/s), threshold and batch (entries)."""

    rows: tuple[tuple[int, int], ...]
    rate: float
    threshold: int
    batch: int
    throttle_seconds: float = ResumptionInput.model_fields["throttle_seconds"].default
    """The longest adaptive wait (seconds): the shipped default, 10 (figure g's rows take 1)."""


FULL_SIZE = ManySize(rows=((10, 6_000), (100, 600), (1_000, 60)), rate=2_000, threshold=500, batch=100)
SMOKE_SIZE = ManySize(rows=((2, 30), (3, 20)), rate=1_000, threshold=20, batch=10)
"""The smoke's threshold is below each replay's tasks, so its replays wait too."""

NOT_THE_REPLAYS = ("xreadgroup", "xack", "xadd", "xlen", "xrange")
"""Commands of the row's set-up (XADD of the held tasks), consumers, sampler (besides its one
script call a sample) and check, left out of the replays' Redis calls."""

SLOT_METRIC = "temporal_worker_task_slots_available"
SLOT_KINDS = {"WorkflowWorker": "workflow tasks", "ActivityWorker": "activities", "LocalActivityWorker": "local"}
SLOT_EVERY_S = 0.25
"""Pause between two readings of the workers' free slots (seconds)."""


async def _redis_calls(redis: Redis) -> int:
    """Commands Redis has run so far, those of ``NOT_THE_REPLAYS`` left out."""
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.removeprefix("cmdstat_") not in NOT_THE_REPLAYS)


def _free_slots(url: str) -> dict[str, float]:
    """Free slots per kind (``SLOT_KINDS``' values) from one worker's Prometheus page at ``url``."""
    with urllib.request.urlopen(url, timeout=5) as page:
        text: str = page.read().decode()
    free: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(SLOT_METRIC + "{"):
            labels, value = line.rsplit(" ", 1)
            for kind, name in SLOT_KINDS.items():
                if f'worker_type="{kind}"' in labels:
                    free[name] = float(value)
    return free


@dataclass
class SlotReadings:
    """The workers' free slots seen during a row: per kind, the fewest free and readings with none free.

    ``readings`` counts one a worker a round.
    """

    fewest: dict[str, float]
    readings: int
    none_free: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: fewest free and the share of readings with none free, per kind."""
        return {
            name: {"fewest_free": self.fewest[name], "none_free_share": self.none_free[name] / max(self.readings, 1)}
            for name in self.fewest
        }


async def _read_slots(urls: list[str], stop: asyncio.Event) -> SlotReadings:
    """Read every worker's free slots every ``SLOT_EVERY_S`` until ``stop``."""
    fewest: dict[str, float] = {}
    none_free: dict[str, int] = defaultdict(int)
    readings = 0
    while not stop.is_set():
        for url in urls:
            free = await asyncio.to_thread(_free_slots, url)
            readings += 1
            for name, value in free.items():
                fewest[name] = min(fewest.get(name, value), value)
                none_free[name] += value <= 0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), SLOT_EVERY_S)
    return SlotReadings(fewest, readings, dict(none_free))


@contextlib.asynccontextmanager
async def _metered_workers(env: BenchEnv) -> AsyncIterator[tuple[tuple[WorkerProcess, ...], list[str]]]:
    """Two ``python -m worker`` processes serving Prometheus metrics; yields them and their metrics URLs."""
    ports = [free_port(), free_port()]
    settings = [{"XMC_METRICS_BIND": f"127.0.0.1:{port}"} for port in ports]
    async with (
        worker_process(env, "many-worker-1", settings[0]) as first,
        worker_process(env, "many-worker-2", settings[1]) as second,
    ):
        yield (first, second), [f"http://127.0.0.1:{port}/metrics" for port in ports]


async def many_run(
    env: BenchEnv, size: ManySize, replays: int, tasks: int, workers: tuple[WorkerProcess, ...], urls: list[str]
) -> dict[str, Any]:
    """One row: ``replays`` adaptive replays of ``tasks`` each at once on one stream (``bench.scale.scale_run``)."""
    scale_size = scale.ScaleSize(
        experiments=replays,
        tasks=tasks,
        rate=size.rate,
        threshold=size.threshold,
        throttle_seconds=size.throttle_seconds,
    )
    case = scale.ScaleCase("many", (scale.Group(replays, tasks, size.batch),), "adaptive")
    stop = asyncio.Event()
    slots = asyncio.create_task(_read_slots(urls, stop))
    try:
        before = await _redis_calls(env.redis)
        row = await scale.scale_run(env, case, scale_size, workers, history=True)
        calls = await _redis_calls(env.redis) - before - row["samples"]  # the sampler's script call each
    finally:
        stop.set()
        readings = await slots
    total = replays * tasks
    return {
        "row": f"{replays} x {tasks}",
        "replays": replays,
        "tasks_each": tasks,
        "tasks": total,
        "rate_measured": row["rate_measured"],
        "threshold": size.threshold,
        "batch": size.batch,
        "starts_s": row["starts_s"],
        "wall_s": row["wall_s"],
        "drained_s": row["drained_s"],
        "over_ideal": row["drained_s"] * row["rate_measured"] / total,
        "wall_over_ideal": row["wall_over_ideal"],
        "worker_cpu_s_per_1000_tasks": row["worker_cpu_s"] / total * 1000,
        "redis_calls_per_1000_tasks": calls / total * 1000,
        "events": row["events"],
        "runs": row["runs"],
        "largest_run_events": row["largest_run_events"],
        "events_per_1000_tasks": row["events"] / total * 1000,
        "max_backlog": row["max_backlog"],
        "throttles": row["throttles"],
        "finish": row["finish"],
        "slots": readings.as_dict(),
        "exactly_once": row["exactly_once"],
    }


async def many(env: BenchEnv, size: ManySize) -> dict[str, Any]:
    """Figure m: every row of ``size`` under two fresh workers, in order; CPU per task over the first row's."""
    rows = []
    async with _metered_workers(env) as (workers, urls):
        for replays, tasks in size.rows:
            print(f"m: {replays} replays x {tasks} tasks, R {size.rate:g}/s, threshold {size.threshold}", flush=True)
            rows.append(await many_run(env, size, replays, tasks, workers, urls))
    base = rows[0]["worker_cpu_s_per_1000_tasks"]
    for r in rows:
        r["cpu_over_first"] = r["worker_cpu_s_per_1000_tasks"] / base if base > 0 else float("inf")
    return {"rows": rows}


def lines(m: dict[str, Any]) -> list[str]:
    """Figure m's table: one line a row, then its slots."""
    rows = m["rows"]
    first = rows[0]["replays"]
    out = [
        "m. many replays of one stream, two workers, adaptive (x ideal = starts -> last task read over N / R; "
        f"targets: x ideal <= 1.1, CPU per task <= 1.2x the {first} row's; starts = the gather of every start)"
    ]
    for r in rows:
        out.append(
            f"m {r['row']:>11}: x ideal {r['over_ideal']:.2f}, wall/ideal {r['wall_over_ideal']:.2f}, "
            f"starts {r['starts_s']:.1f} s, worker CPU s / 1k tasks {r['worker_cpu_s_per_1000_tasks']:.3f} "
            f"({r['cpu_over_first']:.2f}x), Redis calls / 1k tasks {r['redis_calls_per_1000_tasks']:.0f}, "
            f"history events / 1k tasks {r['events_per_1000_tasks']:.0f} ({r['runs']} runs), "
            f"max backlog {r['max_backlog']} / {r['threshold']}, once {'yes' if r['exactly_once'] else 'NO'}"
        )
    for r in rows:
        slots = ", ".join(
            f"{name} {s['fewest_free']:.0f} ({s['none_free_share']:.0%} of readings none)"
            for name, s in r["slots"].items()
        )
        out.append(f"  {r['row']}: fewest free slots a worker: {slots or 'not read'}")
    return out
