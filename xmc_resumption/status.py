"""An experiment as Redis holds it, read for operators: its status, the experiments held, the eviction check.

``xmc status``, ``xmc held`` and ``xmc resume``'s checks before anything starts (through
``xmc_resumption.client.XmcClient``); ``plan`` reads the state and held tasks here too. Reads only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TypeVar

from redis.exceptions import ResponseError

from xmc_resumption.errors import KeyContentError, OperatorError
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.acl import acl_user, denial_message
from xmc_resumption.redisclient.backlog import measure_backlog
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.consumers import idle_consumers
from xmc_resumption.redisclient.keys import ExperimentKeys, as_text, validate_name
from xmc_resumption.redisclient.memory import read_memory
from xmc_resumption.redisclient.readings import GroupStatus
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.redisclient.text import one_line

T = TypeVar("T")

MAX_SHOWN_VALUE_CHARS = 40
"""Longest part of a garbage key's value an error message quotes."""


async def _read_key(redis: RedisClient, key: str, expected: str, read: Awaitable[T], *, parses: bool = False) -> T:
    """Await ``read`` of ``key``, turning content the contract does not allow into ``KeyContentError``.

    A key of the wrong type (WRONGTYPE), or for a read that ``parses`` the value a ``ValueError``,
    becomes ``KeyContentError`` naming the key, what it holds and what the contract expects
    (``expected``).
    """
    try:
        return await read
    except ResponseError as err:
        if not str(err).startswith("WRONGTYPE"):
            raise
        kind = as_text(await redis.type(key))
        raise KeyContentError(f"key {key} is a {kind}, expected {expected}") from err
    except ValueError as err:
        if not parses:
            raise
        raw = as_text(await redis.get(key) or b"")
        shown = repr(raw[:MAX_SHOWN_VALUE_CHARS]) + ("..." if len(raw) > MAX_SHOWN_VALUE_CHARS else "")
        raise KeyContentError(f"key {key} holds {shown}, expected {expected}") from err


async def state_and_held(redis: RedisClient, keys: ExperimentKeys) -> tuple[ExperimentState, int]:
    """The experiment's state and its held tasks (entries).

    A state value the contract does not know is ``unknown``, not an error: producers hold their
    tasks behind it and the next claim normalizes it (``lua/tokens.lua``).

    Raises:
        KeyContentError: the state or held key holds the wrong type.
    """
    state = await _read_key(
        redis, keys.state, "a string: paused, resuming (absent: running)", held.get_state(redis, keys)
    )
    return state, await _read_key(redis, keys.held, "a stream (the held tasks)", held.held_count(redis, keys))


async def has_keys(redis: RedisClient, keys: ExperimentKeys) -> bool:
    """True when any key of the experiment exists; False for an experiment never paused nor resumed on this stream.

    The keys: state, held, claim, fence, publish record, acquire log, replay record, release log, dead
    letters.
    """
    every = (
        keys.state, keys.held, keys.claim, keys.fence, keys.publish, keys.acquire_log, keys.replay, keys.released,
        keys.dead,
    )  # fmt: skip
    return bool(await redis.exists(*every))


DEFAULT_IDLE_SECONDS = 60.0
"""``xmc status`` names the consumers that hold pending entries while idle for this long (seconds)."""


async def experiment_status(
    redis: RedisClient,
    keys: ExperimentKeys,
    group: str,
    threshold: int,
    groups: Sequence[str] | None = None,
    idle_seconds: float = DEFAULT_IDLE_SECONDS,
) -> dict[str, object]:
    """The status of an experiment as a dict.

    State, held tasks (entries), claim, last fencing token, the consumer groups' backlog and the idle
    consumers holding pending entries.

    ``backlog`` is the reading of the groups that bound a replay (``groups``, or ``group`` and every group
    with a consumer when None; ``group`` must exist): the largest backlog, the group that has it
    (``limiting_group``), the first missing group (``missing_group``) and ``groups``, each group's
    part. ``idle_consumers`` lists the consumers of those groups holding pending entries while idle
    for at least ``idle_seconds`` (``XINFO CONSUMERS``; ``redisclient.consumers``), the most
    pending first.

    An experiment with no key at all on this stream has state ``unknown`` and ``exists`` False:
    it was never paused nor resumed here (a typo, or another ``--stream``), which an absent state
    key alone (``running``) cannot tell.

    ``orphaned`` is True for an experiment that is resuming with no live claim: its replayer is
    gone (a failed or terminated run whose lease lapsed) and producers are still holding its tasks;
    starting a resumption again continues the replay in order. ``redis_memory`` is Redis's
    ``maxmemory-policy``, used memory and ``maxmemory`` (bytes, 0: no limit) and ``problem``, why a
    resumption would refuse this Redis (None under ``noeviction``; ``redisclient.memory``).

    Each part is read on its own: a part that cannot be read (a key of the wrong type or holding
    garbage, a command the ACL user may not run) is None, and ``unknown`` maps its name to the
    one-line reason; the other parts are still shown. (``state`` stands for the state and the held
    tasks, ``orphaned`` is None when the state or the claim is unknown.)

    Raises:
        redis.exceptions.RedisError: a fault that is not one part's (Redis unreachable, a timeout).
    """
    unknown: dict[str, str] = {}

    async def part(name: str, read: Awaitable[T]) -> T | None:
        try:
            return await read
        except KeyContentError as err:
            unknown[name] = str(err)
        except ResponseError as err:
            # only this part's: a refused command or key, a key of the wrong type, a script's
            # refusal of what a key holds (XMC...); any other reply (no such database, OOM,
            # LOADING) is the whole Redis's and fails the command
            denied = denial_message(err, acl_user(redis), f"reading {name}")
            if denied is None and not str(err).startswith(("WRONGTYPE", "XMC")):
                raise
            unknown[name] = denied or one_line(str(err))
        return None

    reading = await part(
        "backlog",
        _read_key(
            redis,
            keys.stream,
            "a stream (the task stream)",
            measure_backlog(redis, keys.stream, group, threshold, groups=groups),
        ),
    )
    present = [g.name for g in reading.groups if not g.missing] if reading is not None else []
    idle_ms = round(idle_seconds * 1000)
    idle = await part("idle_consumers", idle_consumers(redis, keys.stream, present, idle_ms)) if present else []
    state_held = await part("state", state_and_held(redis, keys))
    claim = await part("claim", _read_key(redis, keys.claim, "a hash (token, owner)", fencing.claim_info(redis, keys)))
    fence = await part(
        "fence",
        _read_key(redis, keys.fence, "an integer (the fencing token)", fencing.current_token(redis, keys), parses=True),
    )
    exists = await part("exists", has_keys(redis, keys))
    set_aside = await part(
        "set_aside", _read_key(redis, keys.dead, "a stream (the set-aside tasks)", redis.xlen(keys.dead))
    )
    memory = await part("redis_memory", read_memory(redis, keys.stream))
    state, held_tasks = state_held if state_held is not None else (None, None)
    doc: dict[str, object] = {
        "experiment_id": keys.experiment_id,
        "stream": keys.stream,
        "exists": exists,
        "state": state.value if state is not None and exists is not False else ExperimentState.UNKNOWN.value,
        "orphaned": None if state is None or claim is None else state is ExperimentState.RESUMING and not claim,
        "held": held_tasks,
        "claim": claim,
        "fence": fence,
        "set_aside": set_aside,
        "backlog": None
        if reading is None
        else {
            "group": group,
            "limiting_group": reading.limiting_group,
            "pending": reading.pending,
            "lag": reading.lag,
            "capped": reading.capped,
            "status": reading.status.value,
            "missing_group": reading.missing_group if reading.status is not GroupStatus.OK else None,
            "threshold": threshold,
            "groups": [g.model_dump() for g in reading.groups],
        },
        "idle_consumers": [c.model_dump() for c in idle] if idle is not None else None,
        "redis_memory": memory.model_dump() if memory is not None else None,
    }
    if unknown:
        doc["unknown"] = unknown
    return doc


async def refuse_evicting_redis(redis: RedisClient, keys: ExperimentKeys) -> None:
    """Refuse, before anything starts, a Redis whose ``maxmemory-policy`` could evict the replay's keys.

    Such a resumption would fail at its claim (``redisclient.memory``).

    Raises:
        OperatorError: the policy is not ``noeviction``; the message names it.
    """
    memory = await read_memory(redis, keys.stream)
    if memory.problem:
        raise OperatorError(memory.problem)


SCAN_COUNT = 1_000
"""``SCAN ... COUNT`` hint: keys Redis looks at per call (bounded work per round trip)."""

MAX_LISTED = 100_000
"""The most experiments or runs one listing returns."""


async def held_experiments(redis: RedisClient, stream: str, limit: int) -> tuple[list[dict[str, object]], bool]:
    """Every experiment on ``stream`` that Redis holds something for, sorted by experiment ID.

    An experiment counts when it has a state key (paused, resuming, or a value the contract does not
    know) or held tasks, found by ``SCAN MATCH`` on ``{S}:experiment:*:state`` and
    ``{S}:experiment:*:held`` (never ``KEYS``: it blocks Redis).

    Each row: ``experiment_id``, ``state``, ``held`` (entries), ``claim`` (owner, token, lease
    left; {} when none) and ``condition``: ``paused``; ``orphaned`` (resuming with no live claim:
    its replayer is gone, producers still hold; start a resumption again); ``resuming`` (a live
    claim: a replay runs); ``unknown`` (a state value the contract does not know); ``stranded``
    (no state key, so producers no longer hold, but tasks are held: a resume replays them); or
    ``bad_keys`` with ``error`` naming a key of the wrong type. Sorted by experiment ID.

    Args:
        stream: the task stream ``S``; checked by ``validate_name``, whose characters hold no glob
            character, so the pattern matches this stream's keys only.
        limit: the most experiments returned (1..``MAX_LISTED``).

    Returns:
        (rows, truncated): truncated is True when more experiments than ``limit`` were found.

    Raises:
        ValueError: a bad stream name or limit.
    """
    validate_name("stream", stream)
    if not 1 <= limit <= MAX_LISTED:
        raise ValueError(f"limit must be 1..{MAX_LISTED}, got {limit}")
    prefix = f"{{{stream}}}:experiment:"
    found: set[str] = set()
    for suffix in (":state", ":held"):
        async for raw in redis.scan_iter(match=f"{prefix}*{suffix}", count=SCAN_COUNT):
            experiment_id = as_text(raw)[len(prefix) : -len(suffix)]
            try:
                found.add(validate_name("experiment_id", experiment_id))
            except ValueError:
                continue  # not a key this project wrote
    ids = sorted(found)
    rows = [await _held_row(redis, ExperimentKeys(stream, e)) for e in ids[:limit]]
    return [row for row in rows if row["condition"] is not None], len(ids) > limit


async def _held_row(redis: RedisClient, keys: ExperimentKeys) -> dict[str, object]:
    """One row of ``held_experiments``; ``condition`` None for a running experiment holding nothing."""
    row: dict[str, object] = {"experiment_id": keys.experiment_id}
    try:
        state, held_tasks = await state_and_held(redis, keys)
        claim = await _read_key(redis, keys.claim, "a hash (token, owner)", fencing.claim_info(redis, keys))
    except KeyContentError as err:
        return {**row, "state": None, "held": None, "claim": {}, "condition": "bad_keys", "error": str(err)}
    condition: str | None
    if state is ExperimentState.RESUMING:
        condition = "resuming" if claim else "orphaned"
    elif state is ExperimentState.RUNNING:
        condition = "stranded" if held_tasks else None
    else:
        condition = state.value  # paused, unknown
    return {**row, "state": state.value, "held": held_tasks, "claim": claim, "condition": condition}
