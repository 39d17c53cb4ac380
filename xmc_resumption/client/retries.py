"""What the clients send again after a Redis fault, how often and how long apart: one policy for both clients.

Only a call that may run twice is repeated (``xmc_resumption.client``'s docstring, "Retries").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from xmc_resumption.redisclient.errors import ReplicaAckError

T = TypeVar("T")

RETRIES = 3
"""How often a client sends a call that is safe to repeat again after a connection error or a timeout."""

RETRY_SECONDS = 0.1
"""The first wait before such a retry (seconds); it doubles with each try (0.1, 0.2, 0.4)."""

RETRYABLE = (RedisConnectionError, RedisTimeoutError, ReplicaAckError)
"""Redis faults after which a call may or may not have run, or ran but is not on enough replicas yet
(``XMC_REPLICA_ACKS``)."""


def retry_backoff(attempt: int) -> float:
    """The wait before retry ``attempt`` (0-based; seconds): ``RETRY_SECONDS`` doubled each time."""
    return float(RETRY_SECONDS * 2**attempt)


async def repeat(retries: int, call: Callable[..., Awaitable[T]], *args: Any, safe: bool = True) -> T:
    """``call(*args)``, sent again up to ``retries`` times after a ``RETRYABLE`` fault when ``safe``.

    It may have run: only what may run twice is repeated.
    """
    for attempt in range(retries + 1):
        try:
            return await call(*args)
        except RETRYABLE:
            if not safe or attempt == retries:
                raise
            await asyncio.sleep(retry_backoff(attempt))
    raise AssertionError("unreachable")


def repeat_sync(retries: int, call: Callable[..., T], *args: Any, safe: bool = True) -> T:
    """``repeat``, blocking."""
    for attempt in range(retries + 1):
        try:
            return call(*args)
        except RETRYABLE:
            if not safe or attempt == retries:
                raise
            time.sleep(retry_backoff(attempt))
    raise AssertionError("unreachable")
