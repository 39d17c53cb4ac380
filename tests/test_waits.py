"""What the replay's waits cost and when they end (issue 16, items 5 and 7): every wait counts
against ``max_stall_seconds`` (a Redis-memory wait once restarted the stall window, so the limit
never fired), and no legal input makes the replay spin (``max_wait_seconds`` 0.001 with stopped
consumers ran 52 turns a second): every wait is bounded by at least ``WAIT_FLOOR_SECONDS``."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from tests.support.helpers import STREAM, cancelled, fill_backlog, hold_tasks, resumption_worker, start, wait_for
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.workflows.models import Outcome, Phase
from xmc_resumption.workflows.resumption import ResumptionWorkflow
from xmc_resumption.workflows.throttle import POLL_READINGS, WAIT_FLOOR_SECONDS, Pacer, Pacing, WaitKind, WaitPlan

T0 = datetime(2026, 1, 1, tzinfo=UTC)

MIB = 1024 * 1024


async def test_memory_waits_count_against_the_stall_limit(temporal_env, redis: Redis, redis_url, task_queue) -> None:
    """Redis's used memory stays over ``max_memory_fraction`` and nothing drains: with
    ``max_stall_seconds`` 20 the run ends ``stalled`` (not waiting for ever), names Redis's memory
    in the reason, and hands the experiment back as paused with every task held."""
    e = f"E{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    await hold_tasks(redis, e, 10)
    await redis.config_set("maxmemory", str(100 * MIB))
    try:
        async with resumption_worker(temporal_env.client, task_queue, redis_url):
            handle = await start(
                temporal_env.client,
                task_queue,
                experiment_id=e,
                max_memory_fraction=0.01,
                missing_group="zero",
                throttle_seconds=5,
                stall_window_seconds=10,
                max_stall_seconds=20,
            )
            result = await asyncio.wait_for(handle.result(), 60)
            progress = await handle.query(ResumptionWorkflow.progress)
    finally:
        await redis.config_set("maxmemory", "0")
    assert (result.outcome, result.replayed, result.remaining, result.release_error) == (Outcome.STALLED, 0, 10, None)
    assert 3 <= result.throttles <= 6  # memory waits of 5 s up to the 20 s limit, not an endless count
    assert progress.stall_reason is not None and "Redis memory" in progress.stall_reason
    assert await held.get_state(redis, keys) is ExperimentState.PAUSED
    assert await redis.xlen(keys.held) == 10 and not await redis.exists(STREAM)


def test_every_planned_wait_is_bounded_by_at_least_the_floor() -> None:
    """Whatever ``max_wait_seconds`` or ``throttle_seconds`` say, a wait whose backlog does not
    drain lasts at least the floor, and a poll takes at most ``POLL_READINGS`` readings then."""
    for adaptive in (False, True):
        for rate in (None, 0.0, 1e-6):
            settings = Pacing(adaptive, threshold=10, throttle_seconds=0.001, min_wait=0.0, max_wait=0.001)
            plan = Pacer(rate=rate).plan(settings, 10, T0)
            assert plan.seconds >= WAIT_FLOOR_SECONDS, (adaptive, rate, plan)
            if plan.kind is WaitKind.POLL:
                assert plan.seconds / plan.poll_seconds + 1 <= POLL_READINGS, plan
    assert WaitPlan.timer(0.001).seconds == WAIT_FLOOR_SECONDS
    # a draining backlog still gets a short poll interval: the floor bounds, it does not delay
    settings = Pacing(True, threshold=500, throttle_seconds=10, min_wait=0.0, max_wait=0.001)
    fast = Pacer(rate=100_000.0).plan(settings, 500, T0)
    assert fast.kind is WaitKind.POLL and fast.poll_seconds < 0.01


async def _scripts_run(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


@pytest.mark.slow  # a 6 s window
async def test_stopped_consumers_under_the_shortest_max_wait_do_not_spin(
    temporal_env, redis: Redis, redis_url, task_queue
) -> None:
    """Adaptive, ``max_wait_seconds`` 0.001 (legal), the backlog at the threshold and no consumer:
    over a 6 s window the replay turns at most ``1 / WAIT_FLOOR_SECONDS`` times a second and runs
    at most ``POLL_READINGS + 3`` scripts a turn (it ran 52 turns and 231 scripts a second)."""
    e = f"E{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 50)
    await fill_backlog(redis, 10)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=10,
            throttle_policy="adaptive",
            max_wait_seconds=0.001,
        )
        first = await wait_for(handle, lambda p: p.phase in (Phase.THROTTLED, Phase.STALLED) and p.turns >= 2)
        scripts, t0 = await _scripts_run(redis), time.monotonic()
        await asyncio.sleep(6)
        last = await handle.query(ResumptionWorkflow.progress)
        scripts, window = await _scripts_run(redis) - scripts, time.monotonic() - t0
        await cancelled(handle)
    turns = last.turns - first.turns
    print(f"stopped consumers, max_wait_seconds 0.001: {turns / window:.1f} turns/s, {scripts / window:.1f} scripts/s")
    bound = window / WAIT_FLOOR_SECONDS + 2  # a turn in progress at each end of the window
    assert 1 <= turns <= bound, (turns, window)
    assert scripts <= bound * (POLL_READINGS + 3), (scripts, turns, window)
    assert last.replayed == 0 and last.outcome is None
