"""A taskiq application on the project's task stream, for tests/test_taskiq.py: taskiq-redis's
``RedisStreamBroker`` as it ships, with its defaults (its consumer group ``taskiq``, created at ``$``
when the worker starts). Run by ``taskiq worker tests.support.taskiq_app:broker``; Redis from
``XMC_TASKIQ_REDIS_URL``, the consumer's name from ``XMC_TASKIQ_CONSUMER`` (default: a random one)."""

from __future__ import annotations

import asyncio
import os

from redis.asyncio import Redis
from taskiq_redis import RedisStreamBroker

STREAM = "xmc-tasks-stream"
GROUP = "taskiq"
"""taskiq-redis's default consumer group."""
EXECUTED = "taskiq-test:executed"
"""A list the ``record`` task appends its argument to: what ran, in order."""

URL = os.environ["XMC_TASKIQ_REDIS_URL"]

broker = RedisStreamBroker(URL, queue_name=STREAM, consumer_name=os.environ.get("XMC_TASKIQ_CONSUMER"), xread_block=100)


@broker.task(task_name="record")
async def record(n: int) -> None:
    """Append ``n`` to ``EXECUTED``."""
    async with Redis.from_url(URL) as redis:
        await redis.rpush(EXECUTED, n)


@broker.task(task_name="hang")
async def hang(n: int) -> None:
    """Never finish: the consumer holds the entry it read, unacknowledged."""
    await asyncio.sleep(3_600)
