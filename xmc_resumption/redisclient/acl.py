"""Redis ACL refusals: tell one from other error replies and say, on one line, who may not do what.

The project runs as an ACL user limited to its keys and commands (``deploy/redis-acl.conf``). A
call outside that rule is refused, and the refusal repeats on every try, so the activities fail it
at once (``activities.resumption._classified``) and the CLI prints it (``xmc_resumption.errors``). Redis words
a refusal in several ways, none naming the user (which the client knows) and not always the
command:

- a command outside the rule: ``NOPERM this user has no permissions to run the 'flushall' command``
  (Redis 7.0), ``NOPERM User u has no permissions to run the 'flushall' command`` (7.2 and later);
- a key outside the patterns: ``NOPERM this user has no permissions to access one of the keys used
  as arguments`` (7.0), ``NOPERM No permissions to access a key`` (7.2);
- either from inside a Lua script: ``ERR The user executing the script can't run this command or
  subcommand`` / ``... can't access at least one of the keys ...`` (7.0; no command named),
  ``ERR ACL failure in script: ...`` (7.2). The script's SHA1 in the original reply names the
  script (``script: <sha>``), so the message names the script the command came from.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from importlib import resources

from redis.exceptions import NoPermissionError

from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.scripts import run_script, source

_SCRIPT_DENIALS = ("The user executing the script can't", "ACL failure in script")
_QUOTED_COMMAND = re.compile(r"'([a-z0-9_|-]+)'", re.IGNORECASE)
_SCRIPT_SHA = re.compile(r"script: ([0-9a-f]{40})")
_SCRIPT_SUFFIX = re.compile(r"\s*script: [0-9a-f]{40}(, on @user_script:\d+)?\.?")
_SCRIPT_LINE = re.compile(r"on @user_script:(\d+)")
_REDIS_CALL = re.compile(r"redis\.call\('([A-Z]+)'(?:, '([A-Z]+)')?")
_WITH_SUBCOMMANDS = frozenset({"XINFO", "XGROUP", "SCRIPT", "CLUSTER", "CLIENT", "CONFIG", "OBJECT", "MEMORY"})


def is_denial(err: BaseException) -> bool:
    """True when ``err`` is an ACL refusal (a command or a key outside the user's rule).

    Whether sent directly (``NOPERM``: redis-py raises ``NoPermissionError`` and drops the prefix) or
    from a Lua script (a plain ``ResponseError``).
    """
    reply = str(err)
    return (
        isinstance(err, NoPermissionError)
        or reply.startswith("NOPERM")
        or any(text in reply for text in _SCRIPT_DENIALS)
    )


@cache
def _script_names() -> dict[str, str]:
    """SHA1 of each of the project's scripts (as ``redisclient.scripts.source`` builds it) -> name."""
    lua = resources.files("xmc_resumption.redisclient") / "lua"
    names = [p.name.removesuffix(".lua") for p in lua.iterdir() if p.name.endswith(".lua")]
    return {hashlib.sha1(source(name).encode(), usedforsecurity=False).hexdigest(): name for name in names}


def acl_user(client: RedisClient) -> str:
    """The ACL user ``client`` authenticates as: the URL's username, ``default`` when it names none.

    Read by ``get_connection_kwargs``, which redis-py's cluster client has too.
    """
    return str(client.get_connection_kwargs().get("username") or "default")


def denial_message(err: BaseException, user: str, doing: str) -> str | None:
    """One line for an ACL refusal naming the user, the command and the reply; None when ``err`` is not one.

    It names the ACL ``user``, the refused command (or, when Redis does not name it, the script or the
    step ``doing`` it came from) and the reply. Never a password: neither the reply nor the user carries
    one.

    Args:
        err: the error raised by redis-py (``NoPermissionError`` or a ``ResponseError``); its
            ``__cause__`` chain is searched for the script's SHA1 (``run_script`` drops it).
        user: the ACL user (``acl_user``).
        doing: where it happened, e.g. ``in publish_batch`` (an activity) or ``at XMC_REDIS_URL=...``.
    """
    if not is_denial(err):
        return None
    reply = str(err)
    named = _QUOTED_COMMAND.search(reply)
    script, line = _script_of(err)
    command = named.group(1).upper() if named else _command_at(script, line) if "key" not in reply else None
    if command:
        what = f"run {command}" + (f" (from the {script} script)" if script else "")
    elif "key" in reply:
        what = "access a key" + (f" of the {script} script" if script else "") + " outside its key patterns"
    else:
        what = f"run a command of the {script} script (EVALSHA)" if script else "run a command"
    reply = _SCRIPT_SUFFIX.sub("", reply).rstrip(" ,.")
    if isinstance(err, NoPermissionError) and not reply.startswith("NOPERM"):
        reply = f"NOPERM {reply}"
    return f"Redis ACL user {user!r} may not {what}, {doing}: {reply} (see deploy/redis-acl.conf)"


def _script_of(err: BaseException) -> tuple[str | None, int | None]:
    """The project script an error reply came from and the script line the reply names, or None.

    Found by the SHA1 in the reply or in its causes; the line is the reply's ``on @user_script:<line>``.
    """
    seen: BaseException | None = err
    while seen is not None:
        found = _SCRIPT_SHA.search(str(seen))
        if found:
            line = _SCRIPT_LINE.search(str(seen))
            return _script_names().get(found.group(1), "unknown"), int(line.group(1)) if line else None
        seen = seen.__cause__
    return None, None


def _command_at(script: str | None, line: int | None) -> str | None:
    """The command that line ``line`` (1-based) of project script ``script`` calls, as Redis names it in ACL rules.

    Such as ``INFO``, ``XINFO|GROUPS``; None when it cannot be told. Redis 7.0 does not name a command
    refused inside a script, only the script's line, which runs one command.
    """
    if script is None or script == "unknown" or line is None:
        return None
    lines = source(script).splitlines()
    if not 1 <= line <= len(lines):
        return None
    calls = {
        f"{cmd}|{sub}" if sub and cmd in _WITH_SUBCOMMANDS else cmd for cmd, sub in _REDIS_CALL.findall(lines[line - 1])
    }
    return " or ".join(sorted(calls)) or None


async def allowed_commands(client: RedisClient, slot_key: str, commands: list[list[str]]) -> list[bool]:
    """Whether ``client``'s ACL user may run each of ``commands``, asked of Redis without running them.

    A command is its name and its arguments, keys among them. Asked with ``redis.acl_check_cmd`` in
    ``lua/acl_check.lua`` (Redis >= 7.0). Reads and writes nothing.

    Args:
        slot_key: a key of the slot to ask (on a Redis Cluster, the node holding it answers); not read.

    Raises:
        redis.exceptions.RedisError: on any Redis fault (NOPERM when the user may not run EVALSHA).
    """
    reply = await run_script(client, "acl_check", [slot_key], [json.dumps(commands)])
    return [bool(x) for x in json.loads(reply)]
