"""Backlog measurement of a consumer group (DESIGN.md section 4).

backlog = pending (the group's PEL size) + entries after the group's last-delivered-id. Both are
read in one Lua script (``lua/backlog.lua``), so the reading is consistent; the XRANGE behind the
lag is capped at ``threshold - pending + 1`` entries and skipped when pending alone reaches the
threshold. XINFO GROUPS' own ``lag`` field is logged, never used: on Redis 7.0 it is NULL or wrong
after XDEL, XTRIM, XGROUP SETID and for groups created at ``$`` (see tests/cases/backlog.json).
"""

from __future__ import annotations

import json
import logging

from redis.asyncio import Redis

from redisclient.errors import MissingConsumerGroupError
from redisclient.results import BacklogReading, GroupStatus, MissingGroupPolicy
from redisclient.scripts import script

log = logging.getLogger(__name__)


def validate_threshold(threshold: int) -> None:
    """Raise ``ValueError`` unless ``threshold`` (entries) is at least 1."""
    if threshold < 1:
        raise ValueError(f"threshold must be >= 1 entry, got {threshold}")


async def measure_backlog(
    client: Redis,
    stream: str,
    group: str,
    threshold: int,
    missing_group: MissingGroupPolicy = MissingGroupPolicy.ZERO,
) -> BacklogReading:
    """Measure the backlog of consumer group ``group`` on ``stream``.

    Args:
        client: an asyncio Redis client (any ``decode_responses`` setting).
        stream: the task stream's key.
        group: the consumer group's name.
        threshold: the throttle threshold in entries (>= 1); the count stops just past it.
        missing_group: what a missing group means: ``zero`` logs a warning and reports 0;
            ``error`` raises, for a missing stream too (it has no group).

    Returns:
        The reading: exact when ``backlog < threshold``, else ``>= threshold`` with ``capped``.
        A missing stream is a backlog of 0 under the ``zero`` policy.

    Raises:
        ValueError: threshold < 1.
        MissingConsumerGroupError: the group (or the stream) does not exist and the policy is ``error``.
        redis.exceptions.ResponseError: e.g. WRONGTYPE when ``stream`` is not a stream.
        redis.exceptions.ConnectionError, TimeoutError: Redis is unreachable. No error is ever
            turned into a backlog of 0.
    """
    validate_threshold(threshold)
    raw = json.loads(await script(client, "measure")(keys=[stream], args=[group, threshold]))
    # Lua turns a NULL reply into false, and cjson encodes that as JSON false
    raw["xinfo_lag"] = raw["xinfo_lag"] if raw["xinfo_lag"] is not False else None
    reading = BacklogReading.model_validate({**raw, "threshold": threshold})
    if reading.xinfo_lag is not None and not reading.capped and reading.xinfo_lag != reading.lag:
        log.debug(
            "XINFO lag disagrees with the counted lag",
            extra={"stream": stream, "group": group, "xinfo_lag": reading.xinfo_lag, "lag": reading.lag},
        )
    if reading.status is not GroupStatus.OK and missing_group is MissingGroupPolicy.ERROR:
        raise MissingConsumerGroupError(stream, group)
    if reading.status is GroupStatus.NO_GROUP:
        log.warning(
            "consumer group %r does not exist on stream %r: backlog taken as 0",
            group,
            stream,
            extra={"stream": stream, "group": group},
        )
    return reading
