"""The Lua scripts of the Redis layer, loaded from ``lua/`` beside this file.

Scripts that measure the backlog get ``lua/backlog.lua`` prepended, so the backlog rule is
written once. Each script is registered on a client with ``Redis.register_script``, which runs
``EVALSHA`` and falls back to ``EVAL`` after a ``NOSCRIPT`` reply (a restarted or failed-over
server has an empty script cache).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

_WITH_BACKLOG = frozenset({"measure", "publish"})


@cache
def source(name: str) -> str:
    """The Lua source of script ``name`` (e.g. ``"publish"``), with the backlog fragment if needed.

    Raises:
        FileNotFoundError: when ``lua/<name>.lua`` does not exist.
    """
    lua = resources.files(__package__) / "lua"
    text = (lua / f"{name}.lua").read_text(encoding="utf-8")
    if name in _WITH_BACKLOG:
        text = (lua / "backlog.lua").read_text(encoding="utf-8") + "\n" + text
    return text


def script(client: Redis, name: str) -> AsyncScript:
    """A callable script ``name`` bound to ``client``: ``await script(keys=[...], args=[...])``.

    The registration is cached on the client object, so each script is hashed once per client.
    """
    registered: dict[str, AsyncScript] = client.__dict__.setdefault("_xmc_scripts", {})
    if name not in registered:
        registered[name] = client.register_script(source(name))
    return registered[name]
