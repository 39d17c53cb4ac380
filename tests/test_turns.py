"""Replays of one stream that take turns (docs/pacing.md, "Many replays on one worker"), on the dev server against a
real redis-server: a poll whose turn does not come stays queued in its worker, the run waits without a call until the
worker's signal gives it its turn, and every task still moves once, in order, never past the threshold."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, Interceptor, OutboundInterceptor, SignalWorkflowInput, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

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
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.redisclient.watch import BacklogWatches
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


def line_of(worker: Worker) -> BacklogWatches:
    """The worker's line: its resumption activities' ``BacklogWatches``."""
    (acts,) = {getattr(a, "__self__", None) for a in worker.config()["activities"]}
    assert isinstance(acts, ResumptionActivities)
    return acts.watches


async def until(ok: Callable[[], Awaitable[bool]], what: str, timeout: float = 60) -> None:
    for _ in range(int(timeout / 0.1)):
        if await ok():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout:g}s: {what}")


async def turn_signals(handle: WorkflowHandle) -> int:
    """How many ``TURN_SIGNAL``s the replay's current run received."""
    history = await handle.fetch_history()
    return sum(
        1
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == TURN_SIGNAL
    )


async def queued_replays(client: Client, redis, task_queue: str, worker: Worker, count: int) -> list[WorkflowHandle]:  # type: ignore[no-untyped-def]
    """``count`` replays of one stream nobody reads, every one queued in ``worker``'s line."""
    run = uuid.uuid4().hex[:6]
    handles = []
    for i in range(count):
        await hold_tasks(redis, f"Q{i}-{run}", TASKS)
        handles.append(await start(client, task_queue, experiment_id=f"Q{i}-{run}", max_backlog_threshold=THRESHOLD))
    watches = line_of(worker)

    async def all_queued() -> bool:
        return watches.queued() == count

    await until(all_queued, f"{count} replays queued")
    return handles


async def test_a_stopping_worker_gives_its_queued_replays_their_turns(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """A rolling deploy: the replays queued in a worker that stops go on at once (on another worker), not at the end
    of their queue time."""
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    async with resumption_worker(temporal_env.client, task_queue, redis_url) as worker:
        handles = await queued_replays(temporal_env.client, redis, task_queue, worker, 3)
        assert [await turn_signals(h) for h in handles] == [0, 0, 0]
    try:
        for handle in handles:  # the worker stopped, its line with it: each run has its turn

            async def signalled(handle: WorkflowHandle = handle) -> bool:
                return await turn_signals(handle) >= 1

            await until(signalled, f"{handle.id} given its turn")
    finally:
        for handle in handles:
            await handle.terminate("test over")


class RefuseSignals(Interceptor):
    """A server that does not let this client's identity signal (its authorizer answers PERMISSION_DENIED)."""

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        class Refused(OutboundInterceptor):
            async def signal_workflow(self, input: SignalWorkflowInput) -> None:
                raise RPCError("Request unauthorized.", RPCStatusCode.PERMISSION_DENIED, b"")

        return Refused(next)


async def test_a_worker_that_may_not_signal_stops_queueing(
    temporal_env, redis, redis_url, task_queue, caplog: pytest.LogCaptureFixture
) -> None:
    """Its first turn refused, the worker says so once and its polls end at their bound again; every replay ends."""
    caplog.set_level(logging.WARNING, "xmc_resumption.redisclient.watch")
    client = Client(**(temporal_env.client.config() | {"interceptors": [RefuseSignals()]}))
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    async with resumption_worker(client, task_queue, redis_url) as worker:
        handles = await queued_replays(client, redis, task_queue, worker, 3)
        consumers = [asyncio.create_task(consume(redis, f"c{i}", stop, seen, 10, rate=150)) for i in range(2)]
        watches = line_of(worker)

        async def off() -> bool:
            return not watches.queueing

        await until(off, "queueing switched off")
        assert watches.queued() == 0
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
        stop.set()
        await asyncio.gather(*consumers)
        assert watches.queued() == 0
    assert [r.outcome for r in results] == [Outcome.COMPLETED] * 3
    assert [r.replayed for r in results] == [TASKS] * 3
    assert [await turn_signals(h) for h in handles] == [0, 0, 0]
    assert caplog.text.count("polls no longer queue on this worker") == 1
