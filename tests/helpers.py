"""Shared test helpers: a worker for the resumption on a test environment, held tasks, consumers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from redis.asyncio import Redis
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from activities.resumption import ResumptionActivities
from redisclient import held
from redisclient.keys import ExperimentKeys
from workflows.models import Phase, Progress, ResumptionInput
from workflows.resumption import ResumptionWorkflow
from xmc.consumer import run_consumer

STREAM = "xmc-tasks-stream"
GROUP = "xmc-workers"


@asynccontextmanager
async def resumption_worker(client: Client, task_queue: str, redis_url: str) -> AsyncIterator[Worker]:
    """Run a worker with the workflow and its activities (its own Redis client) while in the block."""
    redis = Redis.from_url(redis_url, decode_responses=False)
    try:
        async with Worker(
            client, task_queue=task_queue, workflows=[ResumptionWorkflow], activities=ResumptionActivities(redis).all()
        ) as worker:
            yield worker
    finally:
        await redis.aclose()


async def start(client: Client, task_queue: str, **fields: object) -> WorkflowHandle:
    """Start ``ResumptionWorkflow`` with ``ResumptionInput(**fields)`` under the conventional ID."""
    inp = ResumptionInput.model_validate(fields)
    return await client.start_workflow(
        ResumptionWorkflow.run, inp, id=f"resumption-{inp.experiment_id}", task_queue=task_queue
    )


async def hold_tasks(redis: Redis, experiment_id: str, n: int, start: int = 0) -> list[bytes]:
    """Pause the experiment and hold tasks t<start>..t<start+n-1>; returns their names."""
    keys = ExperimentKeys(STREAM, experiment_id)
    await held.pause(redis, keys)
    names = [f"{experiment_id}-t{i}".encode() for i in range(start, start + n)]
    for name in names:
        await held.enqueue_task(redis, keys, {b"task": name})
    return names


async def fill_backlog(redis: Redis, n: int) -> None:
    """Create the group at the stream's end and add ``n`` undelivered entries that are not held tasks."""
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    for i in range(n):
        await redis.xadd(STREAM, {b"task": f"other-{i}".encode()})


async def stream_tasks(redis: Redis) -> list[bytes]:
    """The ``task`` field of every entry in the task stream, in order."""
    return [fields[b"task"] for _, fields in await redis.xrange(STREAM)]


async def wait_for(handle: WorkflowHandle, ok: Callable[[Progress], bool], timeout: float = 20) -> Progress:
    """Poll the ``progress`` query until ``ok(progress)``; raises TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            progress = await handle.query(ResumptionWorkflow.progress)
            if ok(progress):
                return progress
        except Exception:  # the first workflow task may not have run yet
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("progress never reached the expected state")
        await asyncio.sleep(0.05)


def throttled(progress: Progress) -> bool:
    return progress.phase is Phase.THROTTLED


async def consume(
    redis: Redis, name: str, stop: asyncio.Event, out: list[bytes], per_read: int = 10, rate: float | None = None
) -> None:
    """A task worker on ``STREAM`` in ``GROUP``: see ``xmc.consumer.run_consumer``."""
    await run_consumer(redis, STREAM, GROUP, name, stop, out, count=per_read, rate=rate)


@asynccontextmanager
async def redis_outage(redis: Redis) -> AsyncIterator[None]:
    """Redis refuses every client but the test's own: authentication required, connections dropped."""
    await redis.config_set("requirepass", "outage")
    try:
        await redis.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        yield
    finally:
        await redis.config_set("requirepass", "")
