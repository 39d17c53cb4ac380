"""The stream-wide rate cap: at most so many held tasks per second into a task stream, over every replay of it.

See ``lua/rate.lua`` and docs/pacing.md.

One key per stream, under its hash tag so it lives in its cluster slot: ``{S}:rate``, a hash with
``limit`` (tasks per second, set by an operator: ``set_stream_rate``), and ``tokens`` and ``at``, the
token bucket's state on Redis's clock, written by the publish script only. The bucket holds at most
``bucket_capacity(limit)`` tasks and refills at ``limit`` per second; a publish moves at most the
whole tokens it holds, in the same step as its move, so every replay of the stream shares it.
No key: no cap. A replay's own cap (``max_tasks_per_second`` of the workflow input) is kept by the
workflow itself (``workflows/ratecap.py``), with the same bucket arithmetic.
"""

from __future__ import annotations

import math

from pydantic import BaseModel
from redis.exceptions import ResponseError

from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.keys import json_reply, validate_name
from xmc_resumption.redisclient.scripts import run_script

MAX_TASKS_PER_SECOND = 1_000_000.0
"""The highest cap accepted (tasks per second; ``XMC_MAX_TASK_RATE`` in ``rate.lua``)."""

MIN_TASKS_PER_SECOND = 0.001
"""The lowest cap accepted (tasks per second: one task in 1,000 s; ``XMC_MIN_TASK_RATE`` in ``rate.lua``)."""

RATE_BURST_SECONDS = 1.0
"""A bucket holds this many seconds of its rate, at least one task (``XMC_RATE_BURST_SECONDS`` in
``rate.lua``): over any window of w seconds at most ``limit * w + bucket_capacity(limit)`` tasks move."""


def rate_key(stream: str) -> str:
    """``{S}:rate``: the stream-wide rate cap of task stream ``stream``."""
    return f"{{{validate_name('stream', stream)}}}:rate"


def validate_rate(limit: float) -> float:
    """Return ``limit`` (tasks per second) when it is a finite number in the allowed range.

    The range is [``MIN_TASKS_PER_SECOND``, ``MAX_TASKS_PER_SECOND``].

    Raises:
        ValueError: any other value (a bool is refused too).
    """
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not math.isfinite(limit):
        raise ValueError(f"a rate cap must be a finite number of tasks per second, got {limit!r}")
    if not MIN_TASKS_PER_SECOND <= limit <= MAX_TASKS_PER_SECOND:
        raise ValueError(
            f"a rate cap must be {MIN_TASKS_PER_SECOND:g}..{MAX_TASKS_PER_SECOND:g} tasks per second, got {limit:g}"
        )
    return float(limit)


def bucket_capacity(limit: float) -> float:
    """The most tasks a bucket of rate ``limit`` (tasks/s) holds: ``max(1, limit * RATE_BURST_SECONDS)``."""
    return max(1.0, limit * RATE_BURST_SECONDS)


class StreamRate(BaseModel):
    """A stream's rate cap as Redis holds it.

    Attributes:
        key: ``{S}:rate``.
        limit: tasks per second.
        capacity: the most tasks its bucket holds.
        tokens: the tasks its bucket would let through now (Redis's clock), at most ``capacity``.
    """

    key: str
    limit: float
    capacity: float
    tokens: float


async def set_stream_rate(client: RedisClient, stream: str, limit: float) -> None:
    """Cap the held tasks all replays of ``stream`` move together at ``limit`` per second.

    It applies from their next publish on. The bucket's state is kept (a lower cap clamps it to its
    capacity).

    Raises:
        ValueError: a bad stream name or limit.
        redis.exceptions.RedisError: on any Redis fault (WRONGTYPE when the key is not a hash).
    """
    await client.hset(rate_key(stream), "limit", repr(validate_rate(limit)))


async def clear_stream_rate(client: RedisClient, stream: str) -> bool:
    """Remove the stream's cap (the key and its bucket); True when there was one."""
    return bool(await client.delete(rate_key(stream)))


class DamagedRateCapError(ValueError):
    """``{S}:rate`` holds what every publish into the stream refuses (``lua/rate.lua``): nothing would move.

    The message is the script's reply (``XMCCORRUPT ...`` or ``WRONGTYPE ...``, naming the key and the
    field) and what to do about it.
    """


async def stream_rate(client: RedisClient, stream: str) -> StreamRate | None:
    """The stream's cap as every publish reads it, None when it has none; writes nothing.

    Read by ``lua/rate_status.lua``, with the publish script's own rule (``lua/rate.lua``), so what it
    accepts a publish accepts. ``xmc plan`` refuses a damaged key as ``xmc resume`` does with this one
    check.

    Raises:
        ValueError: a bad stream name.
        DamagedRateCapError: a field that is no number in its bounds, a hash without ``limit``, or a
            key of another type.
        redis.exceptions.RedisError: any other Redis fault.
    """
    key = rate_key(stream)
    try:
        found = json_reply(await run_script(client, "rate_status", [key], []))
    except ResponseError as err:
        if not str(err).startswith(("XMCCORRUPT", "WRONGTYPE")):
            raise
        raise DamagedRateCapError(
            f"{err}: every publish into {stream} fails until it is mended (xmc rate --stream {stream} --clear "
            "removes it)"
        ) from err
    return StreamRate(key=key, **found) if found else None
