"""Who holds a group's pending entries: the consumers idle while holding them (docs/memory.md).

A consumer that read entries and died (or hangs) keeps them in its group's PEL, so they stay in the
backlog until it acknowledges them or another consumer claims them (``XCLAIM``/``XAUTOCLAIM``; some
libraries claim only after a read that returned entries, so a stalled replay never gets them
back). ``XINFO CONSUMERS`` names each consumer with its pending count and its idle time, the
milliseconds since it last read or claimed. It lists every consumer of a group (O(consumers)), so
it is read only when needed: when a replay is stalled, and by ``xmc status``.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.exceptions import ResponseError

from xmc_resumption.redisclient.backlog import MAX_GROUPS
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.keys import as_text, validate_name
from xmc_resumption.redisclient.readings import IdleConsumer

MAX_IDLE_LISTED = 100
"""The most idle consumers one call returns."""

MAX_IDLE_MS = 2**53
"""The largest idle window accepted (milliseconds)."""


async def idle_consumers(
    client: RedisClient, stream: str, groups: Sequence[str], min_idle_ms: int, limit: int = 10
) -> list[IdleConsumer]:
    """The consumers of ``groups`` on ``stream`` holding pending entries and idle for at least ``min_idle_ms``.

    The most pending first (then the longest idle), at most ``limit``.

    The groups are names found in Redis (a backlog reading's groups, its limiting group): any name
    Redis accepts, as ``keys.as_text`` gives it, found again in ``XINFO GROUPS`` (so a name that is not
    UTF-8 reaches its group). A group (or the stream) that does not exist holds nothing: it is
    skipped.

    Args:
        client: an asyncio Redis client (any ``decode_responses`` setting).
        stream: the task stream's key (``validate_name``'s rule).
        groups: the consumer groups to read (1..``MAX_GROUPS`` names).
        min_idle_ms: the idle window (milliseconds, 0..2**53).
        limit: the most consumers returned (1..``MAX_IDLE_LISTED``).

    Raises:
        ValueError: an argument out of its bounds.
        redis.exceptions.RedisError: any Redis fault but a missing group or stream (e.g. WRONGTYPE,
            or NOPERM for an ACL user without ``xinfo|groups`` or ``xinfo|consumers``).
    """
    validate_name("stream", stream)
    if not 1 <= len(groups) <= MAX_GROUPS:
        raise ValueError(f"groups must name 1..{MAX_GROUPS} consumer groups, got {len(groups)}")
    if not 0 <= min_idle_ms <= MAX_IDLE_MS:
        raise ValueError(f"min_idle_ms must be 0..2**53 milliseconds, got {min_idle_ms}")
    if not 1 <= limit <= MAX_IDLE_LISTED:
        raise ValueError(f"limit must be 1..{MAX_IDLE_LISTED}, got {limit}")
    try:
        named = {as_text(g["name"]): g["name"] for g in await client.xinfo_groups(stream)}
    except ResponseError as err:
        if _gone(err):
            return []  # no stream: nothing to hold
        raise
    found: list[IdleConsumer] = []
    for group in dict.fromkeys(groups):
        if group not in named:
            continue
        try:
            consumers = await client.xinfo_consumers(stream, named[group])
        except ResponseError as err:
            if _gone(err):
                continue  # nothing to hold: the group went away meanwhile
            raise
        for c in consumers:
            pending, idle = int(c["pending"]), int(c["idle"])
            if pending > 0 and idle >= min_idle_ms:
                found.append(IdleConsumer(group=group, consumer=as_text(c["name"]), pending=pending, idle_ms=idle))
    found.sort(key=lambda c: (-c.pending, -c.idle_ms, c.group, c.consumer))
    return found[:limit]


def _gone(err: ResponseError) -> bool:
    """True for the reply of an ``XINFO`` on a stream or group that does not exist."""
    return str(err).startswith(("NOGROUP", "no such key", "ERR no such key"))


def describe_idle(consumers: Sequence[IdleConsumer]) -> str:
    """One phrase naming ``consumers`` (``IdleConsumer.describe``, separated by ``; ``), '' for none."""
    return "; ".join(c.describe() for c in consumers)
