"""A task worker stand-in for the demo and the tests: reads a consumer group and acknowledges."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.exceptions import ResponseError

from xmc_resumption.redisclient.connection import RedisClient

UNBLOCKED_PAUSE_SECONDS = 0.05
"""How long a consumer whose read Redis refused for a stream gone away (``UNBLOCKED``, ``NOGROUP``) waits before
reading again (seconds): long enough for a slot migration's last step or a re-created stream."""

GONE_REPLIES = ("UNBLOCKED", "NOGROUP")
"""The starts of Redis's replies to an ``XREADGROUP`` whose stream or group is gone: a blocked read ended by the key's
deletion (``UNBLOCKED the stream key no longer exists``), and a read that lands after the deletion, before the stream
and its group are made again (``NOGROUP No such key ... or consumer group ...``)."""


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
    read comes back empty or refused. A read that Redis refuses because the stream or the group is gone
    (``GONE_REPLIES``: deleted, or not made again yet) is read again after ``UNBLOCKED_PAUSE_SECONDS``.

    Raises:
        redis.exceptions.RedisError: any other Redis fault.
    """
    while True:
        started = time.monotonic()
        try:
            entries = entries_of(await redis.xreadgroup(group, name, {stream: ">"}, count=count, block=50))
        except ResponseError as err:
            # the stream went away (a Redis Cluster slot migrated, the key deleted and made again): a
            # moment later the next read finds the stream and its group wherever they live now
            if not str(err).startswith(GONE_REPLIES):
                raise
            if stop.is_set():
                return
            await asyncio.sleep(UNBLOCKED_PAUSE_SECONDS)
            continue
        if entries:
            out += [fields[field] for _, fields in entries]
            await redis.xack(stream, group, *[entry_id for entry_id, _ in entries])
            if rate:
                await asyncio.sleep(max(0.0, len(entries) / rate - (time.monotonic() - started)))
        elif stop.is_set():
            return
