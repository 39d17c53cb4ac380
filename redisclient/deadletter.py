"""An experiment's dead-letter stream: held tasks the publish script cannot move.

A Lua script passes a task's fields to XADD through ``unpack``, which stops near 8,000 values, so
a task with more than ``MAX_TASK_FIELDS`` fields (valid for a plain XADD) can never be moved by the
publish script. The script stops its move before such a task and reports it (``poison_id``); the
replay then sets it aside here, into ``{S}:experiment:E:dead``, with one client-side transaction
fenced like the script (WATCH on the fence counter, MULTI, XADD, XDEL, EXEC),
and goes on with the tasks behind it in order. An operator lists, retries or drops what was set
aside (``xmc dead``).

A script cannot do this step: the task's fields are what Lua cannot pass. On a Redis Cluster the
transaction goes through redis-py's cluster pipeline (redis-py >= 6.2): all its keys share the
stream's slot, the WATCH, the reads and MULTI/EXEC use one connection to that slot's primary, and a
slot moved while watched aborts it with a ``WatchError`` (retried; the next try sees the new owner).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import ClusterPipeline
from redis.exceptions import ResponseError

from redisclient.connection import RedisClient
from redisclient.keys import ExperimentKeys, as_text, wrong_type
from redisclient.results import SetAside, SetAsideStatus

MAX_TASK_FIELDS = 3_995
"""The most fields a task may have for the scripts to move it: field names and values go through
Lua's ``unpack`` (about 8,000 values at most; ``XMC_MAX_VALUES`` = 7,990 in ``lua/publish.lua``)."""


async def set_aside(client: RedisClient, keys: ExperimentKeys, token: int, entry_id: str) -> SetAside:
    """Move held entry ``entry_id`` to the dead-letter stream, field map byte for byte, if
    ``token`` is still the current fencing token; atomic (MULTI/EXEC under WATCH).

    Returns:
        ``set_aside``, or ``gone`` when the held stream has no such entry (an earlier try moved
        it), or ``fenced``; and the dead-letter stream's length.

    Raises:
        redis.exceptions.WatchError: the fence counter or the dead-letter stream changed meanwhile
            (retry: the next try sees the change).
        redis.exceptions.ResponseError: WRONGTYPE, the dead-letter key is not a stream (nothing moved).
        redis.exceptions.RedisError: on any Redis fault.
    """
    async with client.pipeline(transaction=True) as pipe:
        # the fence decides who may move held tasks (only this token's publish removes them), and
        # the dead-letter stream's type is checked: EXEC does not stop at a failed command
        await pipe.watch(keys.fence, keys.dead)
        fence = await pipe.get(keys.fence)
        if fence is None or as_text(fence) != str(token):
            return SetAside(status=SetAsideStatus.FENCED, key=keys.dead, dead=await _dead_count(pipe, keys))
        await _must_be_a_stream(pipe, keys.dead)
        entries: Any = await pipe.xrange(keys.held, entry_id, entry_id)
        if not entries:
            return SetAside(status=SetAsideStatus.GONE, key=keys.dead, dead=await _dead_count(pipe, keys))
        fields = entries[0][1]
        pipe.multi()
        pipe.xadd(keys.dead, fields)
        pipe.xdel(keys.held, entry_id)
        pipe.xlen(keys.dead)
        _, _, dead = await pipe.execute()
    return SetAside(status=SetAsideStatus.SET_ASIDE, key=keys.dead, dead=int(dead))


async def _dead_count(client: RedisClient | ClusterPipeline, keys: ExperimentKeys) -> int:
    return int(await client.xlen(keys.dead))


async def _must_be_a_stream(client: RedisClient | ClusterPipeline, key: str) -> None:
    """Raise a WRONGTYPE ``ResponseError`` naming ``key`` unless it is a stream or absent: checked
    under WATCH before a MULTI, since Redis runs the rest of a transaction past a failed command."""
    wrong = wrong_type(key, as_text(await client.type(key)))
    if wrong:
        raise ResponseError(f"WRONGTYPE {wrong}")


async def dead_letters(client: RedisClient, keys: ExperimentKeys, count: int = 100) -> list[tuple[str, int, int]]:
    """The oldest ``count`` set-aside tasks: (entry ID, fields, bytes of names and values)."""
    entries: Any = await client.xrange(keys.dead, count=count)
    return [
        (as_text(entry_id), len(fields), sum(len(k) + len(v) for k, v in fields.items()))
        for entry_id, fields in entries
    ]


async def drop(client: RedisClient, keys: ExperimentKeys, entry_id: str) -> bool:
    """Delete set-aside task ``entry_id``; True when it was there."""
    return bool(await client.xdel(keys.dead, entry_id))


async def retry(client: RedisClient, keys: ExperimentKeys, entry_id: str) -> str | None:
    """Put set-aside task ``entry_id`` back, byte for byte, in one transaction: at the end of the
    held stream when the experiment holds tasks (a state key or held tasks; the next resume
    replays it, and sets it aside again if it still cannot be moved), else into the task stream
    for the consumers. Returns where it went (``held`` or ``stream``), None when it was not there.

    Raises:
        redis.exceptions.ResponseError: WRONGTYPE, the target is not a stream (nothing moved).
        redis.exceptions.RedisError: on any Redis fault (WatchError: a concurrent change; retry).
    """
    async with client.pipeline(transaction=True) as pipe:
        await pipe.watch(keys.dead, keys.state, keys.held)
        entries: Any = await pipe.xrange(keys.dead, entry_id, entry_id)
        if not entries:
            return None
        # TYPE, not EXISTS: a cluster pipeline splits EXISTS by slot and returns itself, not the count
        holding = as_text(await pipe.type(keys.state)) != "none" or bool(await pipe.xlen(keys.held))
        target, where = (keys.held, "held") if holding else (keys.stream, "stream")
        await _must_be_a_stream(pipe, target)
        pipe.multi()
        pipe.xadd(target, entries[0][1])
        pipe.xdel(keys.dead, entry_id)
        await pipe.execute()
    return where
