"""No query waits behind a long poll (issue 16, item 8): on the dev server an adaptive replay runs
its polls and publishes back to back, and the ``progress`` query is answered within about a second
throughout (it waited up to 6.2 s while one workflow task ran local activities for 8 s)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from tests.support.helpers import (
    GROUP,
    STREAM,
    consume,
    hold_tasks,
    redis_calls,
    resumption_worker,
    start,
    stream_tasks,
    wait_for,
)
from xmc_resumption.workflows.calls import TASK_BUDGET_SECONDS
from xmc_resumption.workflows.models import Outcome
from xmc_resumption.workflows.resumption import ResumptionWorkflow

QUERY_BOUND_SECONDS = 1.0
"""The longest a query may wait: the task budget, one Redis call and the query's round trip."""


@pytest.mark.real_server
@pytest.mark.slow
@pytest.mark.heavy  # measures latencies: beside no other heavy test
async def test_the_progress_query_is_answered_promptly_during_polls(temporal_env, redis, redis_url, task_queue) -> None:
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 2_000)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=10, rate=250))
    latencies: list[float] = []
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=100,
            batch_size=50,
            throttle_policy="adaptive",
        )
        await wait_for(handle, lambda p: p.turns >= 3)
        running = asyncio.create_task(handle.result())
        while not running.done():
            t0 = time.monotonic()
            await handle.query(ResumptionWorkflow.progress)
            latencies.append(time.monotonic() - t0)
            await asyncio.sleep(0.1)
        result = running.result()
    stop.set()
    await consumer
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 2_000)
    assert await stream_tasks(redis) == names
    print(f"progress query during polls: {len(latencies)} answered, slowest {max(latencies):.3f} s")
    assert len(latencies) >= 20
    assert max(latencies) < QUERY_BOUND_SECONDS, sorted(latencies)[-5:]
    # the waits were polls (a regular activity once a poll does not fit the task's budget), no timers
    kinds = [k for k, _ in await redis_calls(handle)]
    assert kinds.count("wait_for_drain") >= 5 and "timer" not in kinds
    assert TASK_BUDGET_SECONDS < QUERY_BOUND_SECONDS
