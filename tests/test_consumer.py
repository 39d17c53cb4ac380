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
        await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)  # well within the consumer's pause
    await redis.xadd(STREAM, {b"task": b"after"})
    while not seen:
        assert not consumer.done(), consumer.exception()
        await asyncio.sleep(0.01)
    stop.set()
    await consumer
    assert seen == [b"after"]
