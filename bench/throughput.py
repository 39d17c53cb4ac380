"""Figure a: throughput with no throttling, the whole workflow against the bare atomic move.

A consumer group that has read everything (``caught_up``: its last-delivered-id moved to the
stream's end every millisecond, with its entries-read, as a consumer that reads everything keeps them)
and the threshold at its maximum (100,000): nothing throttles. (A missing group did this under the seed's
rule; now a missing group is waited for, or under ``zero`` the whole stream counts.) The
workflow's tasks/s (start -> result) is divided by the tasks/s of ``publish_batch`` called in a
tight loop from Python with the same seq/token protocol (a claim from ``acquire_claim``, then seq
1, 2, ... until ``completed``) against the same Redis, with the same N and batch. Runs alternate
(workflow, bare, workflow, bare, ...) and the best of each is kept. To show where a turn's time
goes, the turn's other two Redis calls (``check_claim``, ``measure_backlog``) are timed bare too:
Redis ms per turn = bare publish + check + measure; the rest of the workflow's ms per turn is
Temporal's (local activities, workflow tasks, the SDK).

The lagging rows (``lagging``, issue 25 item 3): the group is read by one fast consumer instead
(``XREADGROUP`` of ``LAGGING_COUNT`` entries, then a pause of ``LAGGING_PAUSE_S``), which falls a
little behind the publishes; the threshold (100,000) is above the tasks, so nothing throttles. The
workflow at the automatic batch and at 5,000 against the bare move of the same batch under the same
consumer (the automatic batch's is ``AUTO_BATCH``, what the workflow takes for these tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from redis.asyncio import Redis

from bench.env import BenchEnv
from bench.replay import WorkflowRun, build_input, run_resumption
from bench.tasks import check_replay, hold_tasks
from xmc_resumption.redisclient.backlog import measure_backlog
from xmc_resumption.redisclient.fencing import acquire_claim, check_claim
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams, publish_batch
from xmc_resumption.redisclient.results import PublishStatus
from xmc_resumption.redisclient.scripts import source

MAX_THRESHOLD = 100_000
LEASE_MS = 120_000


@dataclass
class MoveTiming:
    """One replay of N tasks: its times and counts.

    Wall seconds, turns (workflow) or publish calls (bare), exactly once, the longest publish script's Redis-side ms
    (``SLOWLOG``, calls of 5 ms or more; 0 when none).
    """

    wall_s: float
    steps: int
    exactly_once: bool
    events: int = 0
    largest_run_events: int = 0
    longest_script_ms: float = 0.0


@contextlib.asynccontextmanager
async def longest_script(redis: Redis) -> AsyncIterator[list[float]]:
    """In the block, Redis logs every call of 5 ms or more.

    After it, the list yielded holds the longest publish script's ms (0.0 when none).
    """
    publish_sha = hashlib.sha1(source("publish").encode()).hexdigest().encode()
    await redis.config_set("slowlog-max-len", "10000")
    await redis.config_set("slowlog-log-slower-than", "5000")
    await redis.slowlog_reset()
    out: list[float] = []
    try:
        yield out
    finally:
        raw = await redis.execute_command("SLOWLOG", "GET", "-1")
        out.append(max([e[2] / 1000 for e in raw if len(e[3]) > 1 and e[3][1] == publish_sha], default=0.0))
        await redis.config_set("slowlog-log-slower-than", "10000")
        await redis.slowlog_reset()


CAUGHT_UP_EVERY_S = 0.001
"""How often ``caught_up`` moves the group's last-delivered-id to the stream's end (seconds)."""


CATCH_UP = """
local added = 0
local f = redis.call('XINFO', 'STREAM', KEYS[1])
for i = 1, #f, 2 do if f[i] == 'entries-added' then added = f[i + 1] end end
return redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], '$', 'ENTRIESREAD', added)
"""
"""The group reads everything at once, its entries-read with it (a plain ``XGROUP SETID $`` leaves it NULL)."""


@contextlib.asynccontextmanager
async def caught_up(redis: Redis, stream: str) -> AsyncIterator[None]:
    """While in the block, the stream's consumer group has read everything.

    The group is ``DEFAULT_GROUP``, created at the stream's end: ``CATCH_UP`` every ``CAUGHT_UP_EVERY_S``, O(1).
    """
    await redis.xgroup_create(stream, DEFAULT_GROUP, id="$", mkstream=True)
    catch_up = redis.register_script(CATCH_UP)
    stop = asyncio.Event()

    async def keep() -> None:
        while not stop.is_set():
            await catch_up(keys=[stream], args=[DEFAULT_GROUP])
            await asyncio.sleep(CAUGHT_UP_EVERY_S)

    task = asyncio.create_task(keep())
    try:
        yield
    finally:
        stop.set()
        await task


LAGGING_COUNT = 2_000
LAGGING_PAUSE_S = 0.01
AUTO_BATCH = 500
"""The automatic batch for these tasks (``workflows.state``: about 128 KiB of tasks a script, at most 500)."""


@contextlib.asynccontextmanager
async def lagging(redis: Redis, stream: str) -> AsyncIterator[dict[str, int]]:
    """While in the block, one consumer reads the group and falls a little behind a fast publish.

    The group is created at the stream's end; the consumer reads ``LAGGING_COUNT`` entries at a time with
    ``LAGGING_PAUSE_S`` between reads, acknowledging on read. Yields a dict whose ``max_lag`` is the most it was
    behind when a read came back full.
    """
    await redis.xgroup_create(stream, DEFAULT_GROUP, id="$", mkstream=True)
    stop = asyncio.Event()
    seen = {"max_lag": 0, "reads": 0}

    async def consume() -> None:
        while not stop.is_set():
            got: Any = await redis.xreadgroup(DEFAULT_GROUP, "fast", {stream: ">"}, count=LAGGING_COUNT, noack=True)
            seen["reads"] += 1
            if got and len(got[0][1]) == LAGGING_COUNT:
                info = await redis.xinfo_groups(stream)
                seen["max_lag"] = max(seen["max_lag"], int(info[0]["lag"] or 0))
            await asyncio.sleep(LAGGING_PAUSE_S)

    task = asyncio.create_task(consume())
    try:
        yield seen
    finally:
        stop.set()
        await task


def _experiment(tag: str) -> ExperimentKeys:
    return ExperimentKeys(DEFAULT_STREAM, f"bench-{tag}-{uuid.uuid4().hex[:8]}")


async def workflow_move(env: BenchEnv, count: int, batch: int | None, consumer: str = "caught_up") -> MoveTiming:
    """Replay ``count`` held tasks through the workflow, unthrottled; returns its timing.

    ``batch`` None: the automatic batch. ``consumer``: ``caught_up`` or ``lagging``.
    """
    keys = _experiment("a-wf")
    await hold_tasks(env.redis, keys, count)
    fields = {"experiment_id": keys.experiment_id, "max_backlog_threshold": MAX_THRESHOLD}
    inp = build_input(fields if batch is None else {**fields, "batch_size": batch})
    async with CONSUMERS[consumer](env.redis, keys.stream), longest_script(env.redis) as longest:
        run: WorkflowRun = await run_resumption(env, inp)
    check = await check_replay(env.redis, keys, count)
    await env.redis.delete(keys.stream)
    return MoveTiming(run.wall_s, run.result.turns, check.exactly_once, run.events, run.largest_run_events, longest[0])


async def bare_move(env: BenchEnv, count: int, batch: int, consumer: str = "caught_up") -> MoveTiming:
    """Replay ``count`` held tasks by calling ``publish_batch`` in a tight loop; returns its timing."""
    keys = _experiment("a-bare")
    await hold_tasks(env.redis, keys, count)
    async with CONSUMERS[consumer](env.redis, keys.stream):
        started = time.monotonic()
        grant = await acquire_claim(env.redis, keys, owner="bench", lease_ms=LEASE_MS)
        seq = 0
        while True:
            seq += 1
            params = PublishParams(
                token=grant.token, seq=seq, batch_size=batch, threshold=MAX_THRESHOLD, owner="bench", lease_ms=LEASE_MS
            )
            result = await publish_batch(env.redis, keys, DEFAULT_GROUP, params)
            if result.status is PublishStatus.COMPLETED:
                break
            if result.status is not PublishStatus.PUBLISHED:
                raise RuntimeError(f"bare publish ended {result.status.value}")
        wall = time.monotonic() - started
    check = await check_replay(env.redis, keys, count)
    await env.redis.delete(keys.stream)
    return MoveTiming(wall, seq, check.exactly_once)


CONSUMERS = {"caught_up": caught_up, "lagging": lagging}


async def redis_ms_per_turn(env: BenchEnv, calls: int = 200) -> dict[str, float]:
    """Mean ms of a turn's other two Redis calls, made bare from Python.

    ``check_claim`` and ``measure_backlog``, as in a's unthrottled turns (a caught-up group), to split the
    workflow's ms per turn into Redis work and the rest (local activities, workflow tasks, the SDK).
    """
    keys = _experiment("a-turn")
    await hold_tasks(env.redis, keys, 1)
    grant = await acquire_claim(env.redis, keys, owner="bench", lease_ms=LEASE_MS)
    started = time.monotonic()
    for _ in range(calls):
        await check_claim(env.redis, keys, grant.token, "bench", LEASE_MS)
    check_ms = (time.monotonic() - started) / calls * 1000
    async with caught_up(env.redis, keys.stream):
        started = time.monotonic()
        for _ in range(calls):
            await measure_backlog(env.redis, keys.stream, DEFAULT_GROUP, MAX_THRESHOLD)
        measure_ms = (time.monotonic() - started) / calls * 1000
    await env.redis.delete(keys.held, keys.state, keys.claim, keys.stream)
    return {"check_claim_ms": check_ms, "measure_backlog_ms": measure_ms}


async def throughput(env: BenchEnv, count: int, batches: tuple[int, ...], repeats: int) -> list[dict[str, object]]:
    """Figure a for each batch size: best-of-``repeats`` tasks/s of workflow and bare, and their ratio."""
    rows: list[dict[str, object]] = []
    for batch in batches:
        wf_runs: list[MoveTiming] = []
        bare_runs: list[MoveTiming] = []
        for _ in range(repeats):
            wf_runs.append(await workflow_move(env, count, batch))
            bare_runs.append(await bare_move(env, count, batch))
        wf = min(wf_runs, key=lambda t: t.wall_s)
        bare = min(bare_runs, key=lambda t: t.wall_s)
        other = await redis_ms_per_turn(env)
        redis_turn_ms = bare.wall_s / bare.steps * 1000 + other["check_claim_ms"] + other["measure_backlog_ms"]
        rows.append(
            {
                "batch": batch,
                "tasks": count,
                "repeats": repeats,
                "workflow_tasks_per_s": count / wf.wall_s,
                "bare_tasks_per_s": count / bare.wall_s,
                "ratio": bare.wall_s / wf.wall_s,
                "workflow_ms_per_turn": wf.wall_s / wf.steps * 1000,
                "bare_ms_per_publish": bare.wall_s / bare.steps * 1000,
                "bare_ms_check_and_measure": other,
                "redis_ms_per_turn": redis_turn_ms,
                "other_ms_per_turn": wf.wall_s / wf.steps * 1000 - redis_turn_ms,
                "exactly_once": all(t.exactly_once for t in wf_runs + bare_runs),
                "longest_script_ms": max(t.longest_script_ms for t in wf_runs),
                "workflow_runs": [asdict(t) for t in wf_runs],
                "bare_runs": [asdict(t) for t in bare_runs],
            }
        )
    return rows


async def lagging_rows(
    env: BenchEnv, count: int, batches: tuple[int | None, ...], repeats: int
) -> list[dict[str, object]]:
    """The lagging rows: best-of-``repeats`` workflow and bare move under one fast consumer.

    The consumer falls behind a little; per batch (None: the automatic batch; the bare move's is ``AUTO_BATCH``).
    """
    rows: list[dict[str, object]] = []
    for batch in batches:
        wf = min([await workflow_move(env, count, batch, "lagging") for _ in range(repeats)], key=lambda t: t.wall_s)
        bare_batch = AUTO_BATCH if batch is None else batch
        bare = min([await bare_move(env, count, bare_batch, "lagging") for _ in range(repeats)], key=lambda t: t.wall_s)
        rows.append(
            {
                "batch": "auto" if batch is None else batch,
                "tasks": count,
                "workflow_tasks_per_s": count / wf.wall_s,
                "bare_tasks_per_s": count / bare.wall_s,
                "ratio": bare.wall_s / wf.wall_s,
                "exactly_once": wf.exactly_once and bare.exactly_once,
                "longest_script_ms": wf.longest_script_ms,
            }
        )
    return rows
