"""Two workers, one stopped mid-run (issue 8, item 5): the other carries every replay to completion.

Several experiments are resumed while one ``python -m worker`` polls the task queue, so their
workflows are cached on it (sticky); a second worker joins, and the first is stopped, by SIGTERM
(graceful: exit 0) or SIGKILL, while each experiment still holds at least two thresholds' worth of
tasks, so none can finish without another throttle wait (each step waits for a condition). The
replays use the fixed policy: its durable timers end a workflow task at every wait (an adaptive
replay that only polls keeps one workflow task open, and a graceful stop would finish it on the
first worker). Every workflow
completes on the second worker, every task is delivered exactly once and each experiment's order
is kept: read from the task stream, from what the consumers read, and from the histories (the
identity of the worker that completed each workflow task).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
from redis.asyncio import Redis
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from bench.consumers import PacedConsumer, run_paced_consumer
from bench.env import BenchEnv, worker_process
from bench.scale import check_stream
from bench.tasks import hold_tasks
from tests.support.helpers import chain_histories, throttled, wait_for
from xmc_resumption.consumer import entries_of
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, ExperimentKeys
from xmc_resumption.runs import start_resumption
from xmc_resumption.workflows.models import ResumptionInput

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

EXPERIMENTS, TASKS, THRESHOLD = 3, 130, 30
RATE = 300
"""The consumers' rate (entries/s): faster than the replays, which wait 1 s per throttle."""


@pytest_asyncio.fixture
async def bench_env(  # type: ignore[no-untyped-def]
    temporal_env: WorkflowEnvironment, redis_url: str, task_queue: str, tmp_path: Path
) -> AsyncIterator[BenchEnv]:
    redis = Redis.from_url(redis_url, decode_responses=False)
    await redis.flushall()
    address = temporal_env.client.service_client.config.target_host
    yield BenchEnv(redis_url, address, temporal_env.client, redis, task_queue, tmp_path)
    await redis.aclose()


def identity(pid: int) -> str:
    """The SDK's default worker identity (``temporalio.service``): ``<pid>@<hostname>``."""
    return f"{pid}@{socket.gethostname()}"


async def task_completers(env: BenchEnv, handle) -> list[str]:  # type: ignore[no-untyped-def]
    """The identity of the worker that completed each workflow task of the chain, in order."""
    return [
        e.workflow_task_completed_event_attributes.identity
        for history in await chain_histories(env.client, handle)
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]


async def drain_once(env: BenchEnv, stream: str, record: PacedConsumer) -> int:
    """Read and acknowledge every entry the group has not been given yet, once (at most one
    threshold: the replays never put more in the stream); returns how many."""
    reply = await env.redis.xreadgroup(DEFAULT_GROUP, "c0", {stream: ">"}, count=THRESHOLD)
    entries = entries_of(reply)
    if entries:
        await env.redis.xack(stream, DEFAULT_GROUP, *[entry_id for entry_id, _ in entries])
    record.consumed += [int(fields.get(b"n", b"-1")) for _, fields in entries]
    return len(entries)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_a_worker_stopped_mid_run_loses_nothing(bench_env: BenchEnv, sig: signal.Signals) -> None:
    """Every step waits for a condition, never for a time, so a busy machine cannot break the
    set-up (it did, in 2 of 8 full runs, when the replays drained while the second worker took
    long to start): the replays are throttled at the shared threshold (nothing consumed yet) before
    the second worker starts; then one drain of one threshold's worth lets them publish once more,
    and the first worker is stopped while they do. At most two thresholds have moved by then, so
    every experiment still holds more than two thresholds' worth."""
    env, run_id = bench_env, uuid.uuid4().hex[:6]
    stream = f"workers-{run_id}"
    members = [ExperimentKeys(stream, f"W{i}-{run_id}") for i in range(EXPERIMENTS)]
    await env.redis.xgroup_create(stream, DEFAULT_GROUP, id="0", mkstream=True)
    for keys in members:
        await hold_tasks(env.redis, keys, TASKS)
    total = EXPERIMENTS * TASKS
    record, stop = PacedConsumer(RATE), asyncio.Event()
    consumer: asyncio.Task[None] | None = None
    inputs = [
        ResumptionInput(
            experiment_id=k.experiment_id,
            stream=stream,
            batch_size=THRESHOLD // 2,
            max_backlog_threshold=THRESHOLD,
            throttle_seconds=1,
        )
        for k in members
    ]
    try:
        async with AsyncExitStack() as stack:
            first = await stack.enter_async_context(worker_process(env, "worker-1"))
            handles = [await start_resumption(env.client, inp, env.task_queue) for inp in inputs]
            for handle in handles:  # each claimed on the first worker and waits at the full threshold
                await wait_for(handle, throttled, timeout=120)
            assert await env.redis.xlen(stream) == THRESHOLD
            second = await stack.enter_async_context(worker_process(env, "worker-2"))
            assert await drain_once(env, stream, record) == THRESHOLD  # the replays publish again
            held_at_stop = [await held.held_count(env.redis, k) for k in members]
            first.proc.send_signal(sig)
            assert min(held_at_stop) >= 2 * THRESHOLD, held_at_stop
            consumer = asyncio.create_task(run_paced_consumer(env.redis, stream, DEFAULT_GROUP, "c1", record, stop))
            results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
            stopped_rc = await asyncio.to_thread(first.proc.wait, 30)
            assert second.proc.poll() is None
            deadline = time.monotonic() + 60
            while len(record.consumed) < total and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        if consumer is not None:
            await consumer
    assert stopped_rc == (0 if sig is signal.SIGTERM else -signal.SIGKILL)
    assert [r.outcome.value for r in results] == ["completed"] * EXPERIMENTS
    assert sum(r.replayed for r in results) == total
    check = await check_stream(env, stream, {k.experiment_id: TASKS for k in members})
    assert (check.entries, check.duplicates, check.lost, check.out_of_order) == (total, 0, 0, 0)
    assert Counter(record.consumed) == Counter(n for _ in members for n in range(TASKS))
    for keys in members:
        assert await held.held_count(env.redis, keys) == 0
        assert (await held.get_state(env.redis, keys)).value == "running"
    # the first worker ran the replays before the stop, the second finished every one of them
    completers = [await task_completers(env, h) for h in handles]
    assert all(identity(first.pid) in c for c in completers), (identity(first.pid), completers)
    assert all(c[-1] == identity(second.pid) for c in completers), (identity(second.pid), completers)
