"""Figure r: what replica acknowledgements cost (``XMC_REPLICA_ACKS``), with and without, in one run.

A replica of the run's redis-server (``REPLICAOF`` on loopback) is started and synced. Rows, each
measured plain and acknowledged (``WAIT 1`` after every claim, publish and release, and after every
enqueue), alternating, best of the repeats:

- ``replay``: the whole workflow replaying N held tasks unthrottled (a caught-up group, the
  threshold at its maximum: figure a's set-up) under two workers that differ only in
  ``XMC_REPLICA_ACKS`` (``0`` and ``1``), each on its own task queue;
- ``bare publish``: ``publish_batch`` in a tight loop from Python (figure a's bare move);
- ``enqueue``: producers' enqueue calls of ``ENQUEUE_BATCH`` tasks.

Which of the two goes first alternates from repeat to repeat. The ratio is acknowledged / plain
tasks per second. Both servers run without persistence here
(the bench's own redis-server), so the ratio is WAIT's round trip to the replica alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import Redis

from bench.env import BenchEnv, worker_process
from bench.throughput import MAX_THRESHOLD, MoveTiming, bare_move, workflow_move
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.connection import ReplicaAcks, require_replica_acks
from xmc_resumption.redisclient.keys import DEFAULT_STREAM, ExperimentKeys
from xmc_resumption.services import local_redis

ACKS = ReplicaAcks(replicas=1, timeout_ms=1_000)
"""The acknowledged rows' setting: one replica, 1 s."""

ENQUEUE_BATCH = 100
"""Tasks per enqueue call in the enqueue row."""

BATCHES = (100, 500)
T = TypeVar("T")
"""Publish batch sizes of the replay and bare rows (500: the automatic batch's largest)."""


@contextlib.asynccontextmanager
async def replica_of(env: BenchEnv) -> AsyncIterator[Redis]:
    """A redis-server replicating the run's own, in sync, for the block (a client to it)."""
    port = env.redis.connection_pool.connection_kwargs["port"]
    with local_redis(log_file=env.log_dir / "redis-replica.log") as url:
        replica = Redis.from_url(url, decode_responses=False)
        await env.redis.config_set("repl-diskless-sync-delay", 0)
        await replica.execute_command("REPLICAOF", "127.0.0.1", port)
        deadline = time.monotonic() + 30
        while (await replica.info("replication")).get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise TimeoutError("the bench's replica did not sync within 30 s")
            await asyncio.sleep(0.05)
        try:
            yield replica
        finally:
            await replica.execute_command("REPLICAOF", "NO", "ONE")
            await replica.aclose()


async def _pairs(
    repeats: int, plain: Callable[[], Awaitable[T]], acked: Callable[[], Awaitable[T]]
) -> tuple[list[T], list[T]]:
    """``repeats`` runs of each, alternating which goes first."""
    plain_runs: list[T] = []
    acked_runs: list[T] = []
    for i in range(repeats):
        if i % 2:
            acked_runs.append(await acked())
            plain_runs.append(await plain())
        else:
            plain_runs.append(await plain())
            acked_runs.append(await acked())
    return plain_runs, acked_runs


async def _enqueue(client: Redis, tasks: int) -> float:
    """Seconds to enqueue ``tasks`` held tasks in calls of ``ENQUEUE_BATCH``, each task with a key."""
    keys = ExperimentKeys(DEFAULT_STREAM, f"bench-r-enqueue-{time.monotonic_ns()}")
    await held.pause(client, keys)
    started = time.monotonic()
    for first in range(0, tasks, ENQUEUE_BATCH):
        names = [f"t{i}" for i in range(first, min(tasks, first + ENQUEUE_BATCH))]
        await held.enqueue_tasks(client, keys, [{"task": n} for n in names], names)
    wall = time.monotonic() - started
    await client.delete(keys.held, keys.state, keys.idempotency, keys.idempotency_previous)
    return wall


def _row(what: str, batch: int, tasks: int, plain: list[MoveTiming], acked: list[MoveTiming]) -> dict[str, Any]:
    best_plain, best_acked = min(t.wall_s for t in plain), min(t.wall_s for t in acked)
    return {
        "what": what,
        "batch": batch,
        "tasks": tasks,
        "plain_tasks_per_s": tasks / best_plain,
        "acked_tasks_per_s": tasks / best_acked,
        "ratio": best_plain / best_acked,
        "exactly_once": all(t.exactly_once for t in plain + acked),
        "plain_runs": [dataclasses.asdict(t) for t in plain],
        "acked_runs": [dataclasses.asdict(t) for t in acked],
    }


async def replicas(env: BenchEnv, tasks: int, repeats: int) -> dict[str, Any]:
    """Figure r: rows of tasks/s plain and acknowledged, and their ratio (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    async with replica_of(env) as replica:
        acked_env = dataclasses.replace(env, task_queue=f"{env.task_queue}-acks")
        acked_redis = Redis.from_url(env.redis_url, decode_responses=False, socket_timeout=None)
        require_replica_acks(acked_redis, ACKS)
        acked_bare = dataclasses.replace(env, redis=acked_redis)
        try:
            async with (
                worker_process(env, "worker-r-plain"),
                worker_process(acked_env, "worker-r-acks", {"XMC_REPLICA_ACKS": str(ACKS.replicas)}),
            ):
                await workflow_move(env, 200, 100)  # warm-up, both workers
                await workflow_move(acked_env, 200, 100)
                for batch in BATCHES:
                    plain, acked = await _pairs(
                        repeats,
                        functools.partial(workflow_move, env, tasks, batch),
                        functools.partial(workflow_move, acked_env, tasks, batch),
                    )
                    rows.append(_row("replay", batch, tasks, plain, acked))
            await bare_move(env, 200, 100)  # warm-up, both clients
            await bare_move(acked_bare, 200, 100)
            for batch in BATCHES:
                plain, acked = await _pairs(
                    repeats,
                    functools.partial(bare_move, env, tasks, batch),
                    functools.partial(bare_move, acked_bare, tasks, batch),
                )
                rows.append(_row("bare publish", batch, tasks, plain, acked))
            calls = -(-tasks // ENQUEUE_BATCH)

            async def enqueue(client: Redis) -> MoveTiming:
                return MoveTiming(await _enqueue(client, tasks), calls, True)

            plain, acked = await _pairs(repeats, lambda: enqueue(env.redis), lambda: enqueue(acked_redis))
            rows.append(_row("enqueue", ENQUEUE_BATCH, tasks, plain, acked))
            lag = (await replica.info("replication")).get("master_link_status")
        finally:
            await acked_redis.aclose()
    return {"rows": rows, "replica_link": lag, "acks": dataclasses.asdict(ACKS), "threshold": MAX_THRESHOLD}


def lines(r: dict[str, Any]) -> list[str]:
    """Figure r's table."""
    out = [
        f"r. replica acknowledgements (WAIT {r['acks']['replicas']} after each write script), best of repeats; "
        "ratio = acknowledged tasks/s / plain tasks/s"
    ]
    out.append(f"{'what':<13} {'batch':>6} {'tasks':>7} {'plain tasks/s':>14} {'acked tasks/s':>14} {'ratio':>6} "
               f"{'once':>5}")  # fmt: skip
    for row in r["rows"]:
        out.append(
            f"{row['what']:<13} {row['batch']:>6} {row['tasks']:>7} {row['plain_tasks_per_s']:>14.0f} "
            f"{row['acked_tasks_per_s']:>14.0f} {row['ratio']:>6.3f} {'yes' if row['exactly_once'] else 'NO':>5}"
        )
    return out
