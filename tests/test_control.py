"""Live control of a running replay by validated Updates (workflows/models.py ``Control``), on the
time-skipping test server against a real redis-server."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError

from tests.support.helpers import (
    STREAM,
    assert_checked_after_every_wait,
    assert_never_over,
    cancelled,
    consume,
    fill_backlog,
    hold_tasks,
    redis_calls,
    resumption_worker,
    start,
    stream_tasks,
    throttled,
    throttled_replay,
    wait_for,
)
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.workflows.control import Control, ControlChange, EffectiveSettings
from xmc_resumption.workflows.models import Outcome, ThrottlePolicy
from xmc_resumption.workflows.resumption import ResumptionWorkflow


def experiment() -> str:
    return f"E{uuid.uuid4().hex[:6]}"


async def event_types(handle) -> list[int]:  # type: ignore[no-untyped-def]
    return [e.event_type for e in (await handle.fetch_history()).events]


async def test_raising_the_threshold_wakes_the_wait_and_the_replay_goes_on_under_it(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """Backlog 5 at threshold 5: throttled on a 10 s timer. ``set_threshold 25`` ends the timer at
    once, the next turn checks first, then publishes up to 25 - 5 = 20 (batch 50) in one go."""
    e = experiment()
    names = await hold_tasks(redis, e, 20)
    await fill_backlog(redis, 5)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            batch_size=50,
            throttle_policy="fixed",
        )
        await wait_for(handle, throttled)
        assert await redis.xlen(STREAM) == 5
        effective = await handle.execute_update(ResumptionWorkflow.set_threshold, 25)
        assert effective == EffectiveSettings(
            max_backlog_threshold=25, batch_size=50, throttle_seconds=10.0, throttle_policy=ThrottlePolicy.FIXED
        )
        result = await handle.result()
        progress = await handle.query(ResumptionWorkflow.progress)
    assert (result.outcome, result.replayed, result.throttles) == (Outcome.COMPLETED, 20, 1)
    assert (progress.threshold, progress.settings_changes) == (25, 1)
    assert (await stream_tasks(redis))[5:] == names
    calls = await redis_calls(handle)
    assert_checked_after_every_wait(calls)
    assert_never_over(calls, 25)
    publishes = [r for name, r in calls if name == "publish_batch"]
    # the publish right after the claim found no headroom (throttled); the one after the Update moved 20
    assert [(p["status"], p["moved"]) for p in publishes] == [("throttled", 0), ("completed", 20)]
    types = await event_types(handle)
    # the timer was cancelled by the Update, not fired: the wait ended at once
    assert EventType.EVENT_TYPE_TIMER_CANCELED in types
    assert EventType.EVENT_TYPE_TIMER_FIRED not in types
    assert types.count(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED) == 1


@pytest.mark.parametrize(
    ("update", "arg", "field"),
    [
        (Control.SET_THRESHOLD, 0, "max_backlog_threshold"),
        (Control.SET_THRESHOLD, 100_001, "max_backlog_threshold"),
        (Control.SET_BATCH_SIZE, 0, "batch_size"),
        (Control.SET_THROTTLE_SECONDS, float("nan"), "throttle_seconds"),
        # the lease (120 s) must outlast every wait, whichever way the wait was set
        (Control.SET_THROTTLE_SECONDS, 500.0, "claim_lease_seconds"),
        (Control.CONFIGURE, ControlChange(batch_size=-3), "batch_size"),
    ],
)
async def test_a_bad_value_is_rejected_by_the_validator_and_leaves_nothing_in_history(
    temporal_env, redis, redis_url, task_queue, update, arg, field
) -> None:
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        handle = run.handle
        before = await event_types(handle)
        with pytest.raises(WorkflowUpdateFailedError) as raised:
            await handle.execute_update(update.value, arg, result_type=EffectiveSettings)
        assert field in str(raised.value.cause)
        after = await event_types(handle)
        progress = await handle.query(ResumptionWorkflow.progress)
        await cancelled(handle)
    # no Update event and no command: the test server records the validator's workflow task (the
    # real server's is speculative and leaves nothing: test_fleet.py checks that on the dev server)
    task_events = {
        EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    }
    assert after[: len(before)] == before
    assert set(after[len(before) :]) <= task_events
    assert (progress.threshold, progress.settings_changes) == (5, 0)


async def test_the_pause_update_ends_the_run_paused_and_keeps_every_held_task(
    temporal_env, redis, redis_url, task_queue
) -> None:
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        handle, keys = run.handle, run.keys
        effective = await handle.execute_update(ResumptionWorkflow.pause)
        result = await handle.result()
        # nothing left to change once it ended (the test server answers "not found", the real one
        # "workflow execution already completed")
        with pytest.raises((WorkflowUpdateFailedError, RPCError)):
            await handle.execute_update(ResumptionWorkflow.set_threshold, 50)
    assert effective.stopping is True
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.PAUSED, 0, 10)
    assert await held.get_state(redis, keys) is ExperimentState.PAUSED
    assert await redis.xlen(keys.held) == 10
    assert await redis.exists(keys.claim) == 0
    assert EventType.EVENT_TYPE_TIMER_FIRED not in await event_types(handle)


async def test_changed_settings_survive_continue_as_new(temporal_env, redis, redis_url, task_queue) -> None:
    """Batch 1 and two turns per run: the change of threshold, batch size and policy is carried into the runs that
    follow (it is part of the input continue-as-new passes on). A consumer that reads 4 tasks at a time after the
    change keeps the replay turning: each refill is at most the threshold's headroom."""
    e = experiment()
    names = await hold_tasks(redis, e, 30)
    await fill_backlog(redis, 5)
    stop, seen = asyncio.Event(), []
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=5, batch_size=1, turns_per_run=2
        )
        await wait_for(handle, throttled)
        effective = await handle.execute_update(
            ResumptionWorkflow.configure,
            ControlChange(max_backlog_threshold=12, batch_size=7, throttle_policy=ThrottlePolicy.ADAPTIVE),
        )
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=4, rate=40))
        result = await handle.result()
        progress = await handle.query(ResumptionWorkflow.progress)
        stop.set()
        await consumer
    assert (effective.max_backlog_threshold, effective.batch_size) == (12, 7)
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 30)
    assert result.runs >= 2  # the change was accepted in the first run: the last one has it by its carry
    assert (progress.threshold, progress.policy, progress.runs) == (12, ThrottlePolicy.ADAPTIVE, result.runs)
    assert (await stream_tasks(redis))[5:] == names
    # the last run's publishes moved 7 at most (its own history: only the last run's events)
    moved = [r["moved"] for name, r in await redis_calls(handle) if name == "publish_batch"]
    assert moved and max(moved) <= 7


async def test_an_unknown_signal_is_logged_not_silently_dropped(
    temporal_env, redis, redis_url, task_queue, caplog
) -> None:
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        handle = run.handle
        with caplog.at_level(logging.WARNING, logger="temporalio.workflow"):
            await handle.signal("set_threshold", 50)
            await wait_for(handle, lambda p: any("set_threshold" in r.getMessage() for r in caplog.records))
        await cancelled(handle)
    warning = next(r.getMessage() for r in caplog.records if "set_threshold" in r.getMessage())
    assert warning.startswith("signal 'set_threshold' ignored: this workflow is controlled by Updates (configure,")
