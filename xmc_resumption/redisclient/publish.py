"""The atomic publish: move held tasks into the task stream (docs/contract.md, "The loop", step 4).

One Lua script (``lua/publish.lua``) checks the fencing token, the call's sequence number and the
pause state, measures the backlog with the shared rule, and moves at most
``min(batch, threshold - backlog)`` of the oldest held entries, and about a byte budget of them,
to the task stream (XADD with the field map byte for byte, then XDEL) in one step. Redis runs a
script atomically, so a retried or zombie call can never duplicate, lose or overshoot: a repeated
``seq`` returns the recorded result, an older one moves nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from xmc_resumption.redisclient.backlog import DEFAULT_BYTE_BUDGET, groups_arg, validate_byte_budget, validate_threshold
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.errors import MissingConsumerGroupError
from xmc_resumption.redisclient.fencing import validate_lease
from xmc_resumption.redisclient.keys import ExperimentKeys, replayers_key, weights_key
from xmc_resumption.redisclient.memory import fraction_arg
from xmc_resumption.redisclient.ratecap import rate_key
from xmc_resumption.redisclient.results import MissingGroupPolicy, PublishResult, PublishStatus
from xmc_resumption.redisclient.scripts import run_script


async def publish_batch(
    client: RedisClient,
    keys: ExperimentKeys,
    group: str,
    *,
    token: int,
    seq: int,
    batch_size: int,
    threshold: int,
    owner: str,
    lease_ms: int,
    missing_group: MissingGroupPolicy = MissingGroupPolicy.WAIT,
    max_bytes: int = DEFAULT_BYTE_BUDGET,
    max_memory_fraction: float | None = None,
    fair_share: bool = False,
    groups: Sequence[str] | None = None,
) -> PublishResult:
    """Move up to ``min(batch_size, threshold - backlog)`` held tasks into the task stream, where
    backlog is the largest among the groups measured (``redisclient.backlog``).

    Args:
        client: an asyncio Redis client.
        keys: the experiment's keys; the task stream is ``keys.stream``.
        group: the consumer group that must exist; its backlog bounds the move.
        token: the caller's fencing token.
        seq: the caller's turn number (>= 1), strictly increasing per token: the idempotency key.
        batch_size: the most entries one call moves (>= 1).
        threshold: the backlog bound in entries (>= 1); the move never takes the backlog past it.
        owner: the claim's owner, stored when the claim hash is written.
        lease_ms: the claim's lease, extended by a successful call (milliseconds).
        missing_group: a missing stream or required group moves nothing (``wait``: status
            ``waiting_for_group``), counts the stream's entries as its backlog (``zero``: at most
            the threshold goes in), or refuses (``error``).
        max_bytes: the backlog count and the move each read about this many bytes at most: the
            move stops once the tasks moved reach it (at least one task moves), so a batch of
            large tasks takes several calls instead of blocking Redis (``status`` stays
            ``published``, with headroom left).
        max_memory_fraction: with headroom left, nothing moves while Redis's used memory is at or
            above this fraction of ``maxmemory`` (status ``memory``); None, or no ``maxmemory``
            set, never (0 < f <= 1; ``redisclient.memory``).
        fair_share: move at most this experiment's share of the headroom among the active
            fair-share replayers of the stream, weighted (``redisclient.weights``, ``lua/fair.lua``);
            the result's ``headroom`` is then that share.
        groups: the groups whose backlog bounds the move, ``group`` among them, each required
            to exist; None: every group of the stream (``redisclient.backlog.measure_backlog``).

    The stream-wide rate cap (``{S}:rate``, ``redisclient.ratecap``), when set, bounds the move
    too: at most the whole tokens its bucket holds move (status ``rate_limited`` when none, with
    ``rate_wait_ms``), and what moved is taken from the bucket in the same step.

    Returns:
        What the script did (see ``PublishStatus``); ``completed`` means the held stream is empty
        and the experiment is running again.

    Raises:
        ValueError: a non-positive seq, batch_size, threshold or lease_ms; a byte budget, memory
            fraction or groups list out of bounds.
        MissingConsumerGroupError: a required group (or the stream) is missing and the policy is
            ``error``.
        redis.exceptions.RedisError: on any Redis fault (e.g. WRONGTYPE on the task stream); a
            ``ResponseError`` starting ``XMCEVICTION`` when ``maxmemory-policy`` is not
            ``noeviction`` (nothing moved); one starting ``XMCCORRUPT`` when ``{S}:rate`` holds
            no valid cap (nothing moved).
    """
    if seq < 1:
        raise ValueError(f"seq must be >= 1, got {seq}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 entry, got {batch_size}")
    validate_threshold(threshold)
    validate_lease(lease_ms)
    validate_byte_budget(max_bytes)
    spec = groups_arg(group, groups)
    raw = await run_script(
        client,
        "publish",
        [keys.stream, keys.held, keys.state, keys.fence, keys.claim, keys.publish,
         weights_key(keys.stream), replayers_key(keys.stream), rate_key(keys.stream), keys.replay, keys.released],
        [token, seq, batch_size, threshold, group, missing_group.value, lease_ms, owner, max_bytes,
         fraction_arg(max_memory_fraction), "1" if fair_share else "0", keys.experiment_id, spec],
    )  # fmt: skip
    # the reply is flat (the publish record keeps it so); the reading takes the call's threshold
    result = PublishResult.model_validate({**json.loads(raw), "threshold": threshold})
    if result.status is PublishStatus.NO_GROUP:
        raise MissingConsumerGroupError(keys.stream, result.reading.missing_group or group)
    return result
