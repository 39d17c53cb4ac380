"""Rate caps in the workflow, on the time-skipping test server against a real redis-server: the
replay's own ``max_tasks_per_second`` bounds what it moves, an Update changes it live, the
stream-wide cap (``{S}:rate``) holds it back with the progress saying why, and a rate wait is no
stall."""

from __future__ import annotations

import asyncio
import re
import uuid

import pytest
from pydantic import ValidationError
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateFailedError

from tests.support.helpers import GROUP, STREAM, consume, hold_tasks, redis_calls, resumption_worker, start, wait_for
from tests.support.proxy import losing_proxy
from tests.test_client import port_of
from xmc_resumption.redisclient import ratecap
from xmc_resumption.workflows.control import ControlChange, EffectiveSettings
from xmc_resumption.workflows.models import AUTO_BATCH_SIZE, Outcome, Phase, ResumptionInput, ThrottlePolicy
from xmc_resumption.workflows.resumption import ResumptionWorkflow
from xmc_resumption.workflows.text import details_markdown


def experiment() -> str:
    return f"E{uuid.uuid4().hex[:6]}"


def wait_of(reason: str) -> float:
    """The seconds of a rate wait's reason (``...: 4.8s for the bucket``)."""
    match = re.search(r": ([0-9.]+)s for the bucket$", reason)
    assert match, reason
    return float(match.group(1))


async def history(handle):  # type: ignore[no-untyped-def]
    return (await handle.fetch_history()).events


async def test_the_replays_cap_bounds_what_it_moves(temporal_env, redis, redis_url, task_queue) -> None:
    """60 tasks at a cap of 25/s (a bucket of 25, full at the start), consumers far faster: no
    publish moves more than 25, the run waits for the bucket between bursts (short waits: polls),
    and from the first move to the last, workflow time is at least (60 - 25) / 25 s."""
    e = experiment()
    names = await hold_tasks(redis, e, 60)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
    try:
        async with resumption_worker(temporal_env.client, task_queue, redis_url):
            handle = await start(
                temporal_env.client, task_queue, experiment_id=e, batch_size=100, max_tasks_per_second=25
            )
            result = await handle.result()  # short waits poll inside the open workflow task: no query mid-run
            progress = await handle.query(ResumptionWorkflow.progress)
    finally:
        stop.set()
        await consumer
    assert (result.outcome, result.replayed, result.throttles) == (Outcome.COMPLETED, 60, 0)
    assert progress.rate_reason is not None and "replay cap 25 tasks/s (max_tasks_per_second)" in progress.rate_reason
    assert progress.max_tasks_per_second == 25 and progress.rate_waits == 2  # for 25 (1 s), then the last 10
    assert "- rate cap: replay 25/s; waits: 2, last: replay cap 25" in details_markdown(progress)
    assert seen == names
    publishes = [n for kind, r in await redis_calls(handle) if kind == "publish_batch" and (n := r["moved"])]
    assert max(publishes) <= 25 and sum(publishes) == 60
    # when each task reached the stream: its entry ID's milliseconds (Redis's clock). In every
    # window at most 25 per second of it, plus the bucket's 25
    added = [int(entry_id.split(b"-")[0]) for entry_id, _ in await redis.xrange(STREAM)]
    assert (added[-1] - added[0]) / 1000 >= (60 - 25) / 25 - 0.02
    for i, first in enumerate(added):
        for j in range(i, len(added)):
            assert j - i + 1 <= 25 * (added[j] - first) / 1000 + 25
    calls = [kind for kind, _ in await redis_calls(handle)]
    assert "wait_for_drain" in calls and "timer" not in calls  # waits under 2 s poll


async def test_an_update_changes_the_cap_live(temporal_env, redis, redis_url, task_queue) -> None:
    """A cap of 0.1/s moves 1 task, then waits on a durable timer (the bucket needs 10 s).
    ``set_max_tasks_per_second 0.2`` ends that wait at once, and the next waits are
    5 s; bad values are refused by the validator naming the field; ``configure`` with 0 removes the
    cap and the rest moves at once."""
    e = experiment()
    await hold_tasks(redis, e, 40)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client, task_queue, experiment_id=e, max_tasks_per_second=0.1, throttle_policy="fixed"
        )
        waiting = await wait_for(handle, lambda p: p.phase is Phase.RATE_LIMITED)
        assert (waiting.replayed, waiting.rate_waits, waiting.throttled_until is not None) == (1, 1, True)
        # the bucket refilled a little while the publish ran: a hair under 10 s
        assert waiting.rate_reason is not None and 9.5 <= wait_of(waiting.rate_reason) <= 10
        for bad in (-1.0, float("nan"), 2e6, 0.0001):
            with pytest.raises(WorkflowUpdateFailedError) as raised:
                await handle.execute_update(ResumptionWorkflow.set_max_tasks_per_second, bad)
            assert "max_tasks_per_second" in str(raised.value.cause)
        effective = await handle.execute_update(ResumptionWorkflow.set_max_tasks_per_second, 0.2)
        assert effective == EffectiveSettings(
            max_backlog_threshold=500,
            batch_size=AUTO_BATCH_SIZE,  # the input left it out: the automatic batch
            throttle_seconds=10.0,
            throttle_policy=ThrottlePolicy.FIXED,
            max_tasks_per_second=0.2,
        )
        # the 10 s wait ended at once; the bucket, empty, now needs 5 s
        faster = await wait_for(handle, lambda p: p.rate_waits == 2 and p.throttled_until is not None)
        assert (faster.replayed, faster.max_tasks_per_second) == (1, 0.2)
        assert faster.rate_reason is not None and 4 <= wait_of(faster.rate_reason) <= 5
        await temporal_env.sleep(5)
        await wait_for(handle, lambda p: p.replayed == 2 and p.rate_waits == 3)
        cleared = await handle.execute_update(ResumptionWorkflow.configure, ControlChange(max_tasks_per_second=0))
        assert cleared.max_tasks_per_second is None
        result = await handle.result()
        progress = await handle.query(ResumptionWorkflow.progress)
    assert (result.outcome, result.replayed, progress.rate_waits, progress.max_tasks_per_second) == (
        Outcome.COMPLETED,
        40,
        3,
        None,
    )
    types = [e.event_type for e in await history(handle)]
    assert types.count(EventType.EVENT_TYPE_TIMER_CANCELED) == 2  # each accepted Update ended a wait
    assert types.count(EventType.EVENT_TYPE_TIMER_FIRED) == 1
    assert types.count(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED) == 2


async def test_the_stream_cap_holds_the_replay_and_a_long_rate_wait_is_no_stall(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """An empty bucket of the stream's cap (0.01/s: 100 s of Redis's clock per task, longer than the
    test): every publish is ``rate_limited``, the run waits on timers of 10 s (half its claim's
    lease of 20 s) with the progress naming the stream's cap, and 40 s of workflow time without a
    move is no stall (window 15 s). Raising the cap lets the replay complete."""
    e = experiment()
    await hold_tasks(redis, e, 5)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    seconds, micros = await redis.time()
    key = ratecap.rate_key(STREAM)
    await redis.hset(key, mapping={"limit": "0.01", "tokens": "0", "at": str(seconds * 1000 + micros // 1000)})
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client, task_queue, experiment_id=e, stall_window_seconds=15, claim_lease_seconds=20
        )
        for waits in range(1, 5):
            progress = await wait_for(handle, lambda p, n=waits: p.rate_waits == n and p.throttled_until is not None)
            await temporal_env.sleep(10)
        assert progress.replayed == 0 and progress.phase is Phase.RATE_LIMITED
        assert progress.stream_rate_limit == 0.01 and not progress.stalled
        assert progress.rate_reason == "stream cap 0.01 tasks/s ({xmc-tasks-stream}:rate): 10s for the bucket"
        await ratecap.set_stream_rate(redis, STREAM, 1_000)
        await redis.hset(key, "tokens", "1000")
        result = await handle.result()
    assert (result.outcome, result.replayed, result.throttles) == (Outcome.COMPLETED, 5, 0)
    statuses = [r["status"] for kind, r in await redis_calls(handle) if kind == "publish_batch"]
    assert statuses[:4] == ["rate_limited"] * 4 and statuses[-1] == "completed"


@pytest.mark.parametrize("bad", [0, 0.0001, -1, float("inf"), float("nan"), 1e7])
def test_a_cap_on_the_input_is_bounded_and_finite(bad: float) -> None:
    with pytest.raises(ValidationError, match="max_tasks_per_second"):
        ResumptionInput(experiment_id="E", max_tasks_per_second=bad)


def windows_bound(added_ms: list[int], rate: float, capacity: float) -> list[tuple[int, int]]:
    """The windows ``(i, j)`` of the entries added at ``added_ms`` (their IDs' milliseconds, Redis's
    clock) that hold more than ``rate x w + capacity`` tasks, w the window's seconds; +1 ms: an ID's
    millisecond holds anything up to 1 ms later."""
    return [
        (i, j)
        for i in range(len(added_ms))
        for j in range(i, len(added_ms))
        if j - i + 1 > rate * (added_ms[j] - added_ms[i] + 1) / 1000 + capacity
    ]


async def test_a_slow_first_publish_does_not_let_the_cap_move_more_in_its_first_second(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """Issue 26, row 3: ``max_tasks_per_second`` 2 (a bucket of 2, full at the start), one task a
    publish (batch 1), the first publish 0.4 s late on the way to Redis. Any window of w seconds
    of the stream holds at most 2w + 2 tasks, the first second included (before: the bucket counted
    the first publish's way to Redis as refill, and 3 tasks landed within a few milliseconds)."""
    e = experiment()
    await hold_tasks(redis, e, 6)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    with losing_proxy(port_of(redis_url)) as proxy:
        proxy.delay(b"}:rate", 0.4)  # the publish script's KEYS: only it names {S}:rate
        url = redis_url.replace(str(port_of(redis_url)), str(proxy.port))
        async with resumption_worker(temporal_env.client, task_queue, url):
            handle = await start(temporal_env.client, task_queue, experiment_id=e, batch_size=1, max_tasks_per_second=2)
            result = await handle.result()
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 6)
    added = [int(entry_id.split(b"-")[0]) for entry_id, _ in await redis.xrange(STREAM)]
    assert windows_bound(added, 2, 2) == [], [a - added[0] for a in added]
