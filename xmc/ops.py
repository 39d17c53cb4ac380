"""Operator actions shared by the CLI and the demo: status of an experiment, starting a resumption."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from redis.exceptions import ResponseError
from temporalio.client import Client, WorkflowHandle

from redisclient import fencing, held
from redisclient.backlog import measure_backlog
from redisclient.connection import RedisClient
from redisclient.keys import ExperimentKeys, as_text
from redisclient.memory import read_memory
from redisclient.results import ExperimentState
from workflows.models import ResumptionInput, ResumptionResult
from workflows.resumption import ResumptionWorkflow
from xmc.errors import KeyContentError, OperatorError

T = TypeVar("T")

MAX_SHOWN_VALUE_CHARS = 40
"""Longest part of a garbage key's value an error message quotes."""


async def _read_key(redis: RedisClient, key: str, expected: str, read: Awaitable[T], *, parses: bool = False) -> T:
    """Await ``read`` of ``key``; a key of the wrong type (WRONGTYPE), or for a read that
    ``parses`` the value a ``ValueError``, becomes ``KeyContentError`` naming the key, what it
    holds and what the contract expects (``expected``)."""
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


async def experiment_status(redis: RedisClient, keys: ExperimentKeys, group: str, threshold: int) -> dict[str, object]:
    """State, held tasks (entries), claim, last fencing token and the group's backlog, as a dict.

    ``orphaned`` is True for an experiment that is resuming with no live claim: its replayer is
    gone (a failed or terminated run whose lease lapsed) and producers are still holding its tasks;
    starting a resumption again continues the replay in order. ``redis_memory`` is Redis's
    ``maxmemory-policy``, used memory and ``maxmemory`` (bytes, 0: no limit) and ``problem``, why a
    resumption would refuse this Redis (None under ``noeviction``; ``redisclient.memory``).

    Raises:
        KeyContentError: a key holds the wrong type or a value the contract does not know.
    """
    reading = await _read_key(
        redis, keys.stream, "a stream (the task stream)", measure_backlog(redis, keys.stream, group, threshold)
    )
    state, held_tasks = await state_and_held(redis, keys)
    claim = await _read_key(redis, keys.claim, "a hash (token, owner)", fencing.claim_info(redis, keys))
    fence = await _read_key(
        redis, keys.fence, "an integer (the fencing token)", fencing.current_token(redis, keys), parses=True
    )
    return {
        "experiment_id": keys.experiment_id,
        "state": state.value,
        "orphaned": state is ExperimentState.RESUMING and not claim,
        "held": held_tasks,
        "claim": claim,
        "fence": fence,
        "set_aside": await _read_key(redis, keys.dead, "a stream (the set-aside tasks)", redis.xlen(keys.dead)),
        "backlog": {
            "group": group,
            "pending": reading.pending,
            "lag": reading.lag,
            "capped": reading.capped,
            "status": reading.status.value,
            "threshold": threshold,
        },
        "redis_memory": (await read_memory(redis, keys.stream)).model_dump(),
    }


async def refuse_evicting_redis(redis: RedisClient, keys: ExperimentKeys) -> None:
    """Refuse, before anything starts, a Redis whose ``maxmemory-policy`` could evict the replay's
    keys: the resumption would fail at its claim (``redisclient.memory``).

    Raises:
        OperatorError: the policy is not ``noeviction``; the message names it.
    """
    memory = await read_memory(redis, keys.stream)
    if memory.problem:
        raise OperatorError(memory.problem)


async def start_resumption(
    client: Client, inp: ResumptionInput, task_queue: str
) -> WorkflowHandle[ResumptionWorkflow, ResumptionResult]:
    """Start ``ResumptionWorkflow`` with the conventional ID ``resumption-<E>``.

    Raises:
        temporalio.exceptions.WorkflowAlreadyStartedError: a resumption of this experiment runs.
    """
    return await client.start_workflow(ResumptionWorkflow.run, inp, **inp.start_options(task_queue))
