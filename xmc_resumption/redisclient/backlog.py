"""Backlog measurement of the consumer groups of a stream (docs/contract.md, "Backlog"; docs/memory.md).

backlog(g) = pending (the group's PEL size) + entries after the group's last-delivered-id, for
every group that bounds the replay (the groups named, else the consumer group and every group with a
consumer); the replay is bounded by the largest. All of it is read in one Lua script
(``lua/backlog.lua``), so the reading is consistent. A lag is known in O(1) from Redis's counters where
they are provably exact (a record in ``{S}:backlog`` says where a group's entries-read was last exact),
else counted by a capped XRANGE that shares one budget of entries per script. XINFO GROUPS' own ``lag``
field is logged, never used: on Redis 7.0 it is NULL or wrong after XDEL, XTRIM, XGROUP SETID and for
groups created at ``$`` (see tests/cases/backlog.json).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.errors import MissingConsumerGroupError
from xmc_resumption.redisclient.keys import as_text, backlog_key, json_reply, validate_name
from xmc_resumption.redisclient.readings import BacklogReading, GroupStatus, MissingGroupPolicy
from xmc_resumption.redisclient.scripts import run_script
from xmc_resumption.redisclient.text import show_name

log = logging.getLogger(__name__)


DEFAULT_BYTE_BUDGET = 4 * 1024 * 1024
"""Bytes of entries one script reads at most, about (4 MiB).

The budget bounds counting the lag and moving held tasks, so that one read stays short (figures: docs/benchmarks.md,
"Backlog cost (figure c)").
"""

MAX_BYTE_BUDGET = 512 * 1024 * 1024
"""The largest byte budget accepted (bytes): Redis's own limit on one string (proto-max-bulk-len)."""


def validate_byte_budget(max_bytes: int) -> None:
    """Raise ``ValueError`` unless ``max_bytes`` is in [1, ``MAX_BYTE_BUDGET``] bytes."""
    if not 1 <= max_bytes <= MAX_BYTE_BUDGET:
        raise ValueError(f"byte budget must be in [1, {MAX_BYTE_BUDGET}] bytes, got {max_bytes}")


MAX_THRESHOLD = 1_000_000
"""The largest threshold the scripts accept (entries; ``lua/backlog.lua``). The workflow input allows at most
100,000. A reading's cost does not grow with it: counts share ``COUNT_ENTRIES``."""

MAX_GROUPS = 64
"""The most consumer groups a replay names (``consumer_groups``; ``lua/backlog.lua``). Without names, every group of
the stream is measured, however many."""

COUNT_ENTRIES = 1_000
"""Entries one script counts at most, over every group (``lua/backlog.lua``'s ``XMC_COUNT_ENTRIES``): a lag that
Redis's counters cannot give exactly is counted within it (docs/memory.md, "How the lag is measured")."""

COUNT_BYTES = 256 * 1024
"""Bytes of entries one script counts at most, over every group (``XMC_COUNT_BYTES``; the byte budget if smaller)."""


def validate_threshold(threshold: int) -> None:
    """Raise ``ValueError`` unless ``threshold`` (entries) is in [1, ``MAX_THRESHOLD``]."""
    if not 1 <= threshold <= MAX_THRESHOLD:
        raise ValueError(f"threshold must be 1..{MAX_THRESHOLD:,} entries, got {threshold}")


def validate_groups(group: str, groups: Sequence[str] | None) -> None:
    """Check the groups argument of a backlog measurement.

    Raise ``ValueError`` unless ``groups`` is None (``group`` and every group with a consumer) or names 1 to
    ``MAX_GROUPS`` distinct groups by ``validate_name``'s rule, ``group`` among them.
    """
    validate_name("consumer_group", group)
    if groups is None:
        return
    for name in groups:
        validate_name("consumer_groups", name)
    if not 1 <= len(groups) <= MAX_GROUPS or len(set(groups)) != len(groups):
        raise ValueError(f"consumer_groups must name 1..{MAX_GROUPS} distinct groups, got {len(groups)}")
    if group not in groups:
        raise ValueError(f"consumer_groups must include consumer_group {group!r} (the group that must exist)")


def groups_arg(group: str, groups: Sequence[str] | None) -> str:
    """The scripts' groups argument.

    ``*`` for ``group`` and every group with a consumer, else the names separated by single spaces (checked by
    ``validate_groups``; a name holds no space).
    """
    validate_groups(group, groups)
    return "*" if groups is None else " ".join(groups)


async def measure_backlog(
    client: RedisClient,
    stream: str,
    group: str,
    threshold: int,
    missing_group: MissingGroupPolicy = MissingGroupPolicy.WAIT,
    max_bytes: int = DEFAULT_BYTE_BUDGET,
    groups: Sequence[str] | None = None,
    records: bool = False,
) -> BacklogReading:
    """Measure the backlog of the consumer groups of ``stream``: the largest bounds the replay.

    Args:
        client: an asyncio Redis client (any ``decode_responses`` setting).
        stream: the task stream's key.
        group: the consumer group that must exist (measured first).
        threshold: the throttle threshold in entries (1..``MAX_THRESHOLD``); each count stops just
            past it, and once one group's backlog reaches it the others' lags are not counted (unless
            known in O(1)).
        missing_group: what a missing stream or required group means (``MissingGroupPolicy``):
            ``wait`` reports it with headroom 0; ``zero`` counts the stream's entries as the
            group's backlog, with a warning; ``error`` raises.
        max_bytes: each count reads about this many bytes of entries at most; a count cut short by
            it (or by ``COUNT_ENTRIES``) below the cap takes the least of XLEN and entries-added -
            entries-read as an upper bound (``lag_source`` ``bound``); one cut at the cap is
            ``bytes_capped``.
        groups: the groups that bound the replay, ``group`` among them, each required to exist;
            None: ``group`` and every group of the stream that has a consumer (a group with none is
            reported in ``unattended``).
        records: read and write the groups' records (``{S}:backlog``), so that a lag Redis's
            counters give exactly costs O(1); False (the default): the reading writes nothing (what
            ``xmc status`` and ``xmc plan`` need) and counts instead.

    Returns:
        The reading of the limiting group (the largest backlog): exact when ``backlog <
        threshold`` and ``exact``; else never below the true backlog: ``>= threshold`` with
        ``capped``, or Redis's upper bound (``lag_source`` ``bound``).
        With ``records``, the call writes the groups' records where their entries-read is exact.

    Raises:
        ValueError: a threshold, byte budget or groups list out of bounds.
        MissingConsumerGroupError: a required group (or the stream) does not exist and the policy
            is ``error``.
        redis.exceptions.ResponseError: e.g. WRONGTYPE when ``stream`` or ``{S}:backlog`` holds
            another type.
        redis.exceptions.ConnectionError, TimeoutError: Redis is unreachable. No error is ever
            turned into a backlog of 0.
    """
    validate_threshold(threshold)
    validate_byte_budget(max_bytes)
    spec = groups_arg(group, groups)
    keys = [stream, backlog_key(stream)] if records else [stream]
    return await _measure(client, keys, [group, threshold, max_bytes, missing_group.value, spec], missing_group)


async def measure_group(
    client: RedisClient, stream: str, name: str | bytes, threshold: int, max_bytes: int = DEFAULT_BYTE_BUDGET
) -> BacklogReading:
    """Measure one consumer group found on ``stream`` alone, by the replay's rule (``measure_backlog``).

    Args:
        name: the group's name as ``XINFO GROUPS`` gave it: any name Redis accepts (bytes, as they are,
            for a name that is not UTF-8), not held to ``validate_name``'s rule.
        threshold, max_bytes: as ``measure_backlog``.

    Returns:
        Its reading; ``status`` ``no_group`` (or ``no_stream``) once it is gone, headroom 0.

    Raises:
        ValueError, redis.exceptions.ResponseError: as ``measure_backlog``.
    """
    validate_threshold(threshold)
    validate_byte_budget(max_bytes)
    policy = MissingGroupPolicy.WAIT
    return await _measure(client, [stream], [name, threshold, max_bytes, policy.value, ""], policy)


async def _measure(
    client: RedisClient, keys: list[str], args: list[str | bytes | int], missing_group: MissingGroupPolicy
) -> BacklogReading:
    """Run the measure script on ``keys`` (its KEYS) with checked ``args`` (its ARGV) and read its reading."""
    stream, group = keys[0], as_text(args[0]) if isinstance(args[0], bytes) else str(args[0])
    threshold = int(args[1])
    raw = json_reply(await run_script(client, "measure", keys, args))
    # Lua turns a NULL reply into false, and cjson encodes that as JSON false
    raw["xinfo_lag"] = raw["xinfo_lag"] if raw["xinfo_lag"] is not False else None
    reading = BacklogReading.model_validate({**raw, "threshold": threshold})
    if reading.xinfo_lag is not None and not reading.capped and reading.xinfo_lag != reading.lag:
        log.debug(
            "XINFO lag disagrees with the counted lag",
            extra={
                "stream": stream,
                "group": show_name(reading.limiting_group),
                "xinfo_lag": reading.xinfo_lag,
                "lag": reading.lag,
            },
        )
    if reading.status is not GroupStatus.OK and missing_group is MissingGroupPolicy.ERROR:
        raise MissingConsumerGroupError(stream, reading.missing_group or group)
    if reading.status is not GroupStatus.OK and missing_group is MissingGroupPolicy.ZERO:
        log.warning(
            "consumer group %r does not exist on stream %r: its backlog is the stream's %s%s entries",
            reading.missing_group,
            stream,
            reading.lag,
            "+" if reading.capped else "",
            extra={"stream": stream, "group": reading.missing_group},
        )
    return reading
