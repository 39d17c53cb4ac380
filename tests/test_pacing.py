"""The throttle policies end to end on Temporal's time-skipping test server, against a real
redis-server: what each wait is, what follows it, and that the backlog bound holds inside the
publish script itself (read from the recorded results, not by sampling)."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid

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
    wait_for,
)
from xmc_resumption.consumer import entries_of
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.workflows.models import Outcome, Phase, ThrottlePolicy
from xmc_resumption.workflows.resumption import ResumptionWorkflow


async def test_adaptive_keeps_up_with_fast_consumers_by_polling(temporal_env, redis, redis_url, task_queue) -> None:
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 600)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=10, rate=1_000))
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=50,
            batch_size=20,
            throttle_policy="adaptive",
        )
        result = await asyncio.wait_for(handle.result(), 60)
        progress = await handle.query(ResumptionWorkflow.progress)
    stop.set()
    await consumer
    calls = await redis_calls(handle)
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.COMPLETED, 600, 0)
    assert await stream_tasks(redis) == names and seen == names
    kinds = [k for k, _ in calls]
    assert "timer" not in kinds  # consumers this fast are waited for by polls, not 1 s timers
    assert kinds.count("wait_for_drain") == result.throttles >= 5
    assert progress.drain_rate is not None and progress.drain_rate > 100
    # at most 3/4 of the threshold, or one learned burst (the largest drop a poll saw) below it: a busy machine
    # stretches the poll interval, and the consumers then take more at once
    burst = max(r["largest_drop"] for k, r in calls if k == "wait_for_drain")
    assert progress.low_watermark is not None and 0 <= progress.low_watermark <= max(37, min(burst, 49)), burst
    assert_checked_after_every_wait(calls)
    assert_waited_at_the_threshold(calls)
    assert_never_over(calls, 50)
    # a publish that left headroom is followed by the next publish, with no check in between
    chained = sum(1 for (a, r), (b, _) in itertools.pairwise(calls)
                  if a == "publish_batch" == b and r["status"] == "published")  # fmt: skip
    assert chained >= 1


async def test_adaptive_waits_grow_when_nobody_drains_and_a_stall_ends_the_run(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """No consumer: one poll finds no drain, the waits grow to ``max_wait_seconds`` timers, the run
    says stalled after the window and ends ``stalled`` after ``max_stall_seconds``, handing the
    experiment back as paused with every held task still held."""
    e = f"E{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, 30)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=10,
            batch_size=4,
            throttle_policy="adaptive",
            max_wait_seconds=30,
            stall_window_seconds=60,
            max_stall_seconds=300,
        )
        result = await asyncio.wait_for(handle.result(), 60)
        progress = await handle.query(ResumptionWorkflow.progress)
    calls = await redis_calls(handle)
    timers = [s for k, s in calls if k == "timer"]
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.STALLED, 10, 20)
    assert timers and timers[-1] == 30.0 and max(timers) == 30.0
    assert sum(timers) >= 300 - 30
    assert progress.stalled and progress.stall_reason and "not going down" in progress.stall_reason
    assert progress.drain_rate == 0
    assert_checked_after_every_wait(calls)
    assert_waited_at_the_threshold(calls)
    assert_never_over(calls, 10)
    assert calls[-1][0] == "release_claim"
    assert await held.get_state(redis, keys) is ExperimentState.PAUSED
    assert not await redis.exists(keys.claim)
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == names[10:]
    assert await stream_tasks(redis) == names[:10]


async def test_a_pause_during_an_adaptive_wait_publishes_nothing_more(
    temporal_env, redis, redis_url, task_queue
) -> None:
    e = f"E{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    await hold_tasks(redis, e, 30)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=10, throttle_policy="adaptive"
        )
        await wait_for(handle, lambda p: p.phase is Phase.THROTTLED)
        await held.pause(redis, keys)
        await redis.xgroup_setid(STREAM, GROUP, "$")  # the backlog is gone: only the pause stops it now
        result = await asyncio.wait_for(handle.result(), 60)
    calls = await redis_calls(handle)
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.PAUSED, 10, 20)
    assert await redis.xlen(keys.held) == 20 and await redis.xlen(STREAM) == 10
    assert_checked_after_every_wait(calls)
    assert [k for k, _ in calls][-2:] == ["check_claim", "release_claim"]


async def test_the_default_is_adaptive_and_polls_through_a_short_stop(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """An input without ``throttle_policy`` replays adaptively (patch ``pacing-probe`` recorded). The
    consumers stop for 3.5 s mid-run: the replay polls through it (no durable timer: the waits stay
    polls, its drain estimate kept), re-checks pause and fencing after every wait, learns the
    consumers' burst, and never passes the threshold."""
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 300)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    seen: list[bytes] = []

    async def consumers() -> None:
        """Read 10 at a time at 1,000/s, acknowledging at once; stop for 3.5 s after 120."""
        stopped = False
        while len(seen) < len(names):
            if len(seen) >= 120 and not stopped:
                stopped = True
                await asyncio.sleep(3.5)
            entries = entries_of(await redis.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=10, block=50))
            if entries:
                seen.extend(fields[b"task"] for _, fields in entries)
                await redis.xack(STREAM, GROUP, *[entry_id for entry_id, _ in entries])
                await asyncio.sleep(len(entries) / 1_000)

    consumer = asyncio.create_task(consumers())
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=50, batch_size=20)
        result = await asyncio.wait_for(handle.result(), 60)
        progress = await handle.query(ResumptionWorkflow.progress)
    await asyncio.wait_for(consumer, 30)
    calls = await redis_calls(handle)
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.COMPLETED, 300, 0)
    assert await stream_tasks(redis) == names and seen == names
    assert progress.policy is ThrottlePolicy.ADAPTIVE
    kinds = [k for k, _ in calls]
    assert "timer" not in kinds
    polls = [r for k, r in calls if k == "wait_for_drain"]
    assert len(polls) == result.throttles >= 5
    assert any(not r["reached"] and r["seconds"] >= 1.9 for r in polls)  # a whole poll through the stop
    assert max(r["largest_drop"] for r in polls) >= 10  # a read of 10, acknowledged at once
    assert progress.low_watermark is not None and progress.low_watermark >= 10
    assert_checked_after_every_wait(calls)
    assert_waited_at_the_threshold(calls)
    assert_never_over(calls, 50)


async def test_the_drain_rate_is_the_consumers_rate_across_durable_waits(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """One consumer acknowledges 40 tasks/s steadily and is never starved; ``min_wait_seconds`` 2.5 makes every wait
    a durable timer, so the drain is seen only by the publishes: the backlog each one measures before its own move
    against what the one before left. The ``drain_rate`` the progress shows is the consumer's rate (within a factor
    of 1.5), the rate computed from its own acknowledgements and clock, not 0/s."""
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 380)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen, reads = asyncio.Event(), [], []  # reads: (monotonic seconds once acknowledged, entries read)
    rate, per_read = 40.0, 10

    async def consumer() -> None:
        """Read up to 10, acknowledge them, then sleep until 10 / 40 s after the read began."""
        while not stop.is_set():
            began = time.monotonic()
            entries = entries_of(await redis.xreadgroup(GROUP, "c1", {STREAM: ">"}, count=per_read, block=50))
            if entries:
                seen.extend(fields[b"task"] for _, fields in entries)
                await redis.xack(STREAM, GROUP, *[entry_id for entry_id, _ in entries])
                await asyncio.sleep(max(0.0, began + len(entries) / rate - time.monotonic()))
            reads.append((time.monotonic(), len(entries)))

    reading = asyncio.create_task(consumer())
    try:
        async with resumption_worker(temporal_env.client, task_queue, redis_url):
            handle = await start(
                temporal_env.client,
                task_queue,
                experiment_id=e,
                max_backlog_threshold=160,
                batch_size=160,
                throttle_policy="adaptive",
                min_wait_seconds=2.5,
            )
            with temporal_env.auto_time_skipping_disabled():  # the consumer drains in real time: so do the timers
                result = await asyncio.wait_for(handle.result(), 60)
            progress = await handle.query(ResumptionWorkflow.progress)
    finally:
        stop.set()
        await reading
    calls = await redis_calls(handle)
    assert (result.outcome, result.replayed, result.throttles) == (Outcome.COMPLETED, 380, 2)
    assert [k for k, _ in calls].count("timer") == 2 and "wait_for_drain" not in [k for k, _ in calls]
    # the consumer's rate while it had entries to read: over every two successive reads that were both full, by
    # its own clock
    busy = [(t1 - t0, n1) for (t0, n0), (t1, n1) in itertools.pairwise(reads) if n0 == n1 == per_read]
    truth = sum(n for _, n in busy) / sum(seconds for seconds, _ in busy)
    assert progress.drain_rate is not None
    assert truth / 1.5 <= progress.drain_rate <= truth * 1.5, (progress.drain_rate, truth)
    assert await stream_tasks(redis) == names and seen == names[: len(seen)]
    assert_checked_after_every_wait(calls)
    assert_never_over(calls, 160)
