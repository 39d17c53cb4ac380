"""Replays of one stream that take turns (docs/pacing.md, "Many replays on one worker"), on the dev server against a
real redis-server: a poll whose turn does not come stays queued in its worker, the run waits without a call until the
worker's signal gives it its turn, and every task still moves once, in order, never past the threshold."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.api.enums.v1 import EventType

from tests.support.helpers import (
    GROUP,
    STREAM,
    assert_checked_after_every_wait,
    assert_never_over,
    chain_histories,
    consume,
    history_calls,
    hold_tasks,
    resumption_worker,
    start,
    stream_tasks,
    wait_for,
)
from xmc_resumption.activities.requests import TURN_SIGNAL
from xmc_resumption.workflows.models import Outcome

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

REPLAYS, TASKS, THRESHOLD = 6, 300, 100


async def test_replays_of_one_stream_take_turns_signalled_by_their_worker(
    temporal_env, redis, redis_url, task_queue
) -> None:
    run = uuid.uuid4().hex[:6]
    experiments = [f"T{i}-{run}" for i in range(REPLAYS)]
    held = {e: await hold_tasks(redis, e, TASKS) for e in experiments}
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handles = [
            await start(temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=THRESHOLD)
            for e in experiments
        ]
        # nobody reads yet: the first publish fills the threshold, every poll reaches its bound and queues
        for handle in handles:
            await wait_for(handle, lambda p: "queued" in (p.wait_plan or ""), timeout=60)
        consumers = [asyncio.create_task(consume(redis, f"c{i}", stop, seen, 10, rate=150)) for i in range(2)]
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
        stop.set()
        await asyncio.gather(*consumers)
        histories = [h for handle in handles for h in await chain_histories(temporal_env.client, handle)]
    assert [r.outcome for r in results] == [Outcome.COMPLETED] * REPLAYS
    assert [r.replayed for r in results] == [TASKS] * REPLAYS
    moved = await stream_tasks(redis)
    assert sorted(moved) == sorted(t for tasks in held.values() for t in tasks)  # each once
    for e, tasks in held.items():  # each experiment's in its order
        assert [t for t in moved if t.startswith(f"{e}-".encode())] == tasks
    signals, queued = 0, 0
    for history in histories:
        calls = history_calls(history)
        assert_never_over(calls, THRESHOLD)
        assert_checked_after_every_wait(calls)
        queued += sum(1 for kind, r in calls if kind == "wait_for_drain" and r["queued"])
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                assert event.workflow_execution_signaled_event_attributes.signal_name == TURN_SIGNAL
                signals += 1
    # every replay queued while nobody read; the worker gave the turns once the consumers drained
    assert queued >= REPLAYS and 0 < signals <= queued
