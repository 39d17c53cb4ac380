"""Experiment pause state and the pause-aware enqueue of tasks (docs/contract.md, "The state machine").

State machine: running --pause--> paused --resume--> resuming --(held stream drained)--> running;
pause is allowed from resuming too. Producers enqueue through ``enqueue_task``: running goes to the
task stream, paused or resuming to the experiment's held stream, so order is kept while a replay
runs. The move ``paused`` -> ``resuming`` is taken by ``fencing.acquire_claim``; the move back to
running by the publish script when the held stream is drained.
"""

from __future__ import annotations

from collections.abc import Mapping

from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.deadletter import MAX_TASK_FIELDS
from xmc_resumption.redisclient.keys import ExperimentKeys, as_text
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.redisclient.scripts import run_script

Task = Mapping[str | bytes, str | bytes | int | float]
"""A task: a stream entry's field map. Stored byte for byte; an int or float is stored as its text."""


async def enqueue_task(client: RedisClient, keys: ExperimentKeys, task: Task) -> tuple[str, bytes]:
    """Enqueue one task of the experiment, honouring its pause state, in one atomic step.

    Args:
        task: the entry's field map (at least one field).

    Returns:
        (destination, entry ID): destination ``"stream"`` (running) or ``"held"`` (paused or
        resuming); the entry ID as bytes (or str with ``decode_responses``).

    Raises:
        ValueError: an empty task (XADD needs a field), or one of more than ``MAX_TASK_FIELDS``.
        redis.exceptions.RedisError: on any Redis fault.
    """
    if not task:
        raise ValueError("a task needs at least one field")
    if len(task) > MAX_TASK_FIELDS:
        raise ValueError(
            f"a task of {len(task)} fields has more than {MAX_TASK_FIELDS}: the scripts pass a task's fields "
            "through Lua's unpack, which stops near 8,000 values"
        )
    flat: list[str | bytes | int | float] = []
    for field, value in task.items():
        flat += [field, value]
    where, entry_id = await run_script(client, "enqueue", [keys.stream, keys.state, keys.held], flat)
    return as_text(where), entry_id


async def pause(client: RedisClient, keys: ExperimentKeys) -> None:
    """Pause the experiment: its new tasks are held, and a running replay stops at its next turn."""
    await client.set(keys.state, ExperimentState.PAUSED.value)


async def get_state(client: RedisClient, keys: ExperimentKeys) -> ExperimentState:
    """The experiment's state: ``running`` when the state key is absent, ``unknown`` when it holds
    anything but ``paused`` or ``resuming`` (as the scripts read it: ``lua/tokens.lua``)."""
    raw = await client.get(keys.state)
    if raw is None:
        return ExperimentState.RUNNING
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    known = (ExperimentState.PAUSED.value, ExperimentState.RESUMING.value)
    return ExperimentState(text) if text in known else ExperimentState.UNKNOWN


async def held_count(client: RedisClient, keys: ExperimentKeys) -> int:
    """Held tasks of the experiment (entries)."""
    return int(await client.xlen(keys.held))
