"""The memory guard: Redis's eviction policy and used memory, as the replay needs them.

Only ``maxmemory-policy noeviction`` keeps every key of the replay: ``allkeys-*`` can evict the held
stream (tasks lost) or the fence counter (a stale replayer writes again), and ``volatile-*`` evicts
keys with a TTL, of which the claim hash is one (its lease), so under memory pressure it would be
the first key to go. The rule lives in ``lua/memory.lua``: the acquire and publish scripts fail
before their first write under any other policy (an error reply starting ``XMCEVICTION``, mapped
to the non-retryable ``ErrorType.REDIS_EVICTION_POLICY``), so no way of starting a resumption
skips it. This module reads the same settings for the worker's start, ``xmc status`` and
``xmc resume``'s check before it starts anything, and words the memory wait.

Used memory: a publish moves nothing while ``used_memory >= fraction x maxmemory``
(``max_memory_fraction`` of the workflow input, default ``DEFAULT_MEMORY_FRACTION``), read inside
the publish script, so the check and the move are one step. Without a limit (``maxmemory 0``) the
check is off.
"""

from __future__ import annotations

from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.readings import RedisMemory
from xmc_resumption.redisclient.scripts import run_script

EVICTION_REPLY = "XMCEVICTION"
"""The start of the error reply of a script refused by the eviction policy (``lua/memory.lua``)."""

DEFAULT_MEMORY_FRACTION = 0.9
"""The default ``max_memory_fraction``: the replay waits once Redis has used 90 % of ``maxmemory``.
Under ``noeviction`` Redis refuses writes (OOM) at the limit, the producers' included; stopping
the replay 10 % below it leaves that room to the producers and consumers, whose writes the
replay must not starve, and keeps the replay's own calls clear of OOM retries."""


def validate_fraction(fraction: float | None) -> None:
    """Raise ``ValueError`` unless ``fraction`` is None (off) or a number with 0 < f <= 1."""
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"max memory fraction must be in (0, 1], got {fraction}")


def fraction_arg(fraction: float | None) -> str:
    """``fraction`` as the publish script's argument: '' when off, else its shortest decimal repr."""
    validate_fraction(fraction)
    return "" if fraction is None else repr(float(fraction))


async def read_memory(client: RedisClient, key: str) -> RedisMemory:
    """Redis's memory settings (``INFO memory`` read by ``lua/memory_status.lua``).

    Args:
        client: an asyncio Redis client.
        key: a key of the slot to ask, e.g. the task stream (on a Redis Cluster, the node holding
            it answers); it is not read.

    Raises:
        redis.exceptions.RedisError: on any Redis fault (NOPERM when the ACL user may not run INFO).
    """
    return RedisMemory.model_validate_json(await run_script(client, "memory_status", [key], []))


def memory_reason(used_memory: int, maxmemory: int, fraction: float) -> str:
    """The reason of a memory wait for the UI.

    For example ``Redis memory 93% of maxmemory (7.4 of 8.0 MiB) >= 90%``.

    Args:
        used_memory, maxmemory: bytes, as the publish script read them (maxmemory > 0).
        fraction: the input's ``max_memory_fraction``.
    """
    mib = 1024 * 1024
    used = used_memory / maxmemory if maxmemory else 0.0
    return (
        f"Redis memory {used:.0%} of maxmemory ({used_memory / mib:,.1f} of {maxmemory / mib:,.1f} MiB)"
        f" >= {fraction * 100:g}%"
    )
