"""The stand-in task worker (``xmc.consumer``) of the demo, the bench and the tests, on a real redis-server."""

from __future__ import annotations

import asyncio

from tests.support.helpers import GROUP, STREAM
from xmc_resumption.consumer import run_consumer


async def test_a_read_ended_by_its_stream_going_away_is_read_again(redis) -> None:
    """Redis ends a blocked XREADGROUP with ``UNBLOCKED the stream key no longer exists`` when the
    key is deleted (as a Redis Cluster slot migration does on the source node); the consumer reads
    again instead of dying, and gets what arrives in the stream made anew."""
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(run_consumer(redis, STREAM, GROUP, "c1", stop, seen))
    for _ in range(20):  # a few reads blocked on the stream, each ended by its deletion
        await asyncio.sleep(0.02)
        await redis.delete(STREAM)  # ends the blocked read
        await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)  # a read in between gets NOGROUP: read again
    assert await _added_then_read(redis, consumer, stop, seen) == [b"after"]


async def _added_then_read(redis, consumer: asyncio.Task[None], stop: asyncio.Event, seen: list[bytes]) -> list[bytes]:  # type: ignore[no-untyped-def]
    """Add a task ``after``, wait (bounded by the test's timeout) until the consumer read it, stop it: what it read."""
    await redis.xadd(STREAM, {b"task": b"after"})
    while not seen:
        assert not consumer.done(), consumer.exception()
        await asyncio.sleep(0.01)
    stop.set()
    await consumer
    return seen


async def _refused_reads(redis) -> int:  # type: ignore[no-untyped-def]
    """How many XREADGROUP calls Redis has refused (NOGROUP among them), from INFO commandstats."""
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_xreadgroup", {}).get("failed_calls", 0))


async def test_a_read_between_the_streams_deletion_and_its_making_again_is_read_again(redis) -> None:
    """A read that lands after the stream's deletion and before the stream and its group are made
    again gets ``NOGROUP``: the consumer reads again, and gets what arrives once they are back."""
    stop, seen, before = asyncio.Event(), [], await _refused_reads(redis)
    consumer = asyncio.create_task(run_consumer(redis, STREAM, GROUP, "c1", stop, seen))
    while await _refused_reads(redis) < before + 3:  # no stream, no group: each read refused with NOGROUP
        assert not consumer.done(), consumer.exception()
        await asyncio.sleep(0.01)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    assert await _added_then_read(redis, consumer, stop, seen) == [b"after"]


async def test_a_consumer_told_to_stop_while_its_group_is_gone_returns(redis) -> None:
    """``stop`` ends a consumer whose reads are refused (``NOGROUP``), as it ends one reading nothing."""
    stop, seen, before = asyncio.Event(), [], await _refused_reads(redis)
    consumer = asyncio.create_task(run_consumer(redis, STREAM, GROUP, "c1", stop, seen))
    while await _refused_reads(redis) == before:
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(consumer, 10)
    assert seen == []
