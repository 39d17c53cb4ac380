"""An experiment's dead-letter stream: held tasks the publish script cannot move.

A Lua script passes a task's fields to XADD through ``unpack``, which stops near 8,000 values, so
a task with more than ``MAX_TASK_FIELDS`` fields (valid for a plain XADD) can never be moved by the
publish script. The script stops its move before such a task and reports it (``poison_id``); the
replay then sets it aside here, into ``{S}:experiment:E:dead``, with one client-side transaction
fenced like the script (WATCH on the fence counter, MULTI, XADD, XDEL, EXEC),
and goes on with the tasks behind it in order. An operator lists, retries or drops what was set
aside (``xmc dead``).

A script cannot do this step: the task's fields are what Lua cannot pass. On a Redis Cluster the
transaction runs on a single-node client of the primary that serves the stream's slot (all its
keys share that slot), not through redis-py's cluster pipeline: that one follows a MOVED reply to
a read after the WATCH by sending the read again to the new owner on another connection, where the
WATCH does not hold. On one connection a slot that moved mid-transaction fails it instead (MOVED,
or EXECABORT at the EXEC), nothing is moved, and the activity's retry reaches the new owner.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError, SlotNotCoveredError

from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.fencing import parse_token
from xmc_resumption.redisclient.keys import ExperimentKeys, as_text, wrong_type
from xmc_resumption.redisclient.results import SetAside, SetAsideStatus
from xmc_resumption.redisclient.scripts import naming_wrong_type

MAX_TASK_FIELDS = 3_995
"""The most fields a task may have for the scripts to move it: field names and values go through
Lua's ``unpack`` (about 8,000 values at most; ``XMC_MAX_VALUES`` = 7,990 in ``lua/publish.lua``)."""


@asynccontextmanager
async def _transaction(client: RedisClient, key: str) -> AsyncIterator[Pipeline]:
    """A pipeline for WATCH / MULTI / EXEC on the Redis that serves ``key``, on one connection.

    ``client``'s own for a single Redis; for a cluster, one of a client of its own, with one connection
    to the primary that serves ``key``'s slot now (closed at the end), so the whole transaction uses
    one connection.
    """
    if not isinstance(client, RedisCluster):
        async with client.pipeline(transaction=True) as pipe:
            yield pipe
        return
    await client.initialize()
    node = client.get_node_from_key(key)
    if node is None:
        raise SlotNotCoveredError(f"no primary serves the slot of {key}")
    single = Redis.from_pool(
        ConnectionPool(connection_class=node.connection_class, max_connections=1, **node.connection_kwargs)
    )
    try:
        async with single.pipeline(transaction=True) as pipe:
            yield pipe
    finally:
        await single.aclose()


async def set_aside(client: RedisClient, keys: ExperimentKeys, token: int, entry_id: str) -> SetAside:
    """Move held entry ``entry_id`` to the dead-letter stream if ``token`` is still the current fencing token.

    The field map moves byte for byte; atomic (MULTI/EXEC under WATCH).

    Returns:
        ``set_aside``, or ``gone`` when the held stream has no such entry (an earlier try moved
        it), or ``fenced``; and the dead-letter stream's length.

    Raises:
        redis.exceptions.WatchError: the fence counter or the dead-letter stream changed meanwhile
            (retry: the next try sees the change).
        redis.exceptions.ResponseError: WRONGTYPE, the dead-letter key is not a stream (nothing moved).
        ValueError: the fence counter holds no token (``fencing.parse_token``; nothing moved).
        redis.exceptions.RedisError: on any Redis fault.
    """
    async with _transaction(client, keys.stream) as pipe:
        # the fence decides who may move held tasks (only this token's publish removes them), and
        # the dead-letter stream's type is checked: EXEC does not stop at a failed command
        await pipe.watch(keys.fence, keys.dead)
        if parse_token(await pipe.get(keys.fence), keys.fence) != token:
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


async def _dead_count(client: RedisClient, keys: ExperimentKeys) -> int:
    return int(await client.xlen(keys.dead))


async def _must_be_a_stream(client: RedisClient, key: str) -> None:
    """Raise a WRONGTYPE ``ResponseError`` naming ``key`` unless it is a stream or absent.

    Checked under WATCH before a MULTI, since Redis runs the rest of a transaction past a failed
    command.
    """
    wrong = wrong_type(key, as_text(await client.type(key)))
    if wrong:
        raise ResponseError(f"WRONGTYPE {wrong}")


async def dead_letters(client: RedisClient, keys: ExperimentKeys, count: int = 100) -> list[tuple[str, int, int]]:
    """The oldest ``count`` set-aside tasks: (entry ID, fields, bytes of names and values).

    Raises:
        redis.exceptions.ResponseError: WRONGTYPE naming the dead-letter key, when it is no stream.
        redis.exceptions.RedisError: on any other Redis fault.
    """
    async with naming_wrong_type(client, [keys.dead]):
        entries: Any = await client.xrange(keys.dead, count=count)
    return [
        (as_text(entry_id), len(fields), sum(len(k) + len(v) for k, v in fields.items()))
        for entry_id, fields in entries
    ]


async def drop(client: RedisClient, keys: ExperimentKeys, entry_id: str) -> bool:
    """Delete set-aside task ``entry_id``; True when it was there.

    Raises:
        redis.exceptions.ResponseError: WRONGTYPE naming the dead-letter key, when it is no stream.
    """
    async with naming_wrong_type(client, [keys.dead]):
        return bool(await client.xdel(keys.dead, entry_id))


async def retry(client: RedisClient, keys: ExperimentKeys, entry_id: str) -> str | None:
    """Put set-aside task ``entry_id`` back, byte for byte, in one transaction; returns where it went.

    At the end of the held stream when the experiment holds tasks (a state key or held tasks; the next
    resume replays it, and sets it aside again if it still cannot be moved), else into the task stream
    for the consumers. Returns ``held`` or ``stream``, None when it was not there.

    Raises:
        redis.exceptions.ResponseError: WRONGTYPE naming the key, the dead-letter stream or the
            target is not a stream (nothing moved).
        redis.exceptions.RedisError: on any Redis fault (WatchError: a concurrent change; retry).
    """
    async with (
        naming_wrong_type(client, [keys.dead, keys.state, keys.held, keys.stream]),
        _transaction(client, keys.stream) as pipe,
    ):
        await pipe.watch(keys.dead, keys.state, keys.held)
        entries: Any = await pipe.xrange(keys.dead, entry_id, entry_id)
        if not entries:
            return None
        holding = bool(await pipe.exists(keys.state)) or bool(await pipe.xlen(keys.held))
        target, where = (keys.held, "held") if holding else (keys.stream, "stream")
        await _must_be_a_stream(pipe, target)
        pipe.multi()
        pipe.xadd(target, entries[0][1])
        pipe.xdel(keys.dead, entry_id)
        await pipe.execute()
    return where
