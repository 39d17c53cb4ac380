"""Publishes in rounds (``publish.publish_rounds``) against a real redis-server: several scripts in one call, each
bounded by its batch, stopping where the headroom, the bound, a fault or a status says."""

from __future__ import annotations

import time

import pytest
from redis.asyncio import Redis

from tests.test_publish import GROUP, KEYS, hold, stream_tasks
from xmc_resumption.redisclient import fencing
from xmc_resumption.redisclient.errors import MissingConsumerGroupError
from xmc_resumption.redisclient.keys import ExperimentKeys, replayers_key
from xmc_resumption.redisclient.publish import SCRIPT_TASKS, PublishParams, publish_batch, publish_rounds
from xmc_resumption.redisclient.readings import MissingGroupPolicy
from xmc_resumption.redisclient.results import PublishStatus


async def rounds(redis: Redis, token: int, seq: int, **kw):  # type: ignore[no-untyped-def]
    args = {"batch_size": 10, "max_tasks": None, "max_scripts": 100, "max_seconds": 5.0, "threshold": 100}
    return await publish_rounds(
        redis, KEYS, GROUP, PublishParams(token=token, seq=seq, owner="me", lease_ms=60_000, **args | kw)
    )


async def claimed(redis: Redis, tasks: int) -> int:
    await hold(redis, tasks)
    await redis.xgroup_create(KEYS.stream, GROUP, id="$", mkstream=True)
    return (await fencing.acquire_claim(redis, KEYS, "me", 60_000)).token


async def test_fills_the_headroom_in_scripts_of_one_batch(redis: Redis) -> None:
    token = await claimed(redis, 100)
    done = await rounds(redis, token, 1, threshold=35)
    # 10 + 10 + 10 + 5: the fourth script found headroom 5 and moved it, leaving none
    assert (done.scripts, done.moved, done.fresh_moved) == (4, 35, 35)
    assert (done.first.moved, done.first.reading.backlog, done.first.remaining) == (10, 0, 90)
    assert done.last is not None and (done.last.moved, done.last.reading.backlog, done.last.headroom_left) == (5, 30, 0)
    assert done.final is done.last and done.results() == [done.first, done.last]
    assert await stream_tasks(redis) == [f"t{i}".encode() for i in range(35)]
    # the seqs 1..4 were used: seq 4 again is the recorded result, 5 goes on (and finds no headroom)
    again = await publish_batch(
        redis, KEYS, GROUP, PublishParams(token=token, seq=4, batch_size=10, threshold=35, owner="me", lease_ms=60_000)
    )
    assert again.repeated and again.moved == 5
    nxt = await rounds(redis, token, 5, threshold=35)
    assert (nxt.scripts, nxt.moved, nxt.first.status, nxt.last) == (1, 0, PublishStatus.THROTTLED, None)


async def test_stops_at_completion_max_tasks_and_max_scripts(redis: Redis) -> None:
    token = await claimed(redis, 25)
    capped = await rounds(redis, token, 1, max_tasks=13)
    assert (capped.scripts, capped.moved, capped.final.moved) == (2, 13, 3)  # the second script's batch is what is left
    few = await rounds(redis, token, 3, max_scripts=1)
    assert (few.scripts, few.moved, few.last) == (1, 10, None)
    rest = await rounds(redis, token, 4)
    assert (rest.scripts, rest.moved, rest.final.status, rest.final.remaining) == (1, 2, PublishStatus.COMPLETED, 0)
    assert await stream_tasks(redis) == [f"t{i}".encode() for i in range(25)]


async def test_the_time_bound_ends_the_rounds_after_the_first_script(redis: Redis) -> None:
    token = await claimed(redis, 50)
    once = await rounds(redis, token, 1, max_seconds=0.0)
    assert (once.scripts, once.moved) == (1, 10)


async def test_the_rounds_report_how_long_they_ran(redis: Redis) -> None:
    """What a local call counts against its workflow task's budget (``workflows.calls.TaskClock``)."""
    token = await claimed(redis, 30)
    began = time.monotonic()
    done = await rounds(redis, token, 1)
    outside = time.monotonic() - began
    assert done.scripts == 3 and 0 < done.seconds <= outside


async def test_a_status_other_than_published_ends_them(redis: Redis) -> None:
    token = await claimed(redis, 30)
    await redis.set(KEYS.state, "paused")
    paused = await rounds(redis, token, 1)
    assert (paused.scripts, paused.moved, paused.first.status) == (1, 0, PublishStatus.PAUSED)
    await redis.set(KEYS.state, "resuming")
    resumed = await rounds(redis, token, 1)  # a paused publish writes no record: seq 1 moves
    assert (resumed.scripts, resumed.moved, resumed.final.status) == (3, 30, PublishStatus.COMPLETED)


async def test_a_fault_after_a_script_answered_ends_them_with_what_answered(redis: Redis) -> None:
    token = await claimed(redis, 40)
    calls = 0
    real = redis.evalsha

    async def evalsha(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 3:
            raise ConnectionError("connection reset")
        return await real(*args, **kwargs)

    redis.evalsha = evalsha  # type: ignore[method-assign]
    try:
        partial = await rounds(redis, token, 1)
    finally:
        redis.evalsha = real  # type: ignore[method-assign]
    assert (partial.scripts, partial.moved) == (2, 20)
    # the failed script (seq 3) never reached Redis: asked again, it moves the next batch
    nxt = await rounds(redis, token, 3, max_scripts=1)
    assert (nxt.moved, nxt.first.repeated) == (10, False)
    assert await stream_tasks(redis) == [f"t{i}".encode() for i in range(30)]


async def test_a_call_asked_again_after_a_lost_reply_returns_its_last_scripts_result(redis: Redis) -> None:
    """The reply of a call that ran seqs 1..3 was lost: asked again from seq 1, its first script is older than the
    record's (stale), so the call returns the recorded result of seq 3 and runs no more."""
    token = await claimed(redis, 40)
    done = await rounds(redis, token, 1, threshold=30)
    assert (done.scripts, done.moved) == (3, 30)
    again = await rounds(redis, token, 1, threshold=30)
    assert (again.scripts, again.moved, again.fresh_moved, again.last) == (3, 10, 0, None)
    assert again.first.repeated and again.first.status is PublishStatus.PUBLISHED
    assert (again.first.total_moved, again.first.remaining) == (30, 10)
    # a reset further back than one call (more seqs than it may use) is stale, as a single publish is
    older = await rounds(redis, token, 1, threshold=30, max_scripts=2)
    assert (older.first.status, older.first.last_seq, older.scripts) == (PublishStatus.STALE, 3, 1)
    assert await stream_tasks(redis) == [f"t{i}".encode() for i in range(30)]


async def test_a_call_asked_again_names_what_it_moved_though_its_last_script_moved_none(redis: Redis) -> None:
    """A call's first script moved 5 tasks and its second none (another replay filled the backlog); its reply was
    lost. Asked again, the recorded result of its last script moved nothing, yet names the last task the call moved:
    every reply carries the publish record's ``last_moved_id``, so the caller's ``moved_through`` does not fall behind
    (a crash failover that lost those moves would move them again unmarked)."""
    token = await claimed(redis, 20)
    held_ids = [entry_id.decode() for entry_id, _ in await redis.xrange(KEYS.held)]
    real, answered = redis.evalsha, 0

    async def evalsha(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal answered
        reply = await real(*args, **kwargs)
        answered += 1
        if answered == 1:  # after the first script, another replay's tasks fill the backlog to the threshold
            for i in range(5):
                await redis.xadd(KEYS.stream, {"task": f"other{i}"})
        return reply

    redis.evalsha = evalsha  # type: ignore[method-assign]
    try:
        lost = await rounds(redis, token, 1, batch_size=5, threshold=10)
    finally:
        redis.evalsha = real  # type: ignore[method-assign]
    assert (lost.scripts, lost.moved, lost.final.moved, lost.final.status) == (2, 5, 0, PublishStatus.THROTTLED)
    assert lost.last_moved_id == lost.final.last_moved_id == held_ids[4]
    again = await rounds(redis, token, 1, batch_size=5, threshold=10)
    assert (again.scripts, again.moved, again.first.repeated, again.first.replayed) == (2, 0, True, 5)
    assert again.last_moved_id == again.first.last_moved_id == held_ids[4]
    # a reply that moved nothing now names it too: a stale one, and the next call's
    stale = await rounds(redis, token, 1, batch_size=5, threshold=10, max_scripts=1)
    assert (stale.first.status, stale.first.last_moved_id) == (PublishStatus.STALE, held_ids[4])
    nxt = await rounds(redis, token, 3, batch_size=5, threshold=10)
    assert (nxt.moved, nxt.first.status, nxt.last_moved_id) == (0, PublishStatus.THROTTLED, held_ids[4])


async def test_with_the_fair_share_one_call_takes_one_share(redis: Redis) -> None:
    """Two fair-share replayers of one stream: a call whose scripts are cut short by the batch takes the first
    script's share, not a fresh share of what each script leaves."""
    token = await claimed(redis, 100)
    other = ExperimentKeys(KEYS.stream, "E2")
    seconds, micros = await redis.time()
    lease_end = seconds * 1000 + micros // 1000 + 60_000
    await redis.zadd(replayers_key(KEYS.stream), {other.experiment_id: lease_end})  # a live replayer besides us
    shared = await rounds(redis, token, 1, threshold=100, fair_share=True)
    assert shared.first.reading.headroom == 50  # half of 100
    assert (shared.moved, shared.scripts) == (50, 5)


async def test_a_fault_in_the_first_script_is_raised(redis: Redis) -> None:
    await hold(redis, 5)
    token = (await fencing.acquire_claim(redis, KEYS, "me", 60_000)).token
    with pytest.raises(MissingConsumerGroupError):
        await rounds(redis, token, 1, missing_group=MissingGroupPolicy.ERROR)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_scripts", 0, "max_scripts must be 1..10,000"),
        ("max_seconds", float("nan"), "max_seconds must be finite"),
        ("max_seconds", 61.0, "max_seconds must be finite, 0..60"),
        ("max_tasks", 0, "max_tasks must be >= 1"),
    ],
)
async def test_bad_bounds_are_refused_before_anything_is_sent(
    redis: Redis, field: str, value: float, message: str
) -> None:
    token = await claimed(redis, 5)
    with pytest.raises(ValueError, match=message):
        await rounds(redis, token, 1, **{field: value})
    assert await redis.xlen(KEYS.held) == 5 and await redis.xlen(KEYS.stream) == 0


async def test_a_batch_larger_than_a_script_may_move_runs_more_scripts(redis: Redis) -> None:
    """Issue 25 item 3: batch 5,000 moves in scripts of at most ``SCRIPT_TASKS`` (a script of 5,000 blocks Redis past
    50 ms), in the same call."""
    token = await claimed(redis, 5_000)
    done = await rounds(redis, token, 1, batch_size=5_000, threshold=100_000)
    assert (done.scripts, done.moved, done.first.moved, done.final.status) == (3, 5_000, SCRIPT_TASKS, "completed")
    assert done.last is not None and done.last.moved == 5_000 - 2 * SCRIPT_TASKS
