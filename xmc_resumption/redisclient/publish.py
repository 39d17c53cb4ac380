"""The atomic publish: move held tasks into the task stream (docs/contract.md, "The loop", step 2).

One Lua script (``lua/publish.lua``) checks the fencing token, the call's sequence number and the
pause state, measures the backlog with the shared rule, and moves at most
``min(batch, threshold - backlog)`` of the oldest held entries, and about a byte budget of them,
to the task stream (XADD with the field map byte for byte, then XDEL) in one step. Redis runs a
script atomically, so a retried or zombie call can never duplicate, lose or overshoot: a repeated
``seq`` returns the recorded result, an older one moves nothing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from xmc_resumption.redisclient.backlog import DEFAULT_BYTE_BUDGET, groups_arg, validate_byte_budget, validate_threshold
from xmc_resumption.redisclient.connection import RedisClient, drop_stale_connections
from xmc_resumption.redisclient.errors import MissingConsumerGroupError
from xmc_resumption.redisclient.failover import later_id, validate_entry_id
from xmc_resumption.redisclient.fencing import validate_lease
from xmc_resumption.redisclient.keys import ExperimentKeys, backlog_key, json_reply, replayers_key, weights_key
from xmc_resumption.redisclient.memory import fraction_arg, validate_fraction
from xmc_resumption.redisclient.ratecap import rate_key
from xmc_resumption.redisclient.readings import MissingGroupPolicy
from xmc_resumption.redisclient.results import PublishResult, PublishRounds, PublishStatus
from xmc_resumption.redisclient.scripts import run_script

log = logging.getLogger(__name__)

MAX_ROUNDS = 10_000
"""The most publish scripts one ``publish_rounds`` call runs (each bounded by its batch and the byte budget)."""

MAX_ROUNDS_SECONDS = 60.0
"""The longest time bound one ``publish_rounds`` call takes (seconds)."""

SCRIPT_TASKS = 2_000
"""The most tasks one script of ``publish_rounds`` moves, whatever the batch (entries): a script of 2,000 small
tasks costs Redis 22-28 ms of CPU, one of 5,000 up to 50-70 ms, past the 50 ms a script may block Redis
(docs/memory.md, "Blocking"); a larger batch runs more scripts in the same call. Each script has a fixed cost
besides its tasks, so 2,000 rather than 1,000 (docs/benchmarks.md, "Large batches (issue 25 item 3)")."""


class PublishParams(BaseModel):
    """The parameters of a publish call: ``lua/publish.lua``'s ARGV besides keys and groups, and its rounds' bounds.

    Built once per publish from the run's state (``RunState.publish_params``), carried whole in the activity's request,
    and turned into the script's ARGV in one place (``argv``). Checked when built, so nothing out of bounds is sent.

    Attributes:
        token: the caller's fencing token (>= 1).
        seq: the first script's turn number (>= 1), strictly increasing per token: the idempotency key; the rounds use
            ``seq .. seq + scripts - 1``.
        batch_size: the most entries one script moves (>= 1).
        threshold: the backlog bound in entries (1..``MAX_THRESHOLD``); a move never takes the backlog past it.
        owner: the claim's owner, stored when the claim hash is written.
        lease_ms: the claim's lease, extended by a successful script (milliseconds, 1..``MAX_LEASE_MS``).
        missing_group: a missing stream or required group moves nothing (``wait``: status ``waiting_for_group``),
            counts the stream's entries as its backlog (``zero``: at most the threshold goes in), or refuses
            (``error``).
        max_bytes: the backlog count and the move each read about this many bytes at most (1..``MAX_BYTE_BUDGET``):
            the move stops once the tasks moved reach it (at least one task moves), so a batch of large tasks takes
            several scripts instead of blocking Redis (``status`` stays ``published``, with headroom left).
        max_memory_fraction: with headroom left, nothing moves while Redis's used memory is at or above this fraction
            of ``maxmemory`` (status ``memory``); None, or no ``maxmemory`` set, never (0 < f <= 1;
            ``redisclient.memory``).
        fair_share: move at most this experiment's share of the headroom among the active fair-share replayers of
            the stream, weighted (``redisclient.weights``, ``lua/fair.lua``); the result's ``headroom`` is then that
            share, and one ``publish_rounds`` call takes one share.
        max_tasks: the most tasks all the rounds' scripts together move (entries, >= 1), or None: no bound besides the
            headroom (a replay's own rate cap passes what its bucket allows).
        max_scripts: the most scripts one ``publish_rounds`` call runs (1..``MAX_ROUNDS``).
        max_seconds: no script of ``publish_rounds`` starts once this many seconds have passed since the first began
            (0..``MAX_ROUNDS_SECONDS``, finite); the first always runs.
        moved_through: the last held entry ID the caller was told was moved (the replies' ``last_moved_id``, of this
            resumption or one before it that the caller knows of; '' for none): a task at or below it is moved again
            marked, and counted in ``redelivered`` (``redisclient.failover``). Every script of the rounds takes the
            same: the tasks each moves come after the last one's.
        replayed: the resume's count the caller was last told (the replies' ``replayed``; None for none, else
            0..2^53): a replay record below it is reported as ``behind``.

    Raises (when built):
        pydantic.ValidationError: a ``ValueError`` naming the field that is out of its bounds.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    token: int = Field(ge=1)
    seq: int
    batch_size: int
    threshold: int
    owner: str = Field(min_length=1)
    lease_ms: int
    missing_group: MissingGroupPolicy = MissingGroupPolicy.WAIT
    max_bytes: int = DEFAULT_BYTE_BUDGET
    max_memory_fraction: float | None = None
    fair_share: bool = False
    max_tasks: int | None = None
    max_scripts: int = 1
    max_seconds: float = 0.0
    moved_through: str = ""
    replayed: int | None = None

    @field_validator("moved_through")
    @classmethod
    def _moved_through(cls, value: str) -> str:
        validate_entry_id("moved_through", value)
        return value

    @field_validator("replayed")
    @classmethod
    def _replayed(cls, value: int | None) -> int | None:
        if value is not None and not 0 <= value <= 2**53:
            raise ValueError(f"replayed must be 0..2^53 or None, got {value}")
        return value

    @field_validator("seq")
    @classmethod
    def _seq(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"seq must be >= 1, got {value}")
        return value

    @field_validator("batch_size")
    @classmethod
    def _batch(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"batch_size must be >= 1 entry, got {value}")
        return value

    @field_validator("max_tasks")
    @classmethod
    def _max_tasks(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"max_tasks must be >= 1 entry or None, got {value}")
        return value

    @field_validator("max_scripts")
    @classmethod
    def _max_scripts(cls, value: int) -> int:
        if not 1 <= value <= MAX_ROUNDS:
            raise ValueError(f"max_scripts must be 1..{MAX_ROUNDS:,}, got {value}")
        return value

    @field_validator("max_seconds")
    @classmethod
    def _max_seconds(cls, value: float) -> float:
        if not (math.isfinite(value) and 0 <= value <= MAX_ROUNDS_SECONDS):
            raise ValueError(f"max_seconds must be finite, 0..{MAX_ROUNDS_SECONDS:g}, got {value}")
        return value

    @field_validator("threshold")
    @classmethod
    def _threshold(cls, value: int) -> int:
        validate_threshold(value)
        return value

    @field_validator("lease_ms", mode="before")
    @classmethod
    def _lease(cls, value: int) -> int:
        validate_lease(value)
        return value

    @field_validator("max_bytes")
    @classmethod
    def _max_bytes(cls, value: int) -> int:
        validate_byte_budget(value)
        return value

    @field_validator("max_memory_fraction")
    @classmethod
    def _fraction(cls, value: float | None) -> float | None:
        validate_fraction(value)
        return value

    def argv(self, keys: ExperimentKeys, group: str, groups: Sequence[str] | None) -> list[str | int]:
        """``lua/publish.lua``'s ARGV for one script of these parameters, as its header lists them.

        Raises:
            ValueError: ``group`` or ``groups`` break the name rule (``redisclient.backlog.validate_groups``).
        """
        spec = groups_arg(group, groups)
        return [self.token, self.seq, self.batch_size, self.threshold, group, self.missing_group.value,
                self.lease_ms, self.owner, self.max_bytes, fraction_arg(self.max_memory_fraction),
                "1" if self.fair_share else "0", keys.experiment_id, spec, self.moved_through,
                "" if self.replayed is None else self.replayed]  # fmt: skip


async def publish_batch(
    client: RedisClient,
    keys: ExperimentKeys,
    group: str,
    params: PublishParams,
    groups: Sequence[str] | None = None,
) -> PublishResult:
    """Move up to ``min(params.batch_size, threshold - backlog)`` held tasks into the task stream: one script.

    The backlog is the largest among the groups measured (``redisclient.backlog``). The stream-wide rate cap
    (``{S}:rate``, ``redisclient.ratecap``), when set, bounds the move too: at most the whole tokens its bucket holds
    move (status ``rate_limited`` when none, with ``rate_wait_ms``), and what moved is taken from the bucket in the
    same step. The rounds' bounds of ``params`` (``max_tasks``, ``max_scripts``, ``max_seconds``) are
    ``publish_rounds``'s.

    Args:
        client: an asyncio Redis client.
        keys: the experiment's keys; the task stream is ``keys.stream``.
        group: the consumer group that must exist; its backlog bounds the move.
        params: the script's token, seq, batch, threshold and settings (``PublishParams``).
        groups: the groups whose backlog bounds the move, ``group`` among them, each required to exist; None: every
            group of the stream (``redisclient.backlog.measure_backlog``).

    Returns:
        What the script did (see ``PublishStatus``); ``completed`` means the held stream is empty
        and the experiment is running again.

    Raises:
        ValueError: a group name or groups list out of bounds.
        MissingConsumerGroupError: a required group (or the stream) is missing and the policy is
            ``error``.
        redis.exceptions.RedisError: on any Redis fault (e.g. WRONGTYPE on the task stream); a
            ``ResponseError`` starting ``XMCEVICTION`` when ``maxmemory-policy`` is not
            ``noeviction`` (nothing moved); one starting ``XMCCORRUPT`` when ``{S}:rate`` holds
            no valid cap (nothing moved).
    """
    raw = await run_script(
        client,
        "publish",
        [keys.stream, keys.held, keys.state, keys.fence, keys.claim, keys.publish,
         weights_key(keys.stream), replayers_key(keys.stream), rate_key(keys.stream), keys.replay, keys.released,
         backlog_key(keys.stream)],
        params.argv(keys, group, groups),
    )  # fmt: skip
    # the reply is flat (the publish record keeps it so); the reading takes the call's threshold
    result = PublishResult.model_validate({**json_reply(raw), "threshold": params.threshold})
    if result.status is PublishStatus.NO_GROUP:
        raise MissingConsumerGroupError(keys.stream, result.reading.missing_group or group)
    return result


async def publish_rounds(
    client: RedisClient,
    keys: ExperimentKeys,
    group: str,
    params: PublishParams,
    groups: Sequence[str] | None = None,
) -> PublishRounds:
    """Publish in rounds of ``publish_batch`` while headroom is left: one call, several scripts.

    Script ``i`` (from 0) takes seq ``params.seq + i`` and moves at most ``min(params.batch_size,
    SCRIPT_TASKS)`` tasks, so each script blocks Redis no longer than one ``publish_batch`` of at
    most ``SCRIPT_TASKS`` (its batch and byte budget bound it), and other clients run between two of
    them. The next script runs only while the last one
    ``published`` and left headroom (``headroom_left``), set nothing aside, was not cut short by
    the stream's rate cap, fewer than ``max_tasks`` moved in all (with ``fair_share``, fewer than
    the first script's share: one call takes one share), fewer than ``max_scripts`` ran and
    ``max_seconds`` have not passed since the first began. A fault after at least one script
    answered ends the rounds with what answered (the pool's stale connections dropped first): the
    caller's next seq is that of the failed script, which returns its recorded result if it ran
    in Redis after all. A call asked again after its reply was lost (its first seq is older than
    the record's, within ``max_scripts``) returns the recorded result of the script it ran last,
    and runs no more; its ``last_moved_id`` is still the latest the lost call moved (every reply
    carries the publish record's).

    Args:
        client: an asyncio Redis client.
        keys: the experiment's keys; the task stream is ``keys.stream``.
        group: the consumer group that must exist; its backlog bounds the move.
        params: the call's parameters and its rounds' bounds (``PublishParams``).
        groups: the groups whose backlog bounds the move, as ``publish_batch``.

    Returns:
        ``PublishRounds``: the first script's result and the last's, the scripts run and the
        tasks they moved.

    Raises:
        ValueError, MissingConsumerGroupError, redis.exceptions.RedisError: as ``publish_batch``, from the
            first script (a later one's fault ends the rounds instead).
    """
    seq, max_tasks, max_scripts = params.seq, params.max_tasks, params.max_scripts
    results: list[PublishResult] = []
    moved = moved_bytes = fresh = fresh_redelivered = 0
    last_moved_id = ""
    next_seq, started = seq, time.monotonic()

    async def script(seq: int, batch: int) -> PublishResult:
        return await publish_batch(
            client, keys, group, params.model_copy(update={"seq": seq, "batch_size": batch}), groups
        )

    while True:
        batch = min(params.batch_size, SCRIPT_TASKS)
        batch = batch if max_tasks is None else min(batch, max_tasks - moved)
        try:
            result = await script(next_seq, batch)
            if not results and result.status is PublishStatus.STALE and seq < result.last_seq < seq + max_scripts:
                # this call ran before and its reply was lost (a retry): the recorded result of its last script,
                # and no more scripts (what that call moved is Redis's count: ``replayed``, ``total_moved``)
                next_seq, stale_id = result.last_seq, result.last_moved_id
                result = await script(next_seq, batch)
                results.append(result)
                moved += result.moved
                moved_bytes += result.moved_bytes
                last_moved_id = later_id(stale_id, result.last_moved_id)
                break
        except Exception as err:  # (a cancel is no Exception: it propagates)
            if not results:
                raise
            await drop_stale_connections(client, err)
            log.warning(
                "publish rounds ended early by a fault; the next publish asks its seq again",
                extra={"stream": keys.stream, "experiment_id": keys.experiment_id, "seq": next_seq,
                       "scripts": len(results), "error": f"{type(err).__name__}: {err}"},
            )  # fmt: skip
            next_seq -= 1
            break
        results.append(result)
        moved += result.moved
        moved_bytes += result.moved_bytes
        fresh += 0 if result.repeated else result.moved
        fresh_redelivered += 0 if result.repeated else result.redelivered
        last_moved_id = later_id(last_moved_id, result.last_moved_id)
        if (
            result.status is not PublishStatus.PUBLISHED
            or result.headroom_left == 0
            or result.poison_id
            or result.rate_limited
            or (max_tasks is not None and moved >= max_tasks)
            # with the fair share on, a script's headroom is the caller's share: one call takes one share
            or (params.fair_share and moved >= results[0].reading.headroom)
            or next_seq - seq + 1 >= max_scripts
            or time.monotonic() - started >= params.max_seconds
        ):
            break
        next_seq += 1
    return PublishRounds(
        first=results[0],
        last=results[-1] if len(results) > 1 else None,
        scripts=next_seq - seq + 1,
        moved=moved,
        moved_bytes=moved_bytes,
        fresh_moved=fresh,
        fresh_redelivered=fresh_redelivered,
        last_moved_id=last_moved_id,
        seconds=time.monotonic() - started,
    )
