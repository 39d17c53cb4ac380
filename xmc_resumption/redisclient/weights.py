"""Weights and active replayers of a task stream, for the fair share of its threshold (``lua/fair.lua``).

Replays whose input sets ``fair_share`` split the headroom of their shared threshold: one publish
moves at most ``max(1, headroom * w_e / sum of w over the active replayers)``. Two keys per stream,
under its hash tag so they live in its cluster slot:

- ``{S}:weights``: hash, field experiment ID, value its weight (an integer 1..``MAX_WEIGHT``; a
  missing field weighs ``DEFAULT_WEIGHT``), set by an operator (``set_weight``);
- ``{S}:replayers``: sorted set, member experiment ID, score the end of its lease (milliseconds on
  Redis's clock), written by the publish script only.

A corrupt entry touches only its own experiment: a weight that is no integer 1..``MAX_WEIGHT``
fails that experiment's fair publish (``XMCCORRUPT`` naming key and field) and weighs 1 in the
others' shares; a lease end more than ``MAX_LEASE_MS`` ahead counts for nobody and is dropped by the
next fair publish. docs/scale.md has the rules.

The model is Temporal's task-queue fairness keys and weights.
"""

from __future__ import annotations

from typing import cast

from redis.asyncio import Redis

from xmc_resumption.redisclient.fencing import MAX_LEASE_MS
from xmc_resumption.redisclient.keys import as_text, replayers_key, validate_name, weights_key

DEFAULT_WEIGHT = 1
"""The weight of an experiment without a field in ``{S}:weights``."""

MAX_WEIGHT = 1000
"""The largest weight (``XMC_MAX_WEIGHT`` in ``fair.lua``): a ratio of 1,000 between two replays."""


def validate_weight(weight: int) -> int:
    """Return ``weight`` when it is an integer 1..``MAX_WEIGHT``.

    Raises:
        ValueError: any other value (a bool is refused too).
    """
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
        raise ValueError(f"weight must be an integer 1..{MAX_WEIGHT}, got {weight!r}")
    return weight


async def set_weight(client: Redis, stream: str, experiment_id: str, weight: int) -> None:
    """Give ``experiment_id`` the weight ``weight`` among the fair-share replays of ``stream``.

    It applies from its replay's next publish.

    Raises:
        ValueError: a bad name or weight.
        redis.exceptions.RedisError: on any Redis fault (WRONGTYPE when the key is not a hash).
    """
    await client.hset(weights_key(stream), validate_name("experiment_id", experiment_id), validate_weight(weight))


async def clear_weight(client: Redis, stream: str, experiment_id: str) -> None:
    """Give ``experiment_id`` the default weight again (deletes its field)."""
    await client.hdel(weights_key(stream), validate_name("experiment_id", experiment_id))


async def active_replayers(client: Redis, stream: str) -> dict[str, float]:
    """The fair-share replayers of ``stream`` whose lease has not ended, with the end of each lease.

    Lease ends are milliseconds on Redis's clock, counted as ``lua/fair.lua`` counts them: a lease end
    further ahead than the longest lease (``MAX_LEASE_MS``) was never written by a replay and is left
    out.

    Raises:
        redis.exceptions.RedisError: on any Redis fault.
    """
    seconds, micros = await client.time()
    now_ms = seconds * 1000 + micros // 1000
    reply = await client.zrangebyscore(replayers_key(stream), f"({now_ms}", now_ms + MAX_LEASE_MS, withscores=True)
    members = cast(list[tuple[bytes | str, float]], reply)  # WITHSCORES: (member, score) pairs
    return {as_text(member): float(score) for member, score in members}
