"""The worker's Redis client reconnects once when Redis closed its idle connection (``Settings.worker_redis``)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from xmc_resumption.settings import Settings


async def _kill_clients(admin: Redis) -> None:
    """End every other client connection, as Redis's ``timeout`` or a proxy does to an idle one."""
    await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


async def test_a_connection_redis_closed_is_made_again_once(redis: Redis, redis_url: str) -> None:
    """A worker that reaches Redis must not read a closed idle connection as a partition (it would hand its
    replays on for a minute); a client that sends nothing again does."""
    worker = Settings(redis_url=redis_url).worker_redis()
    plain = Settings(redis_url=redis_url).redis(retries=0)
    try:
        assert await worker.ping() and await plain.ping()
        await _kill_clients(redis)
        assert await worker.ping()
        with pytest.raises(RedisConnectionError):
            await plain.ping()
    finally:
        await worker.aclose()
        await plain.aclose()
