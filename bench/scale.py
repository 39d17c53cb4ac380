"""Figure g: many replayers on one threshold (issue 8, items 3 and 4).

Many experiments, each holding its own tasks, are resumed at once on one task stream and one
consumer group, under two ``python -m worker`` processes polling the task queue, while paced
consumers (``bench.consumers``) drain the stream at a fixed rate R. A sampler in its own process
(``bench.sampler``) reads the group's exact backlog (pending + lag, ``measure_backlog``) every few
milliseconds. Reported per row:

- wall time, workflow starts -> last result, over the ideal total tasks / R (R measured on a full
  stream just before, ``calibrate``);
- the highest sampled backlog against the threshold, the longest gap between two samples;
- exactly once: every experiment's tasks are in the task stream once each, in order (one pass over
  the stream), nothing held, every experiment running, every run ``completed``, no fair-share
  replayer left registered; the consumers read as many tasks as were held, and each task number
  as often as experiments hold it;
- CPU: the two workers' and the redis-server's CPU seconds during the row (Redis's per 1,000 tasks:
  what bounds one stream, which lives on one Redis node and one core);
- fairness: the spread of the experiments' completion times (first / median / last result, last
  over first), per group of experiments when a row mixes them.

Rows are compared side by side in one run: the throttle policies on equal experiments (item 3),
then the fairness case (one experiment whose batch is the whole threshold, five times the others')
without and with the fair share of the headroom (item 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.consumers import PacedConsumer, calibrate, run_paced_consumer
from bench.env import BenchEnv, WorkerProcess, worker_process
from bench.replay import build_input, chain_lengths
from bench.sampler import sampler_process
from bench.tasks import READ_CHUNK, hold_tasks
from xmc_resumption.redisclient import held, weights
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, ExperimentKeys, replayers_key, weights_key
from xmc_resumption.runs import start_resumption

CONSUMERS = 2
"""Paced consumers sharing the rate R (entries/s each: R / CONSUMERS)."""

DRAIN_TIMEOUT_S = 120.0
"""How long after the last result the consumers may take to read the last tasks (seconds)."""


@dataclass(frozen=True)
class Group:
    """Experiments of one kind in a row: how many, tasks each (entries), their batch size (entries)."""

    experiments: int
    tasks: int
    batch: int


@dataclass(frozen=True)
class ScaleCase:
    """One row of figure g.

    Attributes:
        name: the row's label (``equal``, ``greedy``).
        groups: the experiments, resumed at once.
        policy: ``fixed`` or ``adaptive``.
        fair_share: the replays take a fair share of the headroom (the input's ``fair_share``).
    """

    name: str
    groups: tuple[Group, ...]
    policy: str
    fair_share: bool = False

    @property
    def tasks(self) -> int:
        """Tasks held over all experiments (entries)."""
        return sum(g.experiments * g.tasks for g in self.groups)


@dataclass(frozen=True)
class ScaleSize:
    """The size of figure g.

    Experiments and tasks of the equal rows, consumer rate R (entries/s), threshold (entries), the fixed policy's
    wait and the adaptive policy's longest wait (seconds).
    """

    experiments: int
    tasks: int
    rate: float
    threshold: int = 500
    throttle_seconds: float = 1.0

    def cases(self, policies: tuple[str, ...]) -> list[ScaleCase]:
        """The equal rows, then the fairness rows.

        The equal rows: one per policy, then adaptive with the fair share; batch a fifth of the threshold (100 at
        500). The fairness rows: one experiment publishes batches of the whole threshold, the others a fifth of it;
        adaptive, without and with the fair share.
        """
        batch = max(1, self.threshold // 5)
        equal = (Group(self.experiments, self.tasks, batch),)
        greedy = (Group(self.experiments - 1, self.tasks, batch), Group(1, self.tasks, self.threshold))
        rows = [ScaleCase("equal", equal, policy) for policy in policies]
        rows.append(ScaleCase("equal", equal, "adaptive", fair_share=True))
        rows += [ScaleCase("greedy", greedy, "adaptive", fair) for fair in (False, True)]
        return rows


FULL_SIZE = ScaleSize(experiments=50, tasks=2_000, rate=2_000)
SMOKE_SIZE = ScaleSize(experiments=10, tasks=200, rate=1_000, threshold=100)


def scale_input(experiment_id: str, stream: str, group: Group, case: ScaleCase, size: ScaleSize) -> dict[str, Any]:
    """The workflow input as a dict; ``throttle_policy`` and ``fair_share`` only when not the default."""
    fields: dict[str, Any] = {
        "experiment_id": experiment_id,
        "stream": stream,
        "batch_size": group.batch,
        "max_backlog_threshold": size.threshold,
        "throttle_seconds": size.throttle_seconds,
    }
    if case.policy != "fixed":
        fields["throttle_policy"] = case.policy
    if case.fair_share:
        fields["fair_share"] = True
    return fields


@dataclass
class StreamCheck:
    """What one pass over the task stream found.

    Attributes:
        entries: entries in the stream.
        duplicates: entries naming a task already seen.
        lost: held tasks not in the stream.
        out_of_order: experiments whose tasks are not 0..n-1 in stream order.
    """

    entries: int
    duplicates: int
    lost: int
    out_of_order: int


async def check_stream(env: BenchEnv, stream: str, expected: dict[str, int]) -> StreamCheck:
    """Read ``stream`` once, oldest first, and check each experiment's tasks are all there, in order.

    Each experiment's task numbers must be 0..``expected[e]``-1 in order (tasks carry ``task`` = ``E:n`` and ``n``,
    ``bench.tasks``).
    """
    seen: dict[str, list[int]] = defaultdict(list)
    entries, start = 0, "-"
    while True:
        chunk: list[Any] = await env.redis.xrange(stream, min=start, count=READ_CHUNK) or []
        for _, fields in chunk:
            experiment = fields[b"task"].decode().rsplit(":", 1)[0]
            seen[experiment].append(int(fields[b"n"]))
        entries += len(chunk)
        if len(chunk) < READ_CHUNK:
            break
        start = "(" + chunk[-1][0].decode()
    duplicates = sum(len(ns) - len(set(ns)) for ns in seen.values())
    lost = sum(len(set(range(n)) - set(seen.get(e, []))) for e, n in expected.items())
    out_of_order = sum(seen.get(e, []) != list(range(n)) for e, n in expected.items())
    return StreamCheck(entries, duplicates, lost, out_of_order + len(set(seen) - set(expected)))


def spread(finish: list[float]) -> dict[str, float]:
    """First, median and last completion time (seconds from the starts) and last over first."""
    first, last = min(finish), max(finish)
    return {
        "first_s": first,
        "median_s": statistics.median(finish),
        "last_s": last,
        "last_over_first": last / first if first > 0 else float("inf"),
    }


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used so far, in seconds (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def redis_cpu_seconds(env: BenchEnv) -> float:
    """CPU time (user + system) the redis-server has used so far (``INFO cpu``), in seconds."""
    info = await env.redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _timed_result(handle: Any, started: float) -> tuple[float, Any]:
    """A workflow's result and when it came (seconds after ``started``)."""
    result = await handle.result()
    return time.monotonic() - started, result


async def scale_run(
    env: BenchEnv, case: ScaleCase, size: ScaleSize, workers: tuple[WorkerProcess, ...] = (), history: bool = False
) -> dict[str, Any]:
    """One row of figure g, under the workers already polling ``env.task_queue``.

    ``workers``: those whose CPU time the row reports. ``history``: count every run's history events too
    (``events``, ``runs``, ``largest_run_events``; one call a run, after the wall time).
    ``starts_s`` is how long the ``asyncio.gather`` of every start took (counted in the wall time).
    """
    run_id = uuid.uuid4().hex[:8]
    stream = f"bench-scale-{run_id}"
    members: list[tuple[ExperimentKeys, Group]] = [
        (ExperimentKeys(stream, f"{case.name}-{gi}-{i:02d}-{run_id}"), g)
        for gi, g in enumerate(case.groups)
        for i in range(g.experiments)
    ]
    inputs = [build_input(scale_input(k.experiment_id, stream, g, case, size)) for k, g in members]
    rate = sum([await calibrate(env.redis, size.rate / CONSUMERS, False) for _ in range(CONSUMERS)])
    await env.redis.xgroup_create(stream, DEFAULT_GROUP, id="0", mkstream=True)
    for keys, g in members:
        await hold_tasks(env.redis, keys, g.tasks)
    stop = asyncio.Event()
    records = [PacedConsumer(size.rate / CONSUMERS) for _ in range(CONSUMERS)]
    consumers = [
        asyncio.create_task(run_paced_consumer(env.redis, stream, DEFAULT_GROUP, f"c{i}", r, stop))
        for i, r in enumerate(records)
    ]
    try:
        async with sampler_process(env.redis_url, members[0][0], DEFAULT_GROUP) as sampler:
            cpu_before = [cpu_seconds(w.pid) for w in workers], await redis_cpu_seconds(env)
            started = time.monotonic()
            handles = await asyncio.gather(*(start_resumption(env.client, inp, env.task_queue) for inp in inputs))
            starts = time.monotonic() - started
            timed = await asyncio.gather(*(_timed_result(h, started) for h in handles))
            wall = time.monotonic() - started
            worker_cpu = sum(cpu_seconds(w.pid) for w in workers) - sum(cpu_before[0])
            redis_cpu = await redis_cpu_seconds(env) - cpu_before[1]
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while sum(len(r.consumed) for r in records) < case.tasks and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            drained = max((r.last_s or started) for r in records) - started
    finally:
        stop.set()
        await asyncio.gather(*consumers)
    per_run = [n for chain in await chain_lengths(env.client, handles) for n in chain] if history else []
    check = await check_stream(env, stream, {k.experiment_id: g.tasks for k, g in members})
    consumed = Counter(n for r in records for n in r.consumed)
    expected = Counter(n for _, g in members for n in range(g.tasks))
    held_left = sum([await held.held_count(env.redis, k) for k, _ in members])
    running = [(await held.get_state(env.redis, k)).value == "running" for k, _ in members]
    replayers_left = len(await weights.active_replayers(env.redis, stream))
    await env.redis.delete(stream, replayers_key(stream), weights_key(stream))
    outcomes = Counter(result.outcome.value for _, result in timed)
    finish = [t for t, _ in timed]
    by_group: dict[str, dict[str, float]] = {}
    for g in case.groups:
        times = [t for (t, _), (_, mg) in zip(timed, members, strict=True) if mg is g]
        by_group[f"{g.experiments}x{g.tasks} batch {g.batch}"] = spread(times)
    samples = sampler.samples
    return {
        "case": case.name,
        "policy": case.policy,
        "fair_share": case.fair_share,
        "experiments": len(members),
        "tasks": case.tasks,
        "threshold": size.threshold,
        "rate_target": size.rate,
        "rate_measured": rate,
        "wall_s": wall,
        "starts_s": starts,
        "ideal_s": case.tasks / rate,
        "wall_over_ideal": wall * rate / case.tasks,
        "drained_s": drained,
        "worker_cpu_s": worker_cpu,
        "redis_cpu_s": redis_cpu,
        "redis_cpu_ms_per_1000_tasks": redis_cpu / case.tasks * 1e6,
        **({"events": sum(per_run), "runs": len(per_run), "largest_run_events": max(per_run)} if history else {}),
        "max_backlog": samples.max_backlog,
        "samples": samples.samples,
        "max_sample_gap_ms": samples.max_gap_s * 1000,
        "sample_gaps_over_10ms": samples.gaps_over_10ms,
        "finish": spread(finish),
        "finish_by_group": by_group,
        "throttles": sum(result.throttles for _, result in timed),
        "outcomes": dict(outcomes),
        "stream_entries": check.entries,
        "duplicates": check.duplicates,
        "lost": check.lost,
        "out_of_order": check.out_of_order,
        "held_left": held_left,
        "replayers_left": replayers_left,
        "exactly_once": check.entries == case.tasks
        and check.duplicates == check.lost == check.out_of_order == held_left == replayers_left == 0
        and all(running)
        and outcomes == Counter({"completed": len(members)})
        and consumed == expected,
    }


@contextlib.asynccontextmanager
async def two_workers(env: BenchEnv) -> AsyncIterator[tuple[WorkerProcess, WorkerProcess]]:
    """Two ``python -m worker`` processes polling ``env.task_queue`` for the block; yields both."""
    async with worker_process(env, "scale-worker-1") as first, worker_process(env, "scale-worker-2") as second:
        yield first, second


async def scale(env: BenchEnv, size: ScaleSize, policies: tuple[str, ...]) -> list[dict[str, Any]]:
    """Figure g: every row of ``size.cases(policies)`` under two fresh workers, in that order."""
    async with two_workers(env) as workers:
        return [await scale_run(env, case, size, workers) for case in size.cases(policies)]
