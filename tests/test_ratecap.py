"""The stream-wide rate cap (``{S}:rate``, ``lua/rate.lua``) against a real redis-server: the bucket
bounds every window, is shared by the replays of a stream, validates before its first write, and a
retried publish takes its tokens once."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from xmc_resumption.redisclient import fencing, held, ratecap
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams, publish_batch
from xmc_resumption.redisclient.results import PublishResult, PublishStatus
from xmc_resumption.redisclient.scripts import source

STREAM = "xmc-tasks-stream"
GROUP = "xmc-workers"


async def hold(redis: Redis, keys: ExperimentKeys, n: int) -> int:
    """Pause ``keys``' experiment, hold ``n`` tasks, take the claim; returns the token."""
    await held.pause(redis, keys)
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(n):
            pipe.xadd(keys.held, {"task": f"{keys.experiment_id}-{i}"})
        await pipe.execute()
    return (await fencing.acquire_claim(redis, keys, "me", 60_000)).token


async def publish(redis: Redis, keys: ExperimentKeys, token: int, seq: int, batch: int = 1_000) -> PublishResult:
    return await publish_batch(
        redis,
        keys,
        GROUP,
        PublishParams(token=token, seq=seq, batch_size=batch, threshold=100_000, owner="me", lease_ms=60_000),
    )


def test_the_scripts_constants_are_the_modules() -> None:
    lua = source("publish")
    assert f"XMC_MAX_TASK_RATE = {ratecap.MAX_TASKS_PER_SECOND:.0f}" in lua
    assert f"XMC_RATE_BURST_SECONDS = {ratecap.RATE_BURST_SECONDS:g}" in lua
    assert f"XMC_MIN_TASK_RATE = {ratecap.MIN_TASKS_PER_SECOND:g}" in lua


async def test_set_read_and_clear_the_stream_cap(redis: Redis) -> None:
    assert await ratecap.stream_rate(redis, STREAM) is None
    await ratecap.set_stream_rate(redis, STREAM, 0.5)
    cap = await ratecap.stream_rate(redis, STREAM)
    assert cap is not None and (cap.key, cap.limit, cap.capacity, cap.tokens) == ("{xmc-tasks-stream}:rate", 0.5, 1, 1)
    for bad in (0, 0.0001, -1, float("nan"), float("inf"), 2e6, True):
        with pytest.raises(ValueError, match="rate cap"):
            await ratecap.set_stream_rate(redis, STREAM, bad)
    assert (await ratecap.stream_rate(redis, STREAM)).limit == 0.5  # type: ignore[union-attr]
    assert await ratecap.clear_stream_rate(redis, STREAM) is True
    assert await ratecap.clear_stream_rate(redis, STREAM) is False
    assert not await redis.exists("{xmc-tasks-stream}:rate")


async def test_a_full_bucket_then_the_rate(redis: Redis) -> None:
    """A cap of 20/s: the first publish moves the full bucket (20), the next one nothing
    (``rate_limited``, with the wait until a batch's worth is back), and half a second later about 10."""
    keys = ExperimentKeys(STREAM, "R1")
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    token = await hold(redis, keys, 100)
    await ratecap.set_stream_rate(redis, STREAM, 20)
    first = await publish(redis, keys, token, 1, batch=50)
    assert (first.status, first.moved, first.rate_limit, first.rate_limited) == (PublishStatus.PUBLISHED, 20, 20, True)
    assert 950 <= first.rate_wait_ms <= 1_000  # 20 tokens (the capacity, less than the batch) at 20/s
    second = await publish(redis, keys, token, 2, batch=5)
    assert (second.status, second.moved, second.remaining) == (PublishStatus.RATE_LIMITED, 0, 80)
    assert 200 <= second.rate_wait_ms <= 250  # 5 tokens at 20/s, less what refilled meanwhile
    await asyncio.sleep(0.5)
    third = await publish(redis, keys, token, 3, batch=50)
    assert third.status is PublishStatus.PUBLISHED and 9 <= third.moved <= 12, third
    # a retried seq returns its recorded result and takes no tokens
    tokens = (await ratecap.stream_rate(redis, STREAM)).tokens  # type: ignore[union-attr]
    again = await publish(redis, keys, token, 3, batch=50)
    assert again.repeated and not third.repeated  # marked as the recorded result of an earlier call
    assert again.model_copy(update={"repeated": False}) == third
    assert (await ratecap.stream_rate(redis, STREAM)).tokens >= tokens  # type: ignore[union-attr]
    # under the threshold's bound the cap is not what held the move back: no cut, no wait
    await ratecap.set_stream_rate(redis, STREAM, 1_000)
    await asyncio.sleep(0.05)
    fourth = await publish(redis, keys, token, 4, batch=3)
    assert (fourth.moved, fourth.rate_limit, fourth.rate_limited, fourth.rate_wait_ms) == (3, 1_000, False, 0)


async def test_the_bucket_bounds_every_window_shared_by_two_replays(redis: Redis) -> None:
    """Two replays of one stream publish as fast as they can for 2.5 s under a cap of 40/s: in every
    window of Redis's clock (each task's entry ID holds the millisecond it reached the stream) the
    two together moved at most 40 x the window + the bucket's 40, and each got some."""
    limit, seconds = 40.0, 2.5
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    await ratecap.set_stream_rate(redis, STREAM, limit)
    moved: dict[str, int] = {}

    async def replay(name: str) -> None:
        keys = ExperimentKeys(STREAM, name)
        token = await hold(redis, keys, 500)
        seq = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            seq += 1
            result = await publish(redis, keys, token, seq, batch=7)
            moved[name] = moved.get(name, 0) + result.moved
            await asyncio.sleep(0.002)

    await asyncio.gather(replay("A"), replay("B"))  # concurrent calls: two connections of the pool
    added = [int(entry_id.split(b"-")[0]) for entry_id, _ in await redis.xrange(STREAM)]
    assert moved["A"] > 0 and moved["B"] > 0 and sum(moved.values()) == len(added)
    assert len(added) >= limit * (seconds - 1)
    for i, first in enumerate(added):
        for j in range(i, len(added)):
            # +2 ms: a script's entry IDs and its TIME reading may differ by its own run time
            assert j - i + 1 <= limit * (added[j] - first + 2) / 1000 + ratecap.bucket_capacity(limit), (i, j)


def over_bound(added_ms: list[int], limit: float) -> list[tuple[int, int]]:
    """The windows ``(i, j)`` of the entries added at ``added_ms`` (their IDs' milliseconds: Redis's
    clock) holding more than ``limit x w + bucket_capacity(limit)`` tasks, w the window's seconds; +1
    ms: an ID's millisecond holds anything up to 1 ms later."""
    capacity = ratecap.bucket_capacity(limit)
    return [
        (i, j)
        for i in range(len(added_ms))
        for j in range(i, len(added_ms))
        if j - i + 1 > limit * (added_ms[j] - added_ms[i] + 1) / 1000 + capacity
    ]


async def stream_ms(redis: Redis) -> list[int]:
    """When each task reached the stream: its entry ID's milliseconds."""
    return [int(entry_id.split(b"-")[0]) for entry_id, _ in await redis.xrange(STREAM)]


async def test_the_first_second_of_a_cap_obeys_the_bound(redis: Redis) -> None:
    """A cap of 2/s set just now (a full bucket of 2), one task a publish as fast as the script answers
    for 1.6 s: every window of w seconds holds at most 2w + 2, the first second included."""
    keys = ExperimentKeys(STREAM, "R3")
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    token = await hold(redis, keys, 20)
    await ratecap.set_stream_rate(redis, STREAM, 2)
    deadline, seq = time.monotonic() + 1.6, 0
    while time.monotonic() < deadline:
        seq += 1
        await publish(redis, keys, token, seq, batch=1)
    added = await stream_ms(redis)
    assert 4 <= len(added) <= 6 and over_bound(added, 2) == [], [a - added[0] for a in added]


async def test_an_idle_bucket_holds_no_more_than_its_capacity(redis: Redis) -> None:
    """Issue 26's survivor: a cap of 40/s whose bucket was emptied, then 3 s idle, then one publish
    that may move 500: it moves the capacity (40), not 3 s of refill (120), and every window of the
    stream holds at most 40w + 40."""
    keys = ExperimentKeys(STREAM, "R4")
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    token = await hold(redis, keys, 300)
    await ratecap.set_stream_rate(redis, STREAM, 40)
    first = await publish(redis, keys, token, 1, batch=500)
    assert first.moved == 40 and first.rate_limited
    await asyncio.sleep(3)
    idle = await ratecap.stream_rate(redis, STREAM)  # reads, writes nothing
    after = await publish(redis, keys, token, 2, batch=500)
    assert after.moved == 40 and after.rate_limited, after
    assert over_bound(await stream_ms(redis), 40) == []
    assert idle is not None and idle.tokens == idle.capacity == 40


async def test_a_corrupt_or_wrong_typed_cap_moves_nothing(redis: Redis) -> None:
    """Each damage fails the publish, nothing moved, and ``stream_rate`` (what ``xmc rate``, ``xmc plan``
    and ``xmc resume`` read) refuses it with the publish's own words: one rule (``lua/rate.lua``)."""
    keys = ExperimentKeys(STREAM, "R2")
    key = "{xmc-tasks-stream}:rate"
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    token = await hold(redis, keys, 10)
    damages = [
        ({"limit": "fast"}, 'XMCCORRUPT {xmc-tasks-stream}:rate field limit holds "fast", not a number'),
        ({"limit": "\u0661\u0660"}, "XMCCORRUPT {xmc-tasks-stream}:rate field limit holds"),  # Arabic-Indic 10
        ({"limit": "10", "tokens": "nan"}, "XMCCORRUPT {xmc-tasks-stream}:rate field tokens holds"),
        ({"limit": "10", "tokens": "-1"}, "XMCCORRUPT {xmc-tasks-stream}:rate field tokens holds"),
        ({"limit": "10", "at": "1e300"}, "XMCCORRUPT {xmc-tasks-stream}:rate field at holds"),
        # Redis turns a line break in an error reply into a blank; the other breaks come escaped
        ({"limit": "1\n2"}, 'XMCCORRUPT {xmc-tasks-stream}:rate field limit holds "1\\ 2", not a number'),
        ({"limit": "1\x0b2\u2028"}, 'XMCCORRUPT {xmc-tasks-stream}:rate field limit holds "1\\x0b2\\u2028"'),
        ({"tokens": "3"}, "XMCCORRUPT {xmc-tasks-stream}:rate has no field limit"),
        ("10", "WRONGTYPE {xmc-tasks-stream}:rate is a string, expected a hash"),
    ]
    for damage, reply in damages:
        await redis.delete(key)
        await (redis.set(key, damage) if isinstance(damage, str) else redis.hset(key, mapping=damage))
        with pytest.raises(ResponseError) as refused:
            await publish(redis, keys, token, 1)
        assert str(refused.value).startswith(reply), (damage, refused.value)
        assert len(str(refused.value).splitlines()) == 1
        with pytest.raises(ratecap.DamagedRateCapError) as read:
            await ratecap.stream_rate(redis, STREAM)
        assert str(read.value) == f"{refused.value}: every publish into {STREAM} fails until it is mended " + (
            f"(xmc rate --stream {STREAM} --clear removes it)"
        )
    assert await redis.xlen(keys.held) == 10 and await redis.xlen(STREAM) == 0
    assert await redis.hget(keys.publish, "seq") is None  # no idempotency record: nothing was written
