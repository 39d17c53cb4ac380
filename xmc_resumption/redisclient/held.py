"""Experiment pause state and the pause-aware enqueue of tasks (the producers' contract: docs/producers.md).

State machine: running --pause--> paused --resume--> resuming --(held stream drained)--> running;
pause is allowed from resuming too. Producers enqueue through the enqueue script
(``lua/enqueue.lua``): running goes to the task stream, anything else to the experiment's held
stream, so a task never overtakes a held one. The move ``paused`` -> ``resuming`` is taken by
``fencing.acquire_claim``; the move back to running by the publish script when the held stream is
drained.

The script's arguments are built and its reply read here, by pure functions (``enqueue_calls``,
``enqueue_args``, ``parse_enqueue_reply``) that the asyncio and the blocking clients
(``xmc_resumption.client``) share.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, Literal, NamedTuple

from redis.exceptions import RedisError

from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.deadletter import MAX_TASK_FIELDS
from xmc_resumption.redisclient.keys import ExperimentKeys, as_text
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.redisclient.scripts import run_script, source

FieldValue = str | bytes | int | float
"""A task's value: stored byte for byte (text as UTF-8); an int or float is stored as its text."""

Task = Mapping[Any, FieldValue]
"""A task: a stream entry's field map, field names ``str`` or ``bytes`` (checked when the call is
built: ``TypeError``), e.g. a ``dict[str, str]``. The key type is ``Any`` because a ``Mapping``'s
key type is invariant: under ``Mapping[str | bytes, ...]`` a type checker refuses a
``dict[str, str]`` built elsewhere, and under a union of mappings it cannot type a literal."""

IdempotencyKey = str | bytes | None
"""A task's idempotency key: None (or empty) for none; text is sent as UTF-8."""


@cache
def _script_constant(name: str) -> int:
    """The value of ``local <name> = <expression>`` in ``lua/enqueue.lua``.

    So the limits below are the script's own (written once, there).
    """
    match = re.search(rf"^local {name} = ([0-9 *]+)", source("enqueue"), re.MULTILINE)
    if match is None:
        raise LookupError(f"lua/enqueue.lua defines no {name}")
    value = 1
    for factor in match.group(1).split("*"):
        value *= int(factor)
    return value


MAX_ENQUEUE_TASKS = _script_constant("XMC_MAX_TASKS")
"""The most tasks one enqueue call carries (one script call, one round trip)."""

MAX_IDEMPOTENCY_KEY_BYTES = _script_constant("XMC_MAX_KEY_BYTES")
"""The longest idempotency key, in bytes."""

MAX_ENQUEUE_BYTES = _script_constant("XMC_MAX_BYTES")
"""The most bytes one enqueue call's arguments hold in all (field names and values, keys, counts)."""

MAX_REQUEST_ID_BYTES = _script_constant("XMC_MAX_REQUEST_BYTES")
"""The longest request ID the script takes, in bytes."""

REQUEST_ID_BYTES = 64
"""The longest request ID a caller gives (bytes of its UTF-8): the clients append ``/<chunk>``."""

_HEADER_BYTES = len(str(MAX_ENQUEUE_TASKS)) + MAX_REQUEST_ID_BYTES
"""What a call's arguments hold besides its tasks at most: the task count and the request ID."""

IDEMPOTENCY_RECORD_KEYS = _script_constant("XMC_RECORD_KEYS")
"""Keys one generation of an experiment's idempotency record holds; a key is remembered until this
many later keys of the experiment were written (or the TTL ran out)."""

IDEMPOTENCY_TTL_MS = _script_constant("XMC_RECORD_TTL_MS")
"""How long (milliseconds) a key is remembered after it was written, at most the record count allows."""

if _script_constant("XMC_MAX_FIELDS") != MAX_TASK_FIELDS:  # pragma: no cover - a packaging error
    raise RuntimeError("lua/enqueue.lua's XMC_MAX_FIELDS differs from deadletter.MAX_TASK_FIELDS")


class Enqueued(NamedTuple):
    """What one task's enqueue did.

    Attributes:
        destination: ``"stream"`` (the experiment was running: the task went to the task stream) or
            ``"held"`` (held behind the experiment's pause or its held tasks).
        entry_id: the entry's ID in that stream (``<ms>-<seq>``). For a duplicate, the ID the task
            got when it was first enqueued (a held task has a new ID in the task stream once replayed).
        duplicate: True when another call had added a task of this idempotency key (or an earlier
            task of this call had the same key): nothing was added. False when this call added it,
            also when a resend of the call after a lost reply found it added by the first send
            (the same request ID).
    """

    destination: Literal["stream", "held"]
    entry_id: str
    duplicate: bool


def _as_bytes(value: str | bytes | int | float) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bool):
        raise TypeError("a task's field or value cannot be a bool (True would be stored as 'True')")
    return str(value).encode()


def _task_args(i: int, task: Task, key: IdempotencyKey) -> list[bytes]:
    """Task ``i``'s part of the ARGV: its key ('' for none), its field count, its field/value pairs."""
    if not task:
        raise ValueError(f"task {i}: a task needs at least one field")
    if len(task) > MAX_TASK_FIELDS:
        raise ValueError(
            f"task {i}: a task of {len(task)} fields has more than {MAX_TASK_FIELDS}: the scripts pass a "
            "task's fields through Lua's unpack, which stops near 8,000 values"
        )
    raw_key = _as_bytes(key) if key is not None else b""
    if len(raw_key) > MAX_IDEMPOTENCY_KEY_BYTES:
        raise ValueError(
            f"task {i}: an idempotency key has at most {MAX_IDEMPOTENCY_KEY_BYTES} bytes, got {len(raw_key)}"
        )
    args = [raw_key, str(len(task)).encode()]
    for field, value in task.items():
        if not isinstance(field, str | bytes):
            raise TypeError(f"task {i}: a field name is str or bytes, got {type(field).__name__} {field!r:.40}")
        args += [_as_bytes(field), _as_bytes(value)]
    return args


def _keys_for(tasks: Sequence[Task], idempotency_keys: Sequence[IdempotencyKey] | None) -> list[IdempotencyKey]:
    keys: list[IdempotencyKey] = list(idempotency_keys) if idempotency_keys is not None else [None] * len(tasks)
    if len(keys) != len(tasks):
        raise ValueError(f"{len(keys)} idempotency keys for {len(tasks)} tasks: give one (or None) per task")
    return keys


def enqueue_args(
    tasks: Sequence[Task], idempotency_keys: Sequence[IdempotencyKey] | None = None, request_id: bytes = b""
) -> list[bytes]:
    """The enqueue script's ARGV for one call of ``tasks`` (docs/producers.md).

    The count, the request ID, then per task its idempotency key ('' for none), its field count and
    its field/value pairs.

    Args:
        tasks: 1..``MAX_ENQUEUE_TASKS`` field maps of 1..``MAX_TASK_FIELDS`` fields each.
        idempotency_keys: None, or one key (or None) per task, each at most
            ``MAX_IDEMPOTENCY_KEY_BYTES`` bytes.
        request_id: the call's request ID, at most ``MAX_REQUEST_ID_BYTES`` bytes (b'': none).

    Raises:
        ValueError: no task or too many, an empty task or one of too many fields, a key list of
            another length than the tasks, a key or request ID too long, or more than
            ``MAX_ENQUEUE_BYTES`` in all.
        TypeError: a field or value that is no str, bytes, int or float.
    """
    if not 1 <= len(tasks) <= MAX_ENQUEUE_TASKS:
        raise ValueError(f"one enqueue carries 1..{MAX_ENQUEUE_TASKS} tasks, got {len(tasks)}")
    if len(request_id) > MAX_REQUEST_ID_BYTES:
        raise ValueError(f"a request ID has at most {MAX_REQUEST_ID_BYTES} bytes, got {len(request_id)}")
    args = [str(len(tasks)).encode(), request_id]
    for i, (task, key) in enumerate(zip(tasks, _keys_for(tasks, idempotency_keys), strict=True)):
        args += _task_args(i, task, key)
    size = sum(len(a) for a in args)
    if size > MAX_ENQUEUE_BYTES:
        raise ValueError(f"one enqueue carries at most {MAX_ENQUEUE_BYTES} bytes, these tasks hold {size}")
    return args


class EnqueueCall(NamedTuple):
    """One script call of an enqueue: a chunk of its tasks.

    Attributes:
        args: the script's ARGV (``enqueue_args``'s layout).
        tasks: how many tasks it carries.
        safe: every task carries an idempotency key, so the call may be sent again after a
            connection error (a task without one would be added twice if the lost call had run).
    """

    args: list[bytes]
    tasks: int
    safe: bool


def new_request_id() -> str:
    """A fresh request ID for one enqueue: 32 hex digits (a random UUID)."""
    return uuid.uuid4().hex


def enqueue_calls(
    tasks: Sequence[Task],
    idempotency_keys: Sequence[IdempotencyKey] | None = None,
    request_id: str | None = None,
) -> list[EnqueueCall]:
    """The script calls that enqueue any number of ``tasks``, in order, every task checked first.

    Each call (a chunk) carries at most ``MAX_ENQUEUE_TASKS`` tasks and ``MAX_ENQUEUE_BYTES`` bytes
    and is atomic on its own; chunk ``n`` carries the request ID ``<request_id>/<n>``, so a call of
    the same tasks, keys and request ID sends the same chunks (the script then answers a task that
    an earlier send added as it did then: not a duplicate).

    Args:
        tasks: at least one field map of 1..``MAX_TASK_FIELDS`` fields.
        idempotency_keys: None, or one key (or None) per task.
        request_id: 1..``REQUEST_ID_BYTES`` bytes of text naming this enqueue; None: a new one
            (``new_request_id``).

    Raises:
        ValueError: no task, an empty task or one of too many fields, a key list of another
            length, a key or request ID too long, a task larger than one call may carry.
        TypeError: as ``enqueue_args``.
    """
    if not tasks:
        raise ValueError("an enqueue carries at least one task, got 0")
    base = (request_id if request_id is not None else new_request_id()).encode()
    if not 1 <= len(base) <= REQUEST_ID_BYTES:
        raise ValueError(f"a request ID has 1..{REQUEST_ID_BYTES} bytes, got {len(base)}")
    room = MAX_ENQUEUE_BYTES - _HEADER_BYTES
    chunks: list[tuple[list[bytes], int, bool]] = []
    args: list[bytes] = []
    count = size = 0
    safe = True
    for i, (task, key) in enumerate(zip(tasks, _keys_for(tasks, idempotency_keys), strict=True)):
        part = _task_args(i, task, key)
        part_size = sum(len(a) for a in part)
        if part_size > room:
            raise ValueError(f"task {i}: holds {part_size} bytes, more than one enqueue call carries ({room})")
        if count == MAX_ENQUEUE_TASKS or size + part_size > room:
            chunks.append((args, count, safe))
            args, count, size, safe = [], 0, 0, True
        args += part
        count, size, safe = count + 1, size + part_size, safe and bool(key)
    chunks.append((args, count, safe))
    return [
        EnqueueCall([str(count).encode(), base + f"/{n}".encode(), *args], count, safe)
        for n, (args, count, safe) in enumerate(chunks)
    ]


class EnqueueInterruptedError(RedisError):
    """An enqueue of several calls failed after its first calls were done.

    The calls before the failed one were added (``enqueued``), the failed one may or may not have
    been (a lost reply) or was not (an error reply), the later ones were not sent. Calling again
    with the same tasks, idempotency keys and request ID adds each keyed task once and answers as
    the first send would have; an unkeyed task past ``len(enqueued)`` may then be added twice.

    Attributes:
        enqueued: the answers of the tasks done, the first ``len(enqueued)`` tasks, in order.
        total: how many tasks the enqueue carried.
    """

    def __init__(self, enqueued: list[Enqueued], total: int, cause: RedisError) -> None:
        super().__init__(
            f"enqueued {len(enqueued)} of {total} tasks, then a call failed ({type(cause).__name__}: {cause}); "
            f"tasks {len(enqueued)} and later are not confirmed"
        )
        self.enqueued = enqueued
        self.total = total


def parse_enqueue_reply(reply: Sequence[Any]) -> list[Enqueued]:
    """The enqueue script's reply as one ``Enqueued`` per task, in the order given."""
    return [
        Enqueued(as_text(where), as_text(entry_id), int(duplicate) == 1)  # type: ignore[arg-type]
        for where, entry_id, duplicate in reply
    ]


async def enqueue_tasks(
    client: RedisClient,
    keys: ExperimentKeys,
    tasks: Sequence[Task],
    idempotency_keys: Sequence[IdempotencyKey] | None = None,
) -> list[Enqueued]:
    """Enqueue up to ``MAX_ENQUEUE_TASKS`` tasks of the experiment in one script call (one round trip, atomic).

    The experiment's pause state decides where they go; a task whose idempotency key was recorded
    is not added again. No request ID and no retry (``xmc_resumption.client`` has both).

    Args and errors: see ``enqueue_args``; besides, ``redis.exceptions.ResponseError`` for an error
    reply of the script (``WRONGTYPE`` naming a key, ``XMCCORRUPT``) and
    ``redis.exceptions.RedisError`` on any Redis fault (the call may or may not have run).

    Returns:
        One ``Enqueued`` per task, in order.
    """
    args = enqueue_args(tasks, idempotency_keys)
    return parse_enqueue_reply(await run_script(client, "enqueue", keys.enqueue_keys, args))


async def enqueue_task(
    client: RedisClient, keys: ExperimentKeys, task: Task, idempotency_key: IdempotencyKey = None
) -> Enqueued:
    """Enqueue one task of the experiment, honouring its pause state, in one atomic step.

    Args:
        task: the entry's field map (1..``MAX_TASK_FIELDS`` fields).
        idempotency_key: None, or a key that makes a retry of this call add the task once.

    Returns:
        ``Enqueued(destination, entry_id, duplicate)``.

    Raises:
        ValueError: an empty task (XADD needs a field), one of too many fields, or a key too long.
        redis.exceptions.RedisError: on any Redis fault.
    """
    [done] = await enqueue_tasks(client, keys, [task], None if idempotency_key is None else [idempotency_key])
    return done


async def pause(client: RedisClient, keys: ExperimentKeys) -> None:
    """Pause the experiment (``SET`` its state key to ``paused``).

    Its new tasks are held, and a running replay stops at its next turn.
    """
    await client.set(keys.state, ExperimentState.PAUSED.value)


async def get_state(client: RedisClient, keys: ExperimentKeys) -> ExperimentState:
    """The experiment's state as the scripts read it (``lua/tokens.lua``).

    ``running`` when the state key is absent, ``unknown`` when it holds anything but ``paused`` or
    ``resuming``.
    """
    raw = await client.get(keys.state)
    if raw is None:
        return ExperimentState.RUNNING
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    known = (ExperimentState.PAUSED.value, ExperimentState.RESUMING.value)
    return ExperimentState(text) if text in known else ExperimentState.UNKNOWN


async def held_count(client: RedisClient, keys: ExperimentKeys) -> int:
    """Held tasks of the experiment (entries)."""
    return int(await client.xlen(keys.held))
