"""What a crash failover leaves behind, found and told: tasks Redis holds again after losing their move.

With asynchronous replication, a primary that dies takes with it the writes its replica never
got: a move of held tasks into the task stream, a drained held stream, a claim. The promoted
replica holds those tasks again, though their first delivery may have been read from the old
primary. Redis cannot tell; the caller can: the replay moves held entries oldest first, so the
tasks it was told were moved are the held entries up to the last one moved (``moved_through``, the
publish replies' ``last_moved_id``). A held entry at or below it is a task moved before.

- The publish moves such a task again with the field ``REDELIVERY_FIELD`` appended to its field
  map, value ``<experiment ID> <held entry ID>``, and counts it (``PublishResult.redelivered``):
  a consumer that must not run a task twice looks it up in its own record of done tasks
  (``redelivery_of`` reads the field).
- ``held_again`` counts them for one experiment, ``undone_completions`` for a fleet of completed
  resumptions (a completion Redis undid: the experiment holds its tasks again).

The rule lives in ``lua/redelivery.lua`` (docs/contract.md, "Redelivered tasks").
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from typing import NamedTuple

from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.keys import ExperimentKeys, as_text
from xmc_resumption.redisclient.results import HeldAgain
from xmc_resumption.redisclient.scripts import run_script, source


@cache
def _lua_constant(name: str) -> str:
    """The value of ``local <name> = <value>`` in ``lua/redelivery.lua`` (quotes stripped)."""
    match = re.search(rf"^local {name} = '?([^'\n]+)'?$", source("redelivery"), re.MULTILINE)
    if match is None:  # pragma: no cover - a packaging error
        raise LookupError(f"lua/redelivery.lua defines no {name}")
    return match.group(1)


REDELIVERY_FIELD = _lua_constant("XMC_REDELIVERY_FIELD").encode()
"""The field the publish appends to a task it moves again: ``xmc-redelivery``."""

HELD_AGAIN_CAP = int(_lua_constant("XMC_HELD_AGAIN_CAP"))
"""Held entries ``held_again`` counts at most (a count past it is reported as capped)."""

_ID_PART = r"(0|[1-9][0-9]{0,19})"
_ENTRY_ID = re.compile(rf"{_ID_PART}-{_ID_PART}")
_MAX_ID_PART = 2**64 - 1


def validate_entry_id(what: str, value: str) -> str:
    """``value`` if it is '' or a canonical stream entry ID ``<ms>-<seq>`` (each part at most 2^64 - 1).

    The rule of ``lua/redelivery.lua``'s ``xmc_arg_entry_id``.

    Raises:
        ValueError: naming ``what`` and the value.
    """
    match = _ENTRY_ID.fullmatch(value) if value else None
    if value and (match is None or max(int(match.group(1)), int(match.group(2))) > _MAX_ID_PART):
        raise ValueError(f"{what} must be a stream entry ID <ms>-<seq> or empty, got {value[:48]!r}")
    return value


def later_id(a: str, b: str) -> str:
    """The later of two stream entry IDs ('' counts as none: the other one).

    Raises:
        ValueError: either is not '' or an entry ID (``validate_entry_id``).
    """
    validate_entry_id("an entry ID", a)
    validate_entry_id("an entry ID", b)
    if not a or not b:
        return a or b

    def key(entry_id: str) -> tuple[int, int]:
        ms, seq = entry_id.split("-")
        return int(ms), int(seq)

    return max(a, b, key=key)


class Redelivery(NamedTuple):
    """What a task's ``xmc-redelivery`` field says: the experiment and the task's held entry ID."""

    experiment_id: str
    held_id: str


def redelivery_of(fields: Mapping[bytes, bytes] | Mapping[str, str]) -> Redelivery | None:
    """The redelivery mark of a task read from the task stream, or None for a first delivery.

    ``fields`` is the entry's field map as redis-py returns it (bytes, or text with
    ``decode_responses``). A task marked is one the replay moved before: its first delivery may
    have been read from a primary that died before its replica got the move.
    """
    raw = fields.get(REDELIVERY_FIELD) or fields.get(REDELIVERY_FIELD.decode())  # type: ignore[call-overload]
    if raw is None:
        return None
    experiment_id, _, held_id = as_text(raw).partition(" ")
    return Redelivery(experiment_id, held_id)


async def held_again(client: RedisClient, keys: ExperimentKeys, moved_through: str) -> HeldAgain:
    """Tasks of the experiment held again: held entries at or below ``moved_through``.

    One read-only script (``lua/held_again.lua``).

    Args:
        moved_through: the last held entry ID a resumption of the experiment was told it moved
            (its result's); '' counts none.

    Returns:
        The count (up to ``HELD_AGAIN_CAP``), the held tasks, the state and the fence counter.

    Raises:
        ValueError: ``moved_through`` is no entry ID.
        redis.exceptions.RedisError: on any Redis fault; a ``ResponseError`` starting
            ``XMCCORRUPT`` when the fence counter holds no token.
    """
    validate_entry_id("moved_through", moved_through)
    raw = await run_script(client, "held_again", [keys.held, keys.state, keys.fence], [moved_through])
    return HeldAgain.model_validate({**json.loads(raw), "experiment_id": keys.experiment_id})


async def undone_completions(client: RedisClient, stream: str, completed: Mapping[str, str]) -> list[HeldAgain]:
    """The experiments whose last resumption completed and which Redis shows holding its tasks again.

    A completion Redis undid: a crash failover to a replica that never got the resumption's last
    moves (issue 23). For ``xmc held`` and the worker's metric.

    Args:
        stream: the task stream.
        completed: experiment ID -> the ``moved_through`` of its last completed resumption (its
            result's last held entry ID moved).

    Returns:
        ``held_again`` of each experiment that holds any again, in the order given.

    Raises:
        ValueError: a bad experiment ID or stream name, or an entry ID that is none.
        redis.exceptions.RedisError: on any Redis fault.
    """
    found = []
    for experiment_id, moved_through in completed.items():
        again = await held_again(client, ExperimentKeys(stream, experiment_id), moved_through)
        if again.held_again:
            found.append(again)
    return found
