"""Figure d: the worker's peak RSS replaying 1e4 and 1e6 held tasks (no throttling, batch 1,000).

A fresh ``python -m worker`` per size; its ``VmHWM`` (``/proc/<pid>/status``) is read once it polls
and again after the replay's result. A consumer group kept caught up (``throughput.caught_up``) and the
maximum threshold, so nothing throttles (with no group at all the replay would wait for one, the
default ``missing_group: wait``); the held stream is filled by pipelined XADDs.
"""

from __future__ import annotations

import uuid
from typing import Any

from bench.env import BenchEnv, worker_process
from bench.replay import build_input, run_resumption
from bench.tasks import check_replay, hold_tasks
from bench.throughput import MAX_THRESHOLD, caught_up
from xmc_resumption.redisclient.keys import DEFAULT_STREAM, ExperimentKeys

BATCH = 1_000
FULL_SIZES = (10_000, 1_000_000)
SMOKE_SIZES = (1_000, 5_000)


async def memory_run(env: BenchEnv, count: int) -> dict[str, Any]:
    """Replay ``count`` tasks under a fresh worker; its peak RSS before and after (MiB)."""
    keys = ExperimentKeys(DEFAULT_STREAM, f"bench-d-{uuid.uuid4().hex[:8]}")
    await env.redis.delete(keys.stream)
    await hold_tasks(env.redis, keys, count)
    inp = build_input(
        {"experiment_id": keys.experiment_id, "batch_size": BATCH, "max_backlog_threshold": MAX_THRESHOLD}
    )
    async with worker_process(env, name=f"worker-d-{count}") as worker, caught_up(env.redis, keys.stream):
        idle_mib = worker.peak_rss_mib()
        run = await run_resumption(env, inp)
        peak_mib = worker.peak_rss_mib()
        rss_mib = worker.rss_mib()
    check = await check_replay(env.redis, keys, count)
    await env.redis.delete(keys.stream)
    return {
        "tasks": count,
        "batch": BATCH,
        "peak_rss_mib_idle": idle_mib,
        "peak_rss_mib": peak_mib,
        "rss_mib_after": rss_mib,
        "wall_s": run.wall_s,
        "turns": run.result.turns,
        "runs": run.result.runs,
        "events": run.events,
        "largest_run_events": run.largest_run_events,
        "exactly_once": check.exactly_once,
    }


async def worker_memory(env: BenchEnv, sizes: tuple[int, ...]) -> dict[str, Any]:
    """Figure d: a row per size and the ratio peak RSS(largest) / peak RSS(smallest)."""
    rows = [await memory_run(env, count) for count in sizes]
    return {
        "rows": rows,
        "ratio": rows[-1]["peak_rss_mib"] / rows[0]["peak_rss_mib"],
        "ratio_label": f"{rows[-1]['tasks']} / {rows[0]['tasks']} tasks",
    }
