"""The Lua scripts of the Redis layer, loaded from ``lua/`` beside this file.

Scripts get the fragments they use prepended (``_FRAGMENTS``), so each rule is written once.
Each script is registered on a client with ``Redis.register_script``, which runs
``EVALSHA`` and falls back to ``EVAL`` after a ``NOSCRIPT`` reply (a restarted or failed-over
server has an empty script cache).

Every script touches keys of one Redis Cluster slot (the ``{S}`` hash tag, ``redisclient.keys``),
so one primary runs it atomically. ``run_script`` checks this before each call, on a single Redis
too: a script whose keys span two slots would work there and fail only once deployed on a cluster.

On a client that requires replica acknowledgements (``connection.require_replica_acks``), the
scripts of ``ACKNOWLEDGED`` run on one connection followed by ``WAIT`` on it: ``WAIT`` counts the
replicas that have the connection's writes so far, so the script counts as done only once they
have its writes. (A script that answers from a record of an earlier call writes too, so that the
``WAIT`` covers the write it reports: ``lua/tokens.lua``'s ``xmc_touch``.)
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.asyncio import Redis
from redis.commands.core import AsyncScript, Script
from redis.crc import key_slot
from redis.exceptions import ResponseError

from xmc_resumption.redisclient.connection import RedisClient, ReplicaAcks, SyncRedisClient, replica_acks
from xmc_resumption.redisclient.errors import ReplicaAckError
from xmc_resumption.redisclient.keys import as_text, wrong_type
from xmc_resumption.redisclient.text import script_reply

_FRAGMENTS = {
    "measure": ("backlog",),
    "publish": ("tokens", "redelivery", "backlog", "memory", "fair", "rate"),
    "acquire": ("tokens", "redelivery", "memory"),
    "memory_status": ("memory",),
    "rate_status": ("rate",),
    "check": ("tokens",),
    "release": ("tokens",),
    "held_again": ("tokens", "redelivery"),
}
"""The fragments each script gets prepended: ``backlog.lua`` (the backlog and throttle rule),
``tokens.lua`` (exact fencing tokens, the known states), ``redelivery.lua`` (tasks held again after
Redis lost their move), ``memory.lua`` (the eviction-policy and memory-fraction rule), ``fair.lua``
(the fair share of a shared threshold) and ``rate.lua`` (the stream-wide rate cap), so each rule is
written once."""


@cache
def source(name: str) -> str:
    """The Lua source of script ``name`` (e.g. ``"publish"``), with its fragments prepended.

    Raises:
        FileNotFoundError: when ``lua/<name>.lua`` does not exist.
    """
    lua = resources.files(__package__) / "lua"
    text = (lua / f"{name}.lua").read_text(encoding="utf-8")
    for fragment in reversed(_FRAGMENTS.get(name, ())):
        text = (lua / f"{fragment}.lua").read_text(encoding="utf-8") + "\n" + text
    return text


ACKNOWLEDGED = frozenset({"acquire", "publish", "release", "enqueue"})
"""The scripts whose writes must survive a failover, so they wait for replica acknowledgements when
the client requires them: the claim, every publish, the release and the producers' enqueue."""


def script(client: RedisClient, name: str) -> AsyncScript:
    """The script ``name`` bound to ``client``, called as ``await s(keys=[...], args=[...])``.

    The registration is cached on the client object, so each script is hashed once per client.
    """
    registered: dict[str, AsyncScript] = client.__dict__.setdefault("_xmc_scripts", {})
    if name not in registered:
        registered[name] = client.register_script(source(name))
    return registered[name]


_SCRIPT_SUFFIX = re.compile(r"\s*script: [0-9a-f]{40}, on @user_script:\d+\.?$")


class CrossSlotKeysError(ValueError):
    """A script was called with keys of more than one Redis Cluster slot; nothing was sent.

    A ``ValueError`` (an argument that cannot work; the activities fail without retrying). Redis
    Cluster would refuse the call with ``CROSSSLOT`` (and redis-py's cluster client before it); a
    single Redis would run it. The message names every key with its slot.

    Attributes:
        script: the script's name.
        slots: each key and its slot (0..16383), in the order given.
    """

    def __init__(self, script: str, slots: dict[str, int]) -> None:
        shown = ", ".join(f"{key} (slot {slot})" for key, slot in slots.items())
        super().__init__(
            f"script {script!r} must touch keys of one Redis Cluster slot, got {len(set(slots.values()))} slots: "
            f"{shown}; an experiment's keys share the task stream's slot through the {{stream}} hash tag"
        )
        self.script = script
        self.slots = slots


def check_one_slot(name: str, keys: list[str]) -> None:
    """Raise ``CrossSlotKeysError`` unless every key of ``keys`` hashes to the same Redis Cluster slot.

    The slot is the CRC16 of the key, or of its ``{...}`` hash tag, mod 16384 (the Redis Cluster spec,
    "Key distribution model", as ``redis.crc.key_slot`` computes it).
    """
    slots = {key: key_slot(key.encode()) for key in keys}
    if len(set(slots.values())) > 1:
        raise CrossSlotKeysError(name, slots)


async def run_script(client: RedisClient, name: str, keys: list[str], args: list[Any]) -> Any:
    """Run script ``name`` with ``keys`` and ``args``; returns its reply.

    The keys must share one cluster slot (``check_one_slot``), on any client.

    Error replies come back naming what is wrong rather than where in the script: the
    ``script: <sha>, on @user_script:<line>`` suffix Redis appends is dropped, and a WRONGTYPE
    reply names the key of the wrong type and what it holds (``TYPE`` of each key, after the
    script failed; the script itself wrote nothing, since every script validates first).

    A script of ``ACKNOWLEDGED`` on a client that requires replica acknowledgements
    (``connection.replica_acks``) is followed by ``WAIT`` on its connection.

    Raises:
        CrossSlotKeysError: ``keys`` span two or more slots; nothing was sent.
        redis.exceptions.ResponseError (the same class redis-py chose): an error reply.
        errors.ReplicaAckError: fewer replicas than required acknowledged the script's writes in time.
        redis.exceptions.RedisError: any other Redis fault, unchanged.
    """
    check_one_slot(name, keys)
    acks = replica_acks(client) if name in ACKNOWLEDGED else None
    try:
        async with naming_wrong_type(client, keys):
            if acks is None:
                return await script(client, name)(keys=keys, args=args)
            return await _acknowledged(client, name, keys, args, acks)
    except ResponseError as err:
        reply = script_reply(_SCRIPT_SUFFIX.sub("", str(err)))
        if reply == str(err):
            raise
        raise type(err)(reply) from err


async def _acknowledged(client: RedisClient, name: str, keys: list[str], args: list[Any], acks: ReplicaAcks) -> Any:
    """Run script ``name`` and then ``WAIT`` on the same connection of ``client`` (a single Redis).

    Raises:
        errors.ReplicaAckError: fewer than ``acks.replicas`` acknowledged within ``acks.timeout_ms``.
    """
    assert isinstance(client, Redis)  # connection.require_replica_acks refuses a cluster client
    connection = client.client()  # one connection of the client's pool, back to it when closed
    try:
        reply = await script(client, name)(keys=keys, args=args, client=connection)
        acked = int(await connection.execute_command("WAIT", acks.replicas, acks.timeout_ms))
    finally:
        await connection.aclose()
    if acked < acks.replicas:
        raise ReplicaAckError(name, acked, acks.replicas, acks.timeout_ms)
    return reply


def run_script_sync(client: SyncRedisClient, name: str, keys: list[str], args: list[Any]) -> Any:
    """``run_script`` on a blocking client (``redis.Redis`` or ``redis.cluster.RedisCluster``).

    The same checks, the same error replies, the same replica acknowledgements. The script is
    registered once per client.
    """
    check_one_slot(name, keys)
    registered: dict[str, Script] = client.__dict__.setdefault("_xmc_scripts", {})
    if name not in registered:
        registered[name] = client.register_script(source(name))
    acks = replica_acks(client) if name in ACKNOWLEDGED else None
    try:
        if acks is None:
            return registered[name](keys=keys, args=args)
        assert isinstance(client, redis.Redis)  # connection.require_replica_acks refuses a cluster client
        with client.client() as connection:  # one connection of the client's pool, back to it at the end
            reply = registered[name](keys=keys, args=args, client=connection)
            acked = int(connection.execute_command("WAIT", acks.replicas, acks.timeout_ms))
        if acked < acks.replicas:
            raise ReplicaAckError(name, acked, acks.replicas, acks.timeout_ms)
        return reply
    except ResponseError as err:
        reply = script_reply(_SCRIPT_SUFFIX.sub("", str(err)))
        if reply.startswith("WRONGTYPE"):
            reply = _wrong_type_reply(reply, keys, [as_text(client.type(key)) for key in keys])
        if reply == str(err):
            raise
        raise type(err)(reply) from err


def _wrong_type_reply(reply: str, keys: Sequence[str], types: list[str]) -> str:
    """A WRONGTYPE reply naming each key of ``keys`` whose ``TYPE`` (``types``) is not its layout's."""
    wrong = [text for key, kind in zip(keys, types, strict=True) if (text := wrong_type(key, kind))]
    return "WRONGTYPE " + ("; ".join(wrong) if wrong else reply.removeprefix("WRONGTYPE "))


@asynccontextmanager
async def naming_wrong_type(client: RedisClient, keys: Sequence[str]) -> AsyncIterator[None]:
    """Run the block; a WRONGTYPE error reply from it is raised again naming the key and the expected type.

    The key of the wrong type and what the layout expects are found by ``TYPE`` of each of ``keys``,
    asked after the failure: ``WRONGTYPE {S}:experiment:E:dead is a string, expected a stream``.
    Redis's own reply names no key. Any other error passes unchanged.

    Raises:
        redis.exceptions.ResponseError (the class redis-py chose): the renamed WRONGTYPE reply.
    """
    try:
        yield
    except ResponseError as err:
        reply = script_reply(_SCRIPT_SUFFIX.sub("", str(err)))
        if not reply.startswith("WRONGTYPE"):
            raise
        types = [as_text(await client.type(key)) for key in keys]
        raise type(err)(_wrong_type_reply(reply, keys, types)) from err
