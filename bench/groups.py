"""Two consumer groups on one stream (issue 14, item 2): ``python -m bench.groups``.

The task stream is read by the main group ``xmc-workers`` (a consumer as fast as Redis answers)
and by a second group ``audit`` (one consumer at ``--audit-rate`` tasks/s). N held tasks are
replayed at a threshold T twice, side by side in one run, each on a fresh stream, with the same
dev server and worker process:

- ``one group``: ``consumer_groups: [xmc-workers]``, the seed's rule (the replay sees only its group);
- ``every group``: the default (``consumer_groups`` None): the largest backlog of every group bounds it.

A sampler reads each group's exact backlog (``measure_backlog`` of that group alone, threshold far
above T) every ``SAMPLE_SECONDS`` until the replay ends, and the run prints, per case, the highest
backlog seen per group, the replay's wall time and its outcome, as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
import uuid
from typing import Any

from bench.env import BenchEnv, bench_services, worker_process
from bench.tasks import hold_tasks
from xmc_resumption.consumer import run_consumer
from xmc_resumption.redisclient.backlog import measure_backlog
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys
from xmc_resumption.runs import start_resumption
from xmc_resumption.workflows.models import ResumptionInput

AUDIT = "audit"
EXACT_THRESHOLD = 100_000
"""The sampler's threshold: far above the replay's, so each count is exact."""
SAMPLE_SECONDS = 0.01
"""Pause between two samples of both groups (seconds)."""


async def _sample(env: BenchEnv, groups: list[str], stop: asyncio.Event) -> dict[str, int]:
    """The highest exact backlog of each of ``groups`` seen until ``stop`` (entries)."""
    peak = dict.fromkeys(groups, 0)
    while not stop.is_set():
        for group in groups:
            reading = await measure_backlog(env.redis, DEFAULT_STREAM, group, EXACT_THRESHOLD, groups=[group])
            peak[group] = max(peak[group], reading.backlog)
        await asyncio.sleep(SAMPLE_SECONDS)
    return peak


async def one_case(
    env: BenchEnv, name: str, consumer_groups: list[str] | None, args: argparse.Namespace
) -> dict[str, Any]:
    """Replay ``args.tasks`` tasks with both groups reading; returns the peaks per group and the timing."""
    await env.redis.delete(DEFAULT_STREAM)
    for group in (DEFAULT_GROUP, AUDIT):
        await env.redis.xgroup_create(DEFAULT_STREAM, group, id="$", mkstream=True)
    keys = ExperimentKeys(DEFAULT_STREAM, f"groups-{name.replace(' ', '-')}-{uuid.uuid4().hex[:6]}")
    await hold_tasks(env.redis, keys, args.tasks)
    stop, seen_main, seen_audit = asyncio.Event(), [], []  # type: ignore[var-annotated]
    consumers = [
        asyncio.create_task(
            run_consumer(env.redis, DEFAULT_STREAM, DEFAULT_GROUP, "main-1", stop, seen_main, count=100)
        ),
        asyncio.create_task(
            run_consumer(env.redis, DEFAULT_STREAM, AUDIT, "audit-1", stop, seen_audit, count=10, rate=args.audit_rate)
        ),
    ]
    sampling = asyncio.Event()
    sampler = asyncio.create_task(_sample(env, [DEFAULT_GROUP, AUDIT], sampling))
    inp = ResumptionInput(
        experiment_id=keys.experiment_id,
        max_backlog_threshold=args.threshold,
        batch_size=100,
        throttle_seconds=1.0,
        consumer_groups=consumer_groups,
    )
    started = time.monotonic()
    handle = await start_resumption(env.client, inp, env.task_queue)
    result = await handle.result()
    wall = time.monotonic() - started
    sampling.set()
    peak = await sampler
    stop.set()
    await asyncio.gather(*consumers)
    return {
        "case": name,
        "consumer_groups": consumer_groups,
        "outcome": result.outcome.value,
        "replayed": result.replayed,
        "wall_s": round(wall, 2),
        "max_backlog": peak,
        "threshold": args.threshold,
    }


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Both cases on one set of services."""
    async with bench_services() as env, worker_process(env):
        return [
            await one_case(env, "one group", [DEFAULT_GROUP], args),
            await one_case(env, "every group", None, args),
        ]


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run both cases, print the rows as JSON."""
    parser = argparse.ArgumentParser(prog="python -m bench.groups", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=3_000, help="held tasks per case (default 3,000)")
    parser.add_argument("--threshold", type=int, default=500, help="max_backlog_threshold (default 500)")
    parser.add_argument("--audit-rate", type=float, default=50.0, help="the audit group's tasks/s (default 50)")
    rows = asyncio.run(run(parser.parse_args(argv)))
    gc.collect()  # sdk-python#300: a process that used the SDK may abort at exit without it
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
