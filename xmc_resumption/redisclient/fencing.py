"""Claims, leases and fencing tokens of an experiment's resumption.

A claim is the right to replay an experiment's held tasks. Taking it issues a new fencing token
on ``{S}:experiment:E:fence``: the larger of the counter plus one (``INCR``) and a floor from
Redis's clock (``TIME`` in microseconds, times 1,000), so the newest claim wins, and a token handed
out after Redis lost the counter's last increments (a crash failover to a replica that never got
them) is still above every token handed out before (``lua/tokens.lua``; docs/contract.md,
"Fencing tokens"). Every write re-checks its token against that counter inside the same Lua script
as the write (Kleppmann, "How to do distributed locking": the resource itself rejects stale tokens).
Releasing a claim bumps the counter too, so a released token is dead. The claim hash carries the
token, the owner and a lease (``PEXPIRE``, milliseconds) that the replay extends on every turn.
The fence counter, not the lease, decides who may publish: a lease that lapsed while a worker was
down is re-established for the current token instead of stranding the held tasks. What the lease
tells is liveness: an experiment ``resuming`` with no claim has no live replayer (``xmc status``
reports it as orphaned).
"""

from __future__ import annotations

import re
import uuid

from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.failover import validate_entry_id
from xmc_resumption.redisclient.keys import ExperimentKeys, as_text, replayers_key
from xmc_resumption.redisclient.results import ClaimCheck, ClaimGrant, Release
from xmc_resumption.redisclient.scripts import run_script

MAX_LEASE_MS = 7 * 86_400 * 1_000
"""The longest claim lease (milliseconds): a week, ``ResumptionInput.claim_lease_seconds``'s bound.
``lua/fair.lua`` holds the same number (``XMC_MAX_LEASE_MS``): a fair-share lease end further
ahead than this was never written by a replay, so it does not count (tests/test_scale.py checks
that the two agree)."""


def validate_lease(lease_ms: int) -> None:
    """Raise ``ValueError`` unless the lease (milliseconds) is an integer 1..``MAX_LEASE_MS``."""
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or not 1 <= lease_ms <= MAX_LEASE_MS:
        raise ValueError(f"lease must be an integer of 1..{MAX_LEASE_MS} ms, got {lease_ms!r}")


async def acquire_claim(
    client: RedisClient,
    keys: ExperimentKeys,
    owner: str,
    lease_ms: int,
    request_id: str | None = None,
    *,
    moved_through: str = "",
) -> ClaimGrant:
    """Take the claim: a new fencing token, and the experiment moves ``paused`` -> ``resuming``.

    Also when its state key is gone but tasks are still held.

    Args:
        client: an asyncio Redis client.
        keys: the experiment's keys.
        owner: who holds the claim (e.g. the workflow ID), stored for operators.
        lease_ms: the claim hash's time to live in milliseconds.
        request_id: idempotency key; the same ID returns the same token without a new claim (the
            last 16 IDs are kept). None draws a fresh one: every call is a new claim.
        moved_through: the last held entry ID the caller was told a resumption of the experiment
            moved ('' for none): held entries at or below it are counted in ``held_again``
            (``redisclient.failover``).

    Returns:
        The token (above every token handed out before), the state after the claim, the held
        tasks (entries), the tasks the resume moved so far (``replayed``: 0 when this claim starts
        the resume, the count so far when it takes over a resume in progress; ``redelivered``: of
        those, moved again) and ``held_again``.

    Raises:
        ValueError: lease_ms < 1; a ``moved_through`` that is no entry ID.
        redis.exceptions.RedisError: on any Redis fault; a ``ResponseError`` starting
            ``XMCEVICTION`` when ``maxmemory-policy`` is not ``noeviction`` (nothing changed;
            ``redisclient.memory``).
    """
    validate_lease(lease_ms)
    validate_entry_id("moved_through", moved_through)
    raw = await run_script(
        client,
        "acquire",
        [keys.fence, keys.claim, keys.state, keys.held, keys.publish, keys.acquire_log, keys.replay],
        [owner, lease_ms, request_id or uuid.uuid4().hex, moved_through],
    )
    return ClaimGrant.model_validate_json(raw)


async def check_claim(client: RedisClient, keys: ExperimentKeys, token: int, owner: str, lease_ms: int) -> ClaimCheck:
    """Check the pause state and the fencing token, and extend the claim's lease to ``lease_ms``.

    Returns:
        ``fenced=True`` when a newer token was issued (nothing is extended then), with
        ``released`` set when that token was this one's own release (its record); else the
        state, the held tasks (entries) and whether a lapsed lease was re-established.

    Raises:
        ValueError: lease_ms < 1.
        redis.exceptions.RedisError: on any Redis fault.
    """
    validate_lease(lease_ms)
    script_keys = [keys.fence, keys.claim, keys.state, keys.held, keys.released, keys.replay]
    raw = await run_script(client, "check", script_keys, [token, owner, lease_ms])
    return ClaimCheck.model_validate_json(raw)


async def release_claim(
    client: RedisClient,
    keys: ExperimentKeys,
    token: int,
    *,
    owner: str = "",
    back_to_paused: bool,
    outcome: str = "",
) -> Release:
    """Release the claim and revoke its token, if the token is still current, and record the release.

    The script is ``lua/release.lua``.

    The fence counter is bumped, so the released token is fenced from then on: a zombie attempt of
    the released run can publish nothing. The release log keeps the last 16 releases with their
    outcome, the resume's count and the held tasks left, so a re-executed turn of the released run
    reports its own release, and a second release of the same token returns the first's record
    (``repeated``). Once the experiment is no longer ``resuming``, the resume's count is dropped.

    Args:
        token: the claim's token; 0 when the caller never learnt it (a run cancelled before the
            reply of its acquire was recorded): then the claim is released if ``owner`` holds it.
        owner: the claim's owner, used when ``token`` is 0.
        back_to_paused: also move a ``resuming`` experiment back to ``paused`` (a cancelled
            replay: producers keep holding tasks, and the next start resumes them in order).
        outcome: the outcome the caller ends with, recorded with the release (0..32 of a-z and
            ``_``; '' records ``released``).

    Returns:
        The released token (0 when nothing was released: a newer claim owns the experiment), the
        outcome, the resume's count and the held tasks left.

    Raises:
        ValueError: an outcome that breaks its rule.
        redis.exceptions.RedisError: on any Redis fault.
    """
    if not _OUTCOME.fullmatch(outcome):
        raise ValueError(f"outcome must be 0..32 of a-z and _, got {outcome[:40]!r}")
    raw = await run_script(
        client,
        "release",
        [keys.fence, keys.claim, keys.state, keys.publish, replayers_key(keys.stream), keys.replay, keys.released,
         keys.held],
        [token, owner, "1" if back_to_paused else "0", keys.experiment_id, outcome],
    )  # fmt: skip
    return Release.model_validate_json(raw)


_OUTCOME = re.compile(r"[a-z_]{0,32}")


MAX_TOKEN = 2**63 - 1
"""The largest fencing token: Redis's ``INCR`` limit (a signed 64-bit integer)."""

_TOKEN = re.compile(r"0|[1-9][0-9]{0,18}")


def parse_token(raw: bytes | str | None, key: str = "the fence counter") -> int:
    """The fencing token a fence counter holds (GET's reply), as an integer: 0 when absent.

    Tokens are integers and compare as integers everywhere (token 9 is older than 10, in Lua and in
    Python): the rule of ``lua/tokens.lua``'s ``xmc_fence``, a canonical decimal of at most 19
    digits, up to ``MAX_TOKEN``.

    Raises:
        ValueError: anything else (a negative number, text, a leading zero), naming ``key`` and
            the value.
    """
    if raw is None:
        return 0
    text = as_text(raw)
    if not _TOKEN.fullmatch(text) or int(text) > MAX_TOKEN:
        raise ValueError(f"{key} holds {text[:40]!r}, not a fencing token (a non-negative integer)")
    return int(text)


async def current_token(client: RedisClient, keys: ExperimentKeys) -> int:
    """The last fencing token issued for the experiment (0 when none).

    Raises:
        ValueError: the fence counter holds no token (``parse_token``).
    """
    return parse_token(await client.get(keys.fence), keys.fence)


async def claim_info(client: RedisClient, keys: ExperimentKeys) -> dict[str, str]:
    """The claim hash as text (``token``, ``owner``) plus ``lease_ms`` left; {} when none."""
    raw = await client.hgetall(keys.claim)
    if not raw:
        return {}
    info = {as_text(k): as_text(v) for k, v in raw.items()}
    info["lease_ms"] = str(await client.pttl(keys.claim))
    return info
