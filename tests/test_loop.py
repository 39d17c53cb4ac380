"""The loop of patch ``publish-rounds`` (time-skipping server, real redis-server): the claim is followed by the
publish, every later turn is the check then the publish (no measurement between), a publish fills the headroom in
scripts of the batch in one call, and an input without a batch gets the automatic one."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from datetime import UTC, datetime

import pytest

from tests.support.helpers import (
    GROUP,
    STREAM,
    assert_checked_after_every_wait,
    assert_never_over,
    assert_waited_at_the_threshold,
    consume,
    hold_tasks,
    redis_calls,
    resumption_worker,
    start,
    stream_tasks,
    throttled,
    wait_for,
)
from tests.test_dead_letters import POISON
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.workflows.calls import LOCAL_CALL_SECONDS, ROUNDS_LOCAL_SECONDS, TASK_BUDGET_SECONDS, TaskClock
from xmc_resumption.workflows.models import (
    AUTO_BATCH_SIZE,
    AUTO_SCRIPT_BYTES,
    START_BATCH_SIZE,
    Outcome,
    ResumptionInput,
)
from xmc_resumption.workflows.resumption import ResumptionWorkflow
from xmc_resumption.workflows.state import RunState


def experiment() -> str:
    return f"E{uuid.uuid4().hex[:6]}"


async def test_a_turn_is_the_check_then_the_publish_in_rounds(temporal_env, redis, redis_url, task_queue) -> None:
    """20 tasks at threshold 8, batch 3, against a consumer: the claim's first publish call fills the headroom in
    scripts of 3 (3 + 3 + 2), nothing measures the backlog apart from the publishes and the polls, and after every
    wait the check comes first."""
    e = experiment()
    names = await hold_tasks(redis, e, 20)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=8, batch_size=3)
        await wait_for(handle, throttled)  # the consumer starts once the first publish call filled the stream
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=4, rate=200))
        try:
            result = await handle.result()
        finally:
            stop.set()
            await consumer
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.COMPLETED, 20, 0)
    assert await stream_tasks(redis) == names and seen == names
    calls = await redis_calls(handle)
    kinds = [k for k, _ in calls]
    assert kinds[:2] == ["acquire_claim", "publish_batch"] and "measure_backlog" not in kinds
    first = calls[1:3]
    assert [(r["moved"], r.get("rounds")) for _, r in first] == [(3, None), (2, {"scripts": 3, "moved": 8})]
    # the two results of the call: its first script's and its last's (the one between moved 3 too)
    assert [r["backlog"] for _, r in calls[1:3]] == [0, 6]
    for (kind, _), (after, _) in itertools.pairwise(calls):
        if kind == "check_claim":
            assert after in ("publish_batch", "release_claim"), kinds
    assert all(r["moved"] <= 3 for k, r in calls if k == "publish_batch")
    assert_checked_after_every_wait(calls)
    assert_waited_at_the_threshold(calls)
    assert_never_over(calls, 8)


async def test_an_input_without_a_batch_gets_the_automatic_one(temporal_env, redis, redis_url, task_queue) -> None:
    """Tasks of about 1 KiB, threshold 600, a consumer: the first publish call moves scripts of 100 (nothing measured
    yet), the later ones scripts of about ``AUTO_SCRIPT_BYTES`` of such tasks (126 of them)."""
    e = experiment()
    keys = ExperimentKeys(STREAM, e)
    await held.pause(redis, keys)
    for i in range(2_000):
        await held.enqueue_task(redis, keys, {"task": f"t{i}", "payload": "x" * 1_000})
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=100))
    try:
        async with resumption_worker(temporal_env.client, task_queue, redis_url):
            handle = await start(temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=600)
            result = await handle.result()
    finally:
        stop.set()
        await consumer
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 2_000)
    assert seen == [f"t{i}".encode() for i in range(2_000)]
    publishes = [r for k, r in await redis_calls(handle) if k == "publish_batch"]
    task_bytes = publishes[0]["moved_bytes"] / publishes[0]["moved"]
    learned = int(AUTO_SCRIPT_BYTES // task_bytes)
    assert publishes[0]["moved"] == START_BATCH_SIZE and 120 <= learned <= 128
    assert max(r["moved"] for r in publishes) == learned  # a later script took a whole automatic batch


def test_the_automatic_batch_is_about_its_bytes_of_the_tasks_last_moved() -> None:
    state = RunState.of(ResumptionInput(experiment_id="E1"))
    assert state.batch_size == START_BATCH_SIZE  # nothing moved yet
    for task_bytes, batch in ((1_024.0, 128), (10.0, AUTO_BATCH_SIZE), (10 * 1024 * 1024.0, 1), (0.5, AUTO_BATCH_SIZE)):
        state.task_bytes = task_bytes
        assert state.batch_size == batch


async def test_an_update_reports_the_automatic_batch_in_use(temporal_env, redis, redis_url, task_queue) -> None:
    e = experiment()
    await hold_tasks(redis, e, 10)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    for i in range(5):
        await redis.xadd(STREAM, {"task": f"ahead{i}"})
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=5)
        effective = await handle.execute_update(ResumptionWorkflow.set_threshold, 6)
        # the batch in use: nothing has moved yet, so the automatic batch is still the first one
        assert (effective.max_backlog_threshold, effective.batch_size) == (6, START_BATCH_SIZE)
        changed = await handle.execute_update(ResumptionWorkflow.set_batch_size, 7)
        assert changed.batch_size == 7
        await handle.execute_update(ResumptionWorkflow.pause)
        result = await handle.result()
    assert result.outcome is Outcome.PAUSED


def test_the_automatic_batch_survives_continue_as_new() -> None:
    """An input without ``batch_size`` keeps None in the next run's input, so the next run sizes its batch again; an
    input's own batch stays."""
    state = RunState.of(ResumptionInput(experiment_id="E1"))
    state.begin("resumption-E1", None, datetime(2026, 1, 1, tzinfo=UTC), lambda: "r1")
    state.task_bytes = 1_024.0
    nxt = RunState.of(state.next_input())
    assert (state.batch_size, nxt.input.batch_size, nxt.batch_size) == (128, None, START_BATCH_SIZE)
    explicit = RunState.of(ResumptionInput(experiment_id="E1", batch_size=7))
    assert explicit.batch_size == 7


async def test_a_publish_that_left_headroom_is_followed_by_the_next_without_a_wait(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """A publish waits only when the backlog reached the threshold; one that left headroom is followed by the next
    publish at once, also when it moved nothing: three poison tasks each head a script of 10 (the script stops before
    it, moving nothing), 30 tasks at threshold 100 with no consumer. The run never waits (``throttles`` 0, no throttle
    reason), sets the three aside, and moves the 30 in order, never past the threshold."""
    e = experiment()
    keys = ExperimentKeys(STREAM, e)
    names: list[bytes] = []
    await held.pause(redis, keys)
    for n in range(3):
        await redis.xadd(keys.held, {"task": b"poison", **POISON})
        names += await hold_tasks(redis, e, 10, start=10 * n)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=100,
            batch_size=10,
            throttle_policy="adaptive",
        )
        result = await handle.result()
        progress = await handle.query(ResumptionWorkflow.progress)
    assert (result.outcome, result.replayed, result.set_aside, result.throttles) == (Outcome.COMPLETED, 30, 3, 0)
    assert progress.throttle_reason is None and progress.backlog == 30
    assert await stream_tasks(redis) == names
    assert await redis.xlen(keys.dead) == 3
    calls = await redis_calls(handle)
    assert [r["moved"] for k, r in calls if k == "publish_batch" and r["poison_id"]] == [0, 0, 0]
    assert_never_over(calls, 100)


def test_the_task_clock_moves_on_by_what_local_calls_report_and_is_the_task_budget() -> None:
    """Never workflow time or the history length after a local call (tests/test_replay.py, the late marker)."""
    clock = TaskClock(synced_at=datetime(2026, 1, 1, tzinfo=UTC))
    assert (clock.left(), clock.passed_by(0.5), clock.passed_by(0.51)) == (0.5, False, True)
    clock.charge(0.0)  # a short call: LOCAL_CALL_SECONDS
    clock.charge(0.3)  # publish rounds that ran 0.3 s
    assert clock.spent == pytest.approx(LOCAL_CALL_SECONDS + 0.3)
    assert not clock.passed_by(ROUNDS_LOCAL_SECONDS) and clock.passed_by(0.2)
    assert clock.left() == pytest.approx(TASK_BUDGET_SECONDS - 0.305)
    assert clock.now() == datetime(2026, 1, 1, 0, 0, 0, 305_000, tzinfo=UTC)
    clock.handler_now = datetime(2026, 1, 1, 0, 0, 7, tzinfo=UTC)  # an Update handler's own time while it runs
    assert clock.now() == clock.handler_now
