"""The ETA (``workflows/eta.py``): the net drain rate from readings, the time left from it, and the
workflow's progress showing it (None before a rate, the formula's value mid-run, 0 at the end).
Its accuracy is a bench figure (``python -m bench --only h``), not a timed test."""

from __future__ import annotations

import asyncio
import math
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import WorkflowFailureError

from tests.support.helpers import (
    GROUP,
    STREAM,
    consume,
    fill_backlog,
    hold_tasks,
    resumption_worker,
    start,
    throttled,
    throttled_replay,
    wait_for,
)
from xmc_resumption.workflows.eta import (
    ETA_FIRST_SECONDS,
    ETA_TIME_CONSTANT_SECONDS,
    MAX_ETA_SECONDS,
    NetRate,
    eta_seconds,
)
from xmc_resumption.workflows.models import Outcome, Phase, Progress, ResumptionInput
from xmc_resumption.workflows.resumption import ResumptionWorkflow
from xmc_resumption.workflows.state import RunState
from xmc_resumption.workflows.text import details_markdown

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_net_rate_is_replayed_minus_backlog_per_second() -> None:
    """A burst into an empty stream is no speed; then 100 drained per second (the backlog falls as
    much as was replayed, or was replayed without the backlog growing) is 100/s."""
    net = NetRate()
    net.observe(replayed=0, backlog=0, capped=False, at=at(0))
    net.observe(replayed=500, backlog=500, capped=False, at=at(0.01))  # the first publish: the headroom
    assert net.rate is None  # less than ETA_FIRST_SECONDS measured
    net.observe(replayed=500, backlog=400, capped=False, at=at(1.01))  # 100 drained in 1 s
    # the burst's 10 ms count as 0/s, weighted by time: the corrected exponential average
    w_burst, w_drain = 1 - math.exp(-0.01 / ETA_TIME_CONSTANT_SECONDS), 1 - math.exp(-1 / ETA_TIME_CONSTANT_SECONDS)
    decay = math.exp(-1 / ETA_TIME_CONSTANT_SECONDS)
    assert net.rate == pytest.approx(100 * w_drain / (w_burst * decay + w_drain), rel=1e-12)
    assert 98.9 < net.rate < 99.1
    net.observe(replayed=600, backlog=400, capped=False, at=at(2.01))  # 100 moved, backlog unchanged
    net.observe(replayed=600, backlog=10_000, capped=True, at=at(2.5))  # a capped reading: skipped
    net.observe(replayed=800, backlog=400, capped=False, at=at(4.01))  # 200 in 2 s, from the last exact one
    assert net.rate == pytest.approx(100, rel=0.01)


def test_the_average_follows_a_new_rate_within_a_few_time_constants() -> None:
    net = NetRate()
    replayed = 0
    for second in range(601):
        net.observe(replayed=replayed, backlog=0, capped=False, at=at(second))
        replayed += 10 if second < 300 else 40
    assert net.rate == pytest.approx(40, rel=0.01)


def test_a_backlog_growing_faster_than_the_replay_is_a_net_rate_of_zero() -> None:
    net = NetRate()
    net.observe(replayed=0, backlog=0, capped=False, at=at(0))
    net.observe(replayed=10, backlog=50, capped=False, at=at(ETA_FIRST_SECONDS * 2))
    assert net.rate == 0
    assert eta_seconds(100, 0, net.rate) is None


@pytest.mark.parametrize(
    ("remaining", "headroom", "rate", "cap", "expected"),
    [
        (None, 0, 100.0, None, None),  # nothing known about the held tasks yet
        (0, 0, None, None, 0.0),  # nothing held: done, rate or not
        (1_000, 0, None, None, None),  # no rate yet
        (1_000, 0, 0.0, None, None),  # consumers not draining: no time can be given
        (1_000, 0, 100.0, None, 10.0),
        (1_000, 200, 100.0, None, 8.0),  # the next publish moves 200 at once
        (100, 500, 100.0, None, 0.0),  # all of it fits the headroom
        (1_000, 200, 100.0, 50.0, 20.0),  # a cap of 50/s: no faster than that
        (1_000, 0, 100.0, 500.0, 10.0),  # a cap above the drain changes nothing
        (10**9, 0, 1.0, None, None),  # more than a year: no estimate
    ],
)
def test_eta_seconds(
    remaining: int | None, headroom: int, rate: float | None, cap: float | None, expected: float | None
) -> None:
    assert eta_seconds(remaining, headroom, rate, cap) == expected
    assert MAX_ETA_SECONDS < 10**9


def test_the_adaptive_policys_last_refill_waits_for_the_low_watermark() -> None:
    """Threshold 500, low watermark 100: with 150 held and no headroom the replay refills once the
    backlog fell to 100, so 400 must drain first, not 150; with the headroom for all of it, none."""
    assert eta_seconds(150, 0, 100.0, refill=400) == 4.0
    assert eta_seconds(1_000, 0, 100.0, refill=400) == 10.0
    assert eta_seconds(150, 200, 100.0, refill=400) == 0.0


def test_nothing_moves_before_a_durable_wait_ends() -> None:
    assert eta_seconds(100, 0, 500.0, wait_left=1.0) == 1.0
    assert eta_seconds(1_000, 0, 500.0, wait_left=1.0) == 2.0
    assert eta_seconds(0, 0, None, wait_left=1.0) == 0.0


def test_the_details_show_the_eta_or_why_not() -> None:
    p = Progress(experiment_id="E", threshold=500)
    assert "- ETA: - (no net drain rate measured yet)" in details_markdown(p)
    p.net_rate, p.eta_seconds, p.eta_at = 412.4, 65.2, datetime(2025, 1, 1, 12, 34, 56, tzinfo=UTC)
    assert "- ETA: ~1m 05s (at 12:34:56Z), net ~412/s" in details_markdown(p)
    p.eta_seconds = 0.0
    assert "- ETA: 0s (nothing left to move)" in details_markdown(p)


async def test_no_eta_before_a_rate(temporal_env, redis, redis_url, task_queue) -> None:
    """Throttled at its first reading (backlog 5 at threshold 5), nothing drained: no rate, no ETA."""
    async with throttled_replay(temporal_env, task_queue, redis, redis_url) as run:
        progress = await run.handle.query(ResumptionWorkflow.progress)
        await run.handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await run.handle.result()
    assert (progress.remaining, progress.net_rate, progress.eta_seconds, progress.eta_at) == (10, None, None, None)
    assert "ETA: - (no net drain rate measured yet)" in details_markdown(progress)


async def drain(redis, consumer: str = "c1") -> int:  # type: ignore[no-untyped-def]
    """Read and acknowledge every entry the group has not read yet; returns how many."""
    got = await redis.xreadgroup(GROUP, consumer, {STREAM: ">"}, count=1_000)
    ids = [entry_id for _, entries in got for entry_id, _ in entries]
    if ids:
        await redis.xack(STREAM, GROUP, *ids)
    return len(ids)


async def test_the_eta_mid_run_is_the_formulas_and_zero_at_the_end(temporal_env, redis, redis_url, task_queue) -> None:
    """Fixed waits of 1 s at threshold 5; before each wait ends the test drains the stream: 5 tasks
    per second of workflow time. After three waits the net rate is at most 5/s and the ETA is
    ``eta_seconds`` of the progress's own remaining (15), headroom (0) and rate, ``eta_at`` that
    much after the reading; at the end it is 0."""
    e = f"E{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 30)
    await fill_backlog(redis, 5)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            batch_size=5,
            throttle_seconds=1,
            throttle_policy="fixed",
        )
        await wait_for(handle, throttled)
        for waits in (2, 3, 4):
            assert await drain(redis) == 5
            await temporal_env.sleep(1)  # the test server's clock: the timer fires
            mid = await wait_for(handle, lambda p, n=waits: p.throttles == n and p.phase is Phase.THROTTLED)
        assert await drain(redis) == 5
        await temporal_env.sleep(1)
        stop, seen = asyncio.Event(), []
        consumer = asyncio.create_task(consume(redis, "c2", stop, seen))
        done = await handle.result()
        stop.set()
        await consumer
        final = await handle.query(ResumptionWorkflow.progress)
    assert (mid.remaining, mid.backlog) == (15, 5)
    # 5 drained per wait of 1 s on the server's clock, which also runs in real time between the
    # test's steps: at most 5/s
    assert mid.net_rate is not None and 1 < mid.net_rate <= 5, mid.net_rate
    assert mid.eta_seconds is not None and mid.eta_at is not None
    assert mid.eta_seconds == eta_seconds(15, 0, mid.net_rate, wait_left=1.0) == 15 / mid.net_rate
    # eta_at is the reading's workflow time plus the ETA: the timer the wait started ends 1 s later
    assert mid.throttled_until is not None
    assert mid.eta_at - mid.throttled_until == pytest.approx(
        timedelta(seconds=mid.eta_seconds - 1), abs=timedelta(seconds=0.2)
    )
    assert done.outcome is Outcome.COMPLETED
    assert (final.phase, final.remaining, final.eta_seconds) == (Phase.DONE, 0, 0.0)
    assert final.eta_at is not None and "ETA: 0s" in details_markdown(final)


def test_under_a_shared_stream_cap_the_eta_counts_the_replays_share() -> None:
    """Issue 25 item 4: two replays take from one stream cap of 10/s, each moving about 5/s (its net
    rate): while the cap cuts its publishes, 100 left take 20 s, not the 10 s of the whole cap; a
    cap that does not cut them counts whole, and the replay's own cap is its alone."""
    state = RunState.of(ResumptionInput(experiment_id="E"))
    now = datetime(2025, 1, 1, tzinfo=UTC)
    state.progress.remaining, state.progress.backlog, state.progress.stream_rate_limit = 100, 0, 10.0
    state.net = NetRate(rate=5.0)
    state.stream_capped = True
    state.estimate(now)
    assert state.progress.eta_seconds == 20.0
    state.stream_capped = False
    state.estimate(now)
    assert state.progress.eta_seconds == 10.0
    state.stream_capped = True
    state.input = state.input.model_copy(update={"max_tasks_per_second": 2.0})
    state.estimate(now)
    assert state.progress.eta_seconds == 50.0
