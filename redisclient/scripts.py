"""The Lua scripts of the Redis layer, loaded from ``lua/`` beside this file.

Scripts get the fragments they use prepended (``_FRAGMENTS``), so each rule is written once.
Each script is registered on a client with ``Redis.register_script``, which runs
``EVALSHA`` and falls back to ``EVAL`` after a ``NOSCRIPT`` reply (a restarted or failed-over
server has an empty script cache).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from redisclient.keys import as_text, wrong_type

_FRAGMENTS = {
    "measure": ("backlog",),
    "publish": ("tokens", "backlog", "fair"),
    "acquire": ("tokens",),
    "check": ("tokens",),
    "release": ("tokens",),
}
"""The fragments each script gets prepended: ``backlog.lua`` (the backlog and throttle rule) and
``tokens.lua`` (exact fencing tokens, the known states), ``fair.lua`` (the fair share of a shared
threshold), so each rule is written once."""


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


def script(client: Redis, name: str) -> AsyncScript:
    """A callable script ``name`` bound to ``client``: ``await script(keys=[...], args=[...])``.

    The registration is cached on the client object, so each script is hashed once per client.
    """
    registered: dict[str, AsyncScript] = client.__dict__.setdefault("_xmc_scripts", {})
    if name not in registered:
        registered[name] = client.register_script(source(name))
    return registered[name]


_SCRIPT_SUFFIX = re.compile(r"\s*script: [0-9a-f]{40}, on @user_script:\d+\.?$")


async def run_script(client: Redis, name: str, keys: list[str], args: list[Any]) -> Any:
    """Run script ``name`` with ``keys`` and ``args``; returns its reply.

    Error replies come back naming what is wrong rather than where in the script: the
    ``script: <sha>, on @user_script:<line>`` suffix Redis appends is dropped, and a WRONGTYPE
    reply names the key of the wrong type and what it holds (``TYPE`` of each key, after the
    script failed; the script itself wrote nothing, since every script validates first).

    Raises:
        redis.exceptions.ResponseError (the same class redis-py chose): an error reply.
        redis.exceptions.RedisError: any other Redis fault, unchanged.
    """
    try:
        return await script(client, name)(keys=keys, args=args)
    except ResponseError as err:
        reply = _SCRIPT_SUFFIX.sub("", str(err))
        if reply.startswith("WRONGTYPE"):
            found = [wrong_type(key, as_text(await client.type(key))) for key in keys]
            wrong = [text for text in found if text]
            reply = "WRONGTYPE " + ("; ".join(wrong) if wrong else reply.removeprefix("WRONGTYPE "))
        raise type(err)(reply) from err
