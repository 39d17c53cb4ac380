"""ResumptionWorkflow on Temporal's time-skipping test server, against a real redis-server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WithStartWorkflowOperation, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.common import RawValue, WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.support.helpers import (
    GROUP,
    RUNNER,
    STREAM,
    assert_checked_after_every_wait,
    assert_never_over,
    assert_waited_at_the_threshold,
    consume,
    fill_backlog,
    hold_tasks,
    open_workflows,
    redis_calls,
    resumption_worker,
    start,
    stream_tasks,
    throttled,
    throttled_replay,
    wait_for,
)
from xmc_resumption.activities.requests import PublishRequest
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.redisclient import fencing, held, ratecap
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams, publish_batch
from xmc_resumption.redisclient.readings import GroupStatus
from xmc_resumption.redisclient.results import ExperimentState, PublishResult, PublishRounds, PublishStatus
from xmc_resumption.workflows.models import Outcome, Phase, ResumptionResult
from xmc_resumption.workflows.resumption import ResumptionWorkflow


def experiment() -> str:
    return f"E{uuid.uuid4().hex[:6]}"


async def timer_durations(handle) -> list[timedelta]:  # type: ignore[no-untyped-def]
    history = await handle.fetch_history()
    return [
        e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]


async def test_throttle_waits_then_replays_everything(temporal_env, redis, redis_url, task_queue) -> None:
    e = experiment()
    names = await hold_tasks(redis, e, 40)
    await fill_backlog(redis, 5)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            batch_size=3,
            throttle_policy="fixed",
        )
        progress = await wait_for(handle, throttled)
        assert (progress.backlog, progress.pending, progress.lag) == (5, 0, 5)
        assert progress.throttle_reason == "backlog 5 >= 5 (pending 0 + lag 5) in group xmc-workers"
        assert progress.limiting_group == GROUP
        assert await redis.xlen(STREAM) == 5  # nothing published while throttled
        stop, seen = asyncio.Event(), []
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
        result = await handle.result()
        stop.set()
        await consumer
    assert result.outcome is Outcome.COMPLETED
    assert (result.replayed, result.remaining) == (40, 0)
    assert result.throttles >= 1
    assert (await stream_tasks(redis))[5:] == names
    assert await held.get_state(redis, ExperimentKeys(STREAM, e)) is ExperimentState.RUNNING
    assert set(await timer_durations(handle)) == {timedelta(seconds=10)}


async def test_pause_during_the_throttle_wait_publishes_nothing(temporal_env, redis, redis_url, task_queue) -> None:
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        await redis.xgroup_setid(STREAM, GROUP, "$")  # the backlog is gone: only the pause stops it now
        await held.pause(redis, run.keys)
        result = await run.handle.result()
    keys = run.keys
    assert (result.outcome, result.replayed, result.remaining, result.throttles) == (Outcome.PAUSED, 0, 10, 1)
    assert await redis.xlen(STREAM) == 5
    assert await redis.xlen(keys.held) == 10
    assert await held.get_state(redis, keys) is ExperimentState.PAUSED
    assert not await redis.exists(keys.claim)


async def test_newer_claim_during_the_wait_fences_the_replay(temporal_env, redis, redis_url, task_queue) -> None:
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        await redis.xgroup_setid(STREAM, GROUP, "$")
        newer = await fencing.acquire_claim(redis, run.keys, "operator", 60_000)
        result = await run.handle.result()
    keys = run.keys
    assert (result.outcome, result.replayed, result.throttles) == (Outcome.FENCED, 0, 1)
    assert 0 < result.token < newer.token
    assert await redis.xlen(keys.held) == 10 and await redis.xlen(STREAM) == 5
    assert (await fencing.claim_info(redis, keys))["owner"] == "operator"  # not released by the fenced run
    stale = await publish_batch(
        redis,
        keys,
        GROUP,
        PublishParams(token=result.token, seq=99, batch_size=10, threshold=100, owner="zombie", lease_ms=1000),
    )
    assert (stale.status, stale.moved) == (PublishStatus.FENCED, 0)


async def test_cancel_interrupts_the_wait_and_hands_back_a_paused_experiment(
    temporal_env, redis, redis_url, task_queue
) -> None:
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        await run.handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await run.handle.result()
        progress = await run.handle.query(ResumptionWorkflow.progress)
    keys, names = run.keys, run.names
    assert isinstance(failure.value.cause, CancelledError)
    assert progress.outcome is Outcome.CANCELLED
    assert not await redis.exists(keys.claim)
    assert await held.get_state(redis, keys) is ExperimentState.PAUSED
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == names
    assert await redis.xlen(STREAM) == 5


@pytest.mark.parametrize(
    "bad,field",
    [
        ({"experiment_id": "E", "batch_size": 0}, "batch_size"),
        ({"experiment_id": "E", "max_backlog_treshold": 10}, "max_backlog_treshold"),
        ({"experiment_id": ""}, "experiment_id"),
        ({"batch_size": 10}, "experiment_id"),
        ({"experiment_id": "E", "throttle_seconds": -1}, "throttle_seconds"),
        ({"experiment_id": "E", "throttle_seconds": 200}, "claim_lease_seconds"),
        ({"experiment_id": "E", "stream": "a{b}"}, "stream"),
        ({"experiment_id": "E", "missing_group": "ignore"}, "missing_group"),
        (
            {
                "experiment_id": "E",
                "carry": {
                    "token": 7,
                    "owner": "x",
                    "seq": 0,
                    "replayed": 0,
                    "throttles": 0,
                    "turns": 0,
                    "runs": 0,
                    "started_at": "2026-01-01T00:00:00Z",
                },
            },
            "carry",
        ),
    ],
)
async def test_bad_input_fails_at_once_naming_the_field(temporal_env, redis, redis_url, task_queue, bad, field) -> None:
    await fails_at_once_naming(temporal_env, redis, redis_url, task_queue, bad, field)


async def fails_at_once_naming(
    env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str, arg: object, field: str
) -> None:
    """Start the workflow with ``arg`` as its input: the run fails at once, naming ``field``, and
    nothing was claimed, moved or changed in Redis."""
    async with resumption_worker(env.client, task_queue, redis_url):
        handle = await env.client.start_workflow(
            "ResumptionWorkflow",
            arg,
            id=f"bad-{uuid.uuid4().hex[:6]}",
            task_queue=task_queue,
            result_type=ResumptionResult,
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 10)
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.non_retryable, cause
    assert cause.type == "InvalidInput" and "\n" not in str(cause) and field in str(cause), str(cause)
    assert await redis.dbsize() == 0


async def test_an_update_with_the_start_of_a_bad_input_names_the_bad_field(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """Update-with-start, its input a raw dict with a bad field: the Update (even ``pause``) is refused with the
    input's error, naming that field, and the run fails with it."""
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        for update in ("pause", "set_batch_size"):
            start_op = WithStartWorkflowOperation(
                "ResumptionWorkflow", {"experiment_id": "E", "batch_size": True}, id=f"bad-{uuid.uuid4().hex[:6]}",
                task_queue=task_queue, id_conflict_policy=WorkflowIDConflictPolicy.FAIL, result_type=ResumptionResult,
            )  # fmt: skip
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await temporal_env.client.execute_update_with_start_workflow(
                    update, *([10] if update == "set_batch_size" else []), start_workflow_operation=start_op
                )
            cause = refused.value.cause
            assert isinstance(cause, ApplicationError) and cause.type == "InvalidInput", cause
            assert "batch_size" in str(cause) and "experiment_id" not in str(cause), str(cause)
            with pytest.raises(WorkflowFailureError) as failed:
                await asyncio.wait_for((await start_op.workflow_handle()).result(), 10)
            assert str(failed.value.cause) == str(cause)
    assert await redis.dbsize() == 0


NUMERIC_FIELDS = [
    "batch_size", "max_backlog_threshold", "throttle_seconds", "min_wait_seconds", "max_wait_seconds",
    "claim_lease_seconds", "redis_retry_seconds", "stall_window_seconds", "max_stall_seconds",
    "max_bytes_per_call", "turns_per_run", "max_run_seconds",
]  # fmt: skip
RAW_BAD_INPUTS = [
    # what the Temporal CLI sends for --input, as JSON text: wrong types for the whole input
    ("[1, 2]", "ResumptionInput"),
    ('"E42"', "ResumptionInput"),
    ("42", "ResumptionInput"),
    ("null", "ResumptionInput"),
    # experiment IDs the key rule refuses
    ('{"experiment_id": "   "}', "experiment_id"),
    ('{"experiment_id": "E 42"}', "experiment_id"),
    ('{"experiment_id": "E*"}', "experiment_id"),
    ('{"experiment_id": "' + "e" * 10_000 + '"}', "experiment_id"),
    ('{"experiment_id": 42}', "experiment_id"),
    # not finite, or past the documented maximum, in every numeric field
    *[(f'{{"experiment_id": "E", "{f}": {v}}}', f) for f in NUMERIC_FIELDS for v in ("NaN", "Infinity", "1e400")],
    *[(f'{{"experiment_id": "E", "{f}": -Infinity}}', f) for f in ("throttle_seconds", "min_wait_seconds")],
    ('{"experiment_id": "E", "claim_lease_seconds": 1e9}', "claim_lease_seconds"),
    ('{"experiment_id": "E", "batch_size": 1e30}', "batch_size"),
    ('{"experiment_id": "E", "throttle_policy": "eager"}', "throttle_policy"),
    # strict types: a bool is no number, a string no integer, a number no bool (all were coerced once)
    ('{"experiment_id": "E", "batch_size": true}', "batch_size"),
    ('{"experiment_id": "E", "max_backlog_threshold": "500"}', "max_backlog_threshold"),
    ('{"experiment_id": "E", "throttle_seconds": "10"}', "throttle_seconds"),
    ('{"experiment_id": "E", "max_memory_fraction": false}', "max_memory_fraction"),
    ('{"experiment_id": "E", "fair_share": 1}', "fair_share"),
    ('{"experiment_id": "E", "fair_share": "yes"}', "fair_share"),
    # the longest adaptive wait at the lease
    ('{"experiment_id": "E", "throttle_policy": "adaptive", "max_wait_seconds": 120}', "claim_lease_seconds"),
]


@pytest.mark.parametrize("raw,field", RAW_BAD_INPUTS, ids=[f"{i}-{f}" for i, (_, f) in enumerate(RAW_BAD_INPUTS)])
async def test_bad_json_input_fails_at_once_naming_the_field(
    temporal_env, redis, redis_url, task_queue, raw, field
) -> None:
    """The input exactly as JSON text (the Temporal CLI's ``--input``): each fails the run at once,
    non-retryable, naming the field, and nothing in Redis is touched."""
    payload = Payload(metadata={"encoding": b"json/plain"}, data=raw.encode())
    await fails_at_once_naming(temporal_env, redis, redis_url, task_queue, RawValue(payload), field)


async def test_nothing_held_completes_at_once(temporal_env, redis, redis_url, task_queue) -> None:
    e = experiment()
    await held.pause(redis, ExperimentKeys(STREAM, e))
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e)
        result = await handle.result()
    assert (result.outcome, result.replayed, result.throttles, result.turns) == (Outcome.COMPLETED, 0, 0, 1)
    assert await held.get_state(redis, ExperimentKeys(STREAM, e)) is ExperimentState.RUNNING


async def test_a_fault_retrying_cannot_mend_fails_the_run_and_hands_back_a_paused_experiment(
    temporal_env, redis, redis_url, task_queue
) -> None:
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        await redis.delete(STREAM)
        await redis.set(STREAM, "not a stream")  # somebody clobbered the task stream
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(run.handle.result(), 20)
    keys, names = run.keys, run.names
    chain, cause = [], failure.value.cause
    while cause is not None:
        chain.append(cause)
        cause = cause.__cause__ or getattr(cause, "cause", None)
    assert next(c.type for c in chain if isinstance(c, ApplicationError)) == "RedisWrongType"
    assert await held.get_state(redis, keys) is ExperimentState.PAUSED
    assert not await redis.exists(keys.claim)
    [release] = await redis.lrange(keys.released, 0, -1)  # '<token> <outcome> <replayed> <remaining>'
    assert await fencing.current_token(redis, keys) == int(release.split()[0]) + 1  # released and revoked
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == names


class LostReplies(ResumptionActivities):
    """The real activities, but the first ``lost`` publish replies are lost after the script ran in
    Redis (a connection dropped between the server's reply and the client)."""

    def __init__(self, redis: Redis, lost: int) -> None:
        super().__init__(redis)
        self.lost = lost

    def all(self) -> list[Callable[..., Any]]:
        return [self.publish_lossy if f.__name__ == "publish_rounds" else f for f in super().all()]

    @activity.defn(name="publish_rounds")
    async def publish_lossy(self, req: PublishRequest) -> PublishRounds:
        result = await self.publish_rounds(req)
        if self.lost:
            self.lost -= 1
            raise RedisConnectionError("connection lost after the reply was sent")
        return result


async def test_publishes_whose_replies_were_lost_are_counted_once(temporal_env, redis, redis_url, task_queue) -> None:
    """Every attempt of the first publish call loses its reply: the first, a local one, hands the call on to the task
    queue (a connection fault), whose retries outlast the other five. Its three scripts (12 tasks, batch 5) moved
    once, and the call asked again from the same seq returns the recorded result of the last script it ran, never
    ``stale``."""
    e = experiment()
    names = await hold_tasks(redis, e, 12)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    client = Redis.from_url(redis_url)
    async with Worker(
        temporal_env.client,
        task_queue=task_queue,
        workflows=[ResumptionWorkflow],
        activities=LostReplies(client, 6).all(),
        workflow_runner=RUNNER,
    ):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, batch_size=5, throttle_seconds=1)
        result = await asyncio.wait_for(handle.result(), 60)
        progress = await handle.query(ResumptionWorkflow.progress)
    await client.aclose()
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.COMPLETED, 12, 0)
    assert await stream_tasks(redis) == names
    assert (progress.redis_waits, progress.redis_handoffs) == (0, 1)
    publishes = [r for k, r in await redis_calls(handle) if k == "publish_batch"]
    assert [(r["status"], r["moved"], r.get("repeated", False)) for r in publishes] == [("completed", 2, True)]
    assert publishes[0]["rounds"] == {"scripts": 3, "moved": 2}


class LostReplyUnderRateCap(LostReplies):
    """``LostReplies`` losing the first publish reply; records each publish's ``moved_through``, and lifts the stream's
    rate cap once the call asked again has answered."""

    def __init__(self, redis: Redis) -> None:
        super().__init__(redis, 1)
        self.moved_through: list[str] = []

    @activity.defn(name="publish_rounds")
    async def publish_lossy(self, req: PublishRequest) -> PublishRounds:
        self.moved_through.append(req.params.moved_through)
        result = await super().publish_lossy(req)
        if len(self.moved_through) == 2:
            await ratecap.clear_stream_rate(self.redis, STREAM)
        return result


async def test_a_lost_reply_whose_last_script_moved_none_leaves_moved_through_current(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """Under a stream rate cap of 5 tasks/s, the first publish call (batch 5) moves 5 tasks, then its second script is
    rate limited; its reply is lost. Asked again, the recorded result of that script moved nothing, yet names the
    last task the call moved, so the next publish passes it as ``moved_through`` (a crash failover losing those moves
    would move them again marked)."""
    e = experiment()
    names = await hold_tasks(redis, e, 12)
    held_ids = [entry_id.decode() for entry_id, _ in await redis.xrange(ExperimentKeys(STREAM, e).held)]
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    await ratecap.set_stream_rate(redis, STREAM, 5)
    client = Redis.from_url(redis_url)
    activities = LostReplyUnderRateCap(client)
    async with Worker(
        temporal_env.client,
        task_queue=task_queue,
        workflows=[ResumptionWorkflow],
        activities=activities.all(),
        workflow_runner=RUNNER,
    ):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, batch_size=5, throttle_seconds=1)
        result = await asyncio.wait_for(handle.result(), 60)
    await client.aclose()
    assert (result.outcome, result.replayed, result.redelivered) == (Outcome.COMPLETED, 12, 0)
    assert (result.last_moved_id, await stream_tasks(redis)) == (held_ids[-1], names)
    # the lost call and its retry, then the next publish, told of the 5 tasks the lost call moved
    assert activities.moved_through[:3] == ["", "", held_ids[4]]


async def test_the_open_workflows_are_listed_on_the_time_skipping_server(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """What ``temporal_env`` checks after every test on the time-skipping server: a run in its
    throttle wait is open, and no longer once terminated (while its worker runs)."""
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        assert await open_workflows(temporal_env.client) == [run.handle.id]
        await run.handle.terminate()
    assert await open_workflows(temporal_env.client) == []


async def test_nothing_is_published_while_the_backlog_is_exactly_at_the_threshold(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """A backlog one below the threshold (pending 2 + lag 2 at threshold 5) takes exactly one task;
    at exactly the threshold the run waits, turn after turn, checking pause and fencing after every
    wait and moving nothing (each turn's publish script measures, finds no headroom and moves
    nothing), until the stall limit ends it."""
    e = experiment()
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, 10)
    await fill_backlog(redis, 4)
    await redis.xreadgroup(GROUP, "c0", {STREAM: ">"}, count=2)  # 2 pending, 2 undelivered
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            batch_size=3,
            throttle_seconds=10,
            throttle_policy="fixed",
            stall_window_seconds=20,
            max_stall_seconds=40,
        )
        result = await asyncio.wait_for(handle.result(), 30)
    calls = await redis_calls(handle)
    kinds = [k for k, _ in calls]
    publishes = [r for k, r in calls if k == "publish_batch"]
    readings = [(r["pending"], r["lag"], r["headroom"]) for r in publishes]
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.STALLED, 1, 9)
    assert (await stream_tasks(redis))[4:] == names[:1]
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == names[1:]
    assert readings[0] == (2, 2, 1) and set(readings[1:]) == {(2, 3, 0)}
    assert_waited_at_the_threshold(calls)
    assert_checked_after_every_wait(calls)
    assert_never_over(calls, 5)
    assert [r["moved"] for r in publishes] == [1] + [0] * (len(publishes) - 1)
    assert {r["status"] for r in publishes[1:]} == {"throttled"} and "measure_backlog" not in kinds
    assert kinds.count("timer") == result.throttles >= 3


async def test_a_publish_recorded_ahead_of_the_run_is_not_counted_again(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """As after a workflow reset: the publish record already holds a later seq of the run's own
    token (here a hand-made record claiming 7 tasks, without Redis's counts). The run's next publish
    call finds its seq older than the record's: it takes the recorded result (as a call asked again
    after a lost reply does), goes on from the recorded seq, and the recorded result is never
    counted: ``replayed`` is what the run moved."""
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        recorded = PublishResult(
            status=PublishStatus.PUBLISHED,
            moved=7,
            backlog=0,
            remaining=3,
            pending=0,
            lag=0,
            group_status=GroupStatus.OK,
        )
        # as the script records a result: without ``repeated`` (it marks the result so when it returns it again)
        record = recorded.model_dump_json(exclude={"repeated"})
        token = await fencing.current_token(redis, run.keys)  # the run's
        await redis.hset(run.keys.publish, mapping={"token": token, "seq": 5, "result": record})
        await redis.xgroup_setid(STREAM, GROUP, "$")  # the backlog is gone
        stop, seen = asyncio.Event(), []
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
        result = await asyncio.wait_for(run.handle.result(), 30)
        stop.set()
        await consumer
    publishes = [r for k, r in await redis_calls(run.handle) if k == "publish_batch"]
    taken = next(i for i, r in enumerate(publishes) if r.get("repeated"))
    assert (result.outcome, result.remaining, result.token) == (Outcome.COMPLETED, 0, token)
    assert all(r["moved"] == 0 for r in publishes[:taken])  # throttled before the record was written
    assert (publishes[taken]["moved"], publishes[taken]["rounds"]["scripts"]) == (7, 4)  # seqs 2..5
    assert result.replayed == 10, "replayed counts only the tasks this run moved"
    assert await redis.xlen(STREAM) == 5 + 10
    assert (await stream_tasks(redis))[5:] == run.names


async def test_an_experiment_neither_paused_nor_holding_ends_nothing_held(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """A mistyped experiment ID (or stream) from the Temporal CLI: a distinct outcome at once,
    not ``completed, replayed 0``, and no state is created for it."""
    e = experiment()
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=5)
        result = await asyncio.wait_for(handle.result(), 20)
    keys = ExperimentKeys(STREAM, e)
    assert (result.outcome, result.replayed, result.remaining, result.throttles) == (Outcome.NOTHING_HELD, 0, 0, 0)
    assert not await redis.exists(keys.state, keys.held, keys.claim)


async def test_a_fence_counter_that_went_back_ends_fence_lost(temporal_env, redis, redis_url, task_queue) -> None:
    """The fence counter below the run's token (Redis restarted without persistence) is data loss,
    reported as such, and nothing more is published."""
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        token = await fencing.current_token(redis, run.keys)  # the run's
        await redis.set(run.keys.fence, "0")
        await redis.xgroup_setid(STREAM, GROUP, "$")
        result = await asyncio.wait_for(run.handle.result(), 20)
    assert (result.outcome, result.replayed, result.remaining, result.token) == (Outcome.FENCE_LOST, 0, 10, token)
    assert await redis.xlen(run.keys.held) == 10 and await redis.xlen(STREAM) == 5


async def test_a_corrupt_fence_counter_fails_the_run_at_once_and_leaves_the_experiment_paused(
    temporal_env, redis, redis_url, task_queue
) -> None:
    e = experiment()
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, 3)
    await redis.set(keys.fence, "-5")
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e)
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 20)
    assert f'XMCCORRUPT {keys.fence} holds "-5"' in str(failure.value.cause)
    assert await held.get_state(redis, keys) is ExperimentState.PAUSED
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == names
    assert not await redis.exists(keys.claim)


class UnreadableCheck(ResumptionActivities):
    """The real activities, but the check answers something the workflow cannot read (a fault of
    the workflow's side of the contract): pydantic raises inside workflow code."""

    def all(self) -> list[Callable[..., Any]]:
        return [self.check_garbled if f.__name__ == "check_claim" else f for f in super().all()]

    @activity.defn(name="check_claim")
    async def check_garbled(self, req: Any) -> dict[str, Any]:
        return {"fenced": "perhaps"}


async def test_an_exception_in_workflow_code_fails_the_run_and_hands_back(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """Decided: any exception of workflow code (here a result it cannot read) fails the run as a
    non-retryable ``WorkflowCodeError`` after handing the experiment back as paused, instead of
    retrying the workflow task for ever."""
    e = experiment()
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, 3)
    client = Redis.from_url(redis_url)
    async with Worker(
        temporal_env.client,
        task_queue=task_queue,
        workflows=[ResumptionWorkflow],
        activities=UnreadableCheck(client).all(),
        workflow_runner=RUNNER,
    ):
        handle = await start(temporal_env.client, task_queue, experiment_id=e)
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 20)
    await client.aclose()
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "WorkflowCodeError" and cause.non_retryable
    assert "ValidationError" in str(cause) and "fenced" in str(cause)
    assert await held.get_state(redis, keys) is ExperimentState.PAUSED
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == names
    assert not await redis.exists(keys.claim)


@pytest.mark.parametrize("deleted", ["group", "stream"])
async def test_the_group_or_the_stream_deleted_mid_run_is_waited_for(
    temporal_env, redis, redis_url, task_queue, deleted
) -> None:
    """The default policy (``wait``): a group (or stream, which takes its group with it) deleted
    mid-run stops the replay in ``waiting_for_group``; once the group is back, at ``$``, every
    held task lands once, in order, and the group sees them all. (The seed's rule took the
    missing group for a backlog of 0 and moved everything into a stream no group read.)"""
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        if deleted == "group":
            await redis.xgroup_destroy(STREAM, GROUP)
        else:
            await redis.delete(STREAM)
        await run.handle.execute_update(ResumptionWorkflow.set_throttle_seconds, 5.0)  # wakes the wait
        progress = await wait_for(run.handle, lambda p: p.phase is Phase.WAITING_FOR_GROUP)
        assert GROUP in (progress.throttle_reason or "") and progress.replayed == 0
        await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
        stop, seen = asyncio.Event(), []
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
        result = await asyncio.wait_for(run.handle.result(), 20)
        stop.set()
        await consumer
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.COMPLETED, 10, 0)
    assert (await stream_tasks(redis))[-10:] == run.names == seen


async def test_the_group_deleted_mid_run_under_the_error_policy_fails_and_hands_back(
    temporal_env, redis, redis_url, task_queue
) -> None:
    e = experiment()
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, 10)
    await fill_backlog(redis, 5)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            missing_group="error",
            throttle_policy="fixed",
        )
        await wait_for(handle, throttled)
        await redis.xgroup_destroy(STREAM, GROUP)
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 20)
    assert "MissingConsumerGroup" in str(failure.value.cause) or "does not exist" in str(failure.value.cause)
    assert await held.get_state(redis, keys) is ExperimentState.PAUSED
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == names
