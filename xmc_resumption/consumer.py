"""A task worker stand-in for the demo and the tests: reads a consumer group and acknowledges."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.exceptions import ResponseError

from xmc_resumption.redisclient.connection import RedisClient

UNBLOCKED_PAUSE_SECONDS = 0.05
"""How long a consumer whose blocked read Redis ended (``UNBLOCKED``) waits before reading again
(seconds): long enough for a slot migration's last step or a re-created stream."""


def entries_of(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """Flatten an ``XREADGROUP`` reply (bytes client) into ``[(entry ID, field map), ...]``."""
    return [(entry_id, fields) for _, batch in reply or [] for entry_id, fields in batch]


async def run_consumer(
    redis: RedisClient,
    stream: str,
    group: str,
    name: str,
    stop: asyncio.Event,
    out: list[bytes],
    *,
    count: int = 10,
    rate: float | None = None,
    field: bytes = b"task",
) -> None:
    """Consume ``stream`` as ``name`` in ``group``, appending each entry's ``field`` to ``out``.

    ``XREADGROUP`` up to ``count`` entries, append each entry's ``field`` to ``out``, ``XACK`` them; at
    most ``rate`` entries per second (None: as fast as Redis answers). Returns once ``stop`` is set and a
    read comes back empty. A blocked read that Redis ends because its stream key went away
    (``UNBLOCKED``) is read again.

    Raises:
        redis.exceptions.RedisError: any other Redis fault.
    """
    while True:
        started = time.monotonic()
        try:
            entries = entries_of(await redis.xreadgroup(group, name, {stream: ">"}, count=count, block=50))
        except ResponseError as err:
            # Redis ends a blocked read when its stream key goes away under it: "UNBLOCKED the
            # stream key no longer exists" (a Redis Cluster slot migrated, the key deleted and
            # made again); a moment later the next read finds the stream wherever it lives now
            if not str(err).startswith("UNBLOCKED"):
                raise
            await asyncio.sleep(UNBLOCKED_PAUSE_SECONDS)
            continue
        if entries:
            out += [fields[field] for _, fields in entries]
            await redis.xack(stream, group, *[entry_id for entry_id, _ in entries])
            if rate:
                await asyncio.sleep(max(0.0, len(entries) / rate - (time.monotonic() - started)))
        elif stop.is_set():
            return
