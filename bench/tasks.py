"""Held tasks for the benchmarks: fill a held stream, check a replay moved every task once, in order.

Fill an experiment's held stream, and check after a replay that every task reached the task stream exactly once and
in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import ExperimentKeys

PIPELINE_CHUNK = 5_000
"""XADDs per pipeline round trip when filling (entries)."""

READ_CHUNK = 10_000
"""Entries per XRANGE when checking a replay, so a 1e6-task check stays small in memory."""


def task_fields(experiment_id: str, n: int, payload: bytes) -> dict[str | bytes, str | bytes | int | float]:
    """The field map of task ``n`` of an experiment: its name, its number and a payload."""
    return {b"task": f"{experiment_id}:{n}".encode(), b"n": str(n).encode(), b"payload": payload}


async def hold_tasks(redis: Redis, keys: ExperimentKeys, count: int, payload_bytes: int = 80) -> None:
    """Pause the experiment and hold ``count`` tasks (entries of about ``payload_bytes`` + 30 bytes).

    Task 0 goes through the pause-aware enqueue script (``held.enqueue_task``) to check that a
    paused experiment holds it; the rest are appended to the held stream by pipelined XADDs, the
    same entries the script would write, because one script call per task costs a round trip each.

    Raises:
        RuntimeError: the enqueue script did not hold task 0 (the experiment is not paused).
    """
    payload = b"x" * payload_bytes
    await held.pause(redis, keys)
    where = (await held.enqueue_task(redis, keys, task_fields(keys.experiment_id, 0, payload))).destination
    if where != "held":
        raise RuntimeError(f"task 0 went to the {where}, not the held stream")
    for start in range(1, count, PIPELINE_CHUNK):
        async with redis.pipeline(transaction=False) as pipe:
            for n in range(start, min(start + PIPELINE_CHUNK, count)):
                pipe.xadd(keys.held, task_fields(keys.experiment_id, n, payload))  # type: ignore[arg-type]
            await pipe.execute()


@dataclass
class ReplayCheck:
    """What ``check_replay`` found.

    Attributes:
        in_stream: the experiment's tasks found in the task stream (entries).
        in_order: they are tasks 0..count-1, each once, in that order.
        held_left: tasks still held (entries).
        running: the experiment is running again (its state key is gone).
    """

    in_stream: int
    in_order: bool
    held_left: int
    running: bool

    @property
    def exactly_once(self) -> bool:
        """Every task in the stream exactly once, in order, and nothing left held."""
        return self.in_order and self.held_left == 0 and self.running


async def check_replay(redis: Redis, keys: ExperimentKeys, count: int) -> ReplayCheck:
    """Read the task stream in chunks and check the experiment's tasks are 0..count-1 in order."""
    prefix = keys.experiment_id.encode() + b":"
    expected, in_order, start = 0, True, "-"
    while True:
        chunk: list[Any] = await redis.xrange(keys.stream, min=start, count=READ_CHUNK) or []
        for _, fields in chunk:
            if not fields.get(b"task", b"").startswith(prefix):
                continue
            in_order = in_order and int(fields[b"n"]) == expected
            expected += 1
        if len(chunk) < READ_CHUNK:
            break
        start = "(" + chunk[-1][0].decode()
    state = await held.get_state(redis, keys)
    return ReplayCheck(
        in_stream=expected,
        in_order=in_order and expected == count,
        held_left=await held.held_count(redis, keys),
        running=state.value == "running",
    )
