"""What a resumption would do and cost, before it starts: ``xmc plan E`` and ``xmc resume E --dry-run``.

See docs/operating.md, "Plan".

``plan`` reads Redis and asks Temporal, and writes nothing: the held tasks (count, bytes, oldest and
newest entry), every consumer group's backlog on the task stream by the replay's own rule
(``redisclient.backlog``), what the consumers can take and what producers add, sampled over a short
interval (``drain``), the time the replay would take, and every reason the start would be refused or would wait: Redis's
eviction policy, the ACL user's permissions (asked with ``redis.acl_check_cmd``, nothing run), used
memory over ``max_memory_fraction``, a resumption already running in Temporal, a missing stream or
group, a backlog already at the threshold, a rate cap.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from redis.exceptions import ResponseError
from temporalio.client import Client, WorkflowExecutionStatus

from xmc_resumption.drain import GroupReading, bounding_groups, estimate, read_groups, sample_drain
from xmc_resumption.errors import KeyContentError
from xmc_resumption.redisclient import fencing
from xmc_resumption.redisclient.acl import acl_user, allowed_commands, denial_message, is_denial
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.keys import ExperimentKeys, as_text, replayers_key, weights_key
from xmc_resumption.redisclient.memory import read_memory
from xmc_resumption.redisclient.ratecap import DamagedRateCapError, StreamRate, rate_key, stream_rate
from xmc_resumption.redisclient.readings import MissingGroupPolicy, RedisMemory
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.redisclient.text import show_name
from xmc_resumption.runs import live_run
from xmc_resumption.status import state_and_held
from xmc_resumption.workflows.models import ResumptionInput, ThrottlePolicy

MAX_SAMPLE_SECONDS = 60.0
"""The longest drain sample (seconds)."""

DEFAULT_SAMPLE_SECONDS = 2.0
"""The drain sample's default length (seconds)."""

BYTES_READ_LIMIT = 16 * 1024 * 1024
"""Held bytes are counted exactly up to this many bytes read (16 MiB), then estimated from the
average entry: the plan's reads stay bounded on a held stream of any size."""

ENTRIES_READ_LIMIT = 100_000
"""Held entries counted exactly at most; beyond, the bytes are estimated (entries)."""

READ_CHUNK = 1_000
"""Entries per XRANGE of the plan's reads."""


class HeldEntry(BaseModel):
    """A held entry: its stream ID and the time in it (milliseconds part, UTC)."""

    id: str
    time: datetime


class Plan(BaseModel):
    """What ``plan`` found; ``refusals`` empty means ``xmc resume`` would start.

    Attributes:
        experiment_id, stream, consumer_group, threshold, policy: what the plan is for (the input).
        state: the experiment's state (``running``, ``paused``, ``resuming``, ``unknown``).
        held: held tasks (entries); held_bytes: their bytes as XRANGE returns them (IDs, field
            names and values: Redis's memory for them is larger), exact when ``held_bytes_exact``,
            else the average of the first ``ENTRIES_READ_LIMIT`` entries (or 16 MiB) times ``held``.
        oldest, newest: the first and last held entries (None when nothing is held).
        stream_exists: whether the task stream exists; groups: every consumer group on it.
        redis_memory: Redis's memory settings; stream_rate: the stream-wide cap (``{S}:rate``) or None.
        sample_seconds: how long the drain was sampled (seconds; 0: not sampled).
        added_rate: entries producers added to the task stream per second over the sample (None:
            not sampled, or more than ``drain.COUNT_LIMIT``).
        rate: the tasks per second the estimate uses (``drain.estimate``): what the slowest
            bounding group's consumers took while they had a backlog all along, less what producers
            added, bounded under ``fixed`` by ``threshold / throttle_seconds`` (what fixed waits let
            through once the consumers outpace them) and by the rate caps; None when unknown (a
            group that caught up shows only a lower bound of what its consumers can take).
        estimate_seconds: ``max(0, held - headroom) / rate``, at least ``held / cap``
            (``workflows/eta.py``: the ETA's rule), None when unknown.
        at_least_seconds: ``held / cap`` under a rate cap (the lower of the replay's and the
            stream's), whatever the consumers do; else None.
        estimate_basis: how the estimate was made, in words.
        refusals: why ``xmc resume`` (or the run's first steps) would refuse; waits: why the replay
            would wait at its start; notes: anything else worth knowing.
        run: the resumption in Temporal (``runs.live_run``), None when there never was one, or
            ``{"error": ...}`` when Temporal was not asked.
    """

    experiment_id: str
    stream: str
    consumer_group: str
    threshold: int
    policy: ThrottlePolicy
    state: str
    held: int
    held_bytes: int
    held_bytes_exact: bool
    oldest: HeldEntry | None
    newest: HeldEntry | None
    stream_exists: bool
    groups: list[GroupReading]
    redis_memory: RedisMemory | None
    stream_rate: StreamRate | None
    sample_seconds: float
    added_rate: float | None = None
    rate: float | None
    estimate_seconds: float | None
    at_least_seconds: float | None
    estimate_basis: str
    refusals: list[str]
    waits: list[str]
    notes: list[str]
    run: dict[str, Any] | None

    @property
    def startable(self) -> bool:
        """True when nothing would refuse the start."""
        return not self.refusals


def entry_time(entry_id: str) -> datetime:
    """The time in stream entry ID ``<ms>-<seq>`` (UTC)."""
    return datetime.fromtimestamp(int(entry_id.split("-", 1)[0]) / 1000, tz=UTC)


def _entry(raw: Any) -> HeldEntry | None:
    """The entry of a one-entry XRANGE/XREVRANGE reply, None for an empty one."""
    if not raw:
        return None
    entry_id = as_text(raw[0][0])
    return HeldEntry(id=entry_id, time=entry_time(entry_id))


def _entry_bytes(entry: tuple[Any, dict[Any, Any]]) -> int:
    """Bytes of an entry as XRANGE returns it: ID, field names and values (``xmc_entry_bytes`` in backlog.lua)."""
    entry_id, fields = entry
    return len(entry_id) + sum(len(k) + len(v) for k, v in fields.items())


async def held_bytes(redis: RedisClient, key: str, count: int) -> tuple[int, bool]:
    """Bytes of held stream ``key`` of ``count`` entries, as (bytes, exact).

    Read in chunks of ``READ_CHUNK`` up to ``ENTRIES_READ_LIMIT`` entries or ``BYTES_READ_LIMIT`` bytes;
    past them the average entry times ``count``.
    """
    total, seen, start = 0, 0, "-"
    while seen < min(count, ENTRIES_READ_LIMIT) and total < BYTES_READ_LIMIT:
        chunk: list[Any] = await redis.xrange(key, min=start, count=READ_CHUNK) or []
        if not chunk:
            break
        total += sum(_entry_bytes(e) for e in chunk)
        seen += len(chunk)
        start = "(" + as_text(chunk[-1][0])
    if seen >= count:
        return total, True
    return (math.ceil(total / seen * count) if seen else 0), False


def required_commands(keys: ExperimentKeys) -> list[list[str]]:
    """The commands the worker's scripts and the CLI's resume run on an experiment's keys, with those keys.

    ``deploy/redis-acl.conf`` grants them; they are what ``plan`` asks the ACL about.
    """
    s, held = keys.stream, keys.held
    return [
        ["evalsha", "0" * 40, "0"],
        ["get", keys.state],
        ["set", keys.state, "resuming"],
        ["del", keys.state],
        ["incr", keys.fence],
        ["hset", keys.claim, "token", "1"],
        ["pexpire", keys.claim, "1000"],
        ["hset", keys.publish, "seq", "1"],
        ["lpush", keys.acquire_log, "x"],
        ["ltrim", keys.acquire_log, "0", "15"],
        ["hset", keys.replay, "moved", "0"],
        ["lpush", keys.released, "x"],
        ["lrange", keys.released, "0", "-1"],
        ["xadd", s, "*", "f", "v"],
        ["xrange", s, "-", "+", "COUNT", "1"],
        ["xinfo", "groups", s],
        ["xrange", held, "-", "+", "COUNT", "1"],
        ["xdel", held, "0-1"],
        ["xlen", held],
        ["xadd", keys.dead, "*", "f", "v"],
        ["hmget", weights_key(s), "x"],
        ["zadd", replayers_key(s), "1", "x"],
        ["hmget", rate_key(s), "limit"],
        ["hset", rate_key(s), "tokens", "1"],
        ["info", "memory"],
        ["time"],
    ]


async def plan(
    redis: RedisClient,
    inp: ResumptionInput,
    *,
    temporal: Client | None,
    temporal_error: str | None = None,
    sample_seconds: float = DEFAULT_SAMPLE_SECONDS,
    query_timeout: float = 2.5,
) -> Plan:
    """What resuming with input ``inp`` would do, cost and meet; reads only, writes nothing.

    Args:
        redis: a client as the CLI's (its ACL user is the one asked about).
        inp: the resumption's input, as ``xmc resume`` would start it.
        temporal: a Temporal client, or None when it could not be reached (``temporal_error`` says
            why): the plan then cannot tell whether a resumption already runs, and says so.
        sample_seconds: how long to sample the groups' drain (0..``MAX_SAMPLE_SECONDS``; 0: none).
        query_timeout: seconds to wait for a running resumption's ``progress`` query.

    Raises:
        ValueError: ``sample_seconds`` out of bounds.
        redis.exceptions.RedisError: Redis unreachable, or refusing a read for another reason
            than the ACL (an ACL refusal is one of the plan's refusals).
        temporalio.service.RPCError: Temporal fails otherwise than not finding the workflow.
    """
    if not (math.isfinite(sample_seconds) and 0 <= sample_seconds <= MAX_SAMPLE_SECONDS):
        raise ValueError(f"sample_seconds must be 0..{MAX_SAMPLE_SECONDS:g}, got {sample_seconds}")
    keys = ExperimentKeys(inp.stream, inp.experiment_id)
    refusals: list[str] = []
    waits: list[str] = []
    notes: list[str] = []
    user = acl_user(redis)

    def denied(err: ResponseError, doing: str) -> None:
        message = denial_message(err, user, doing)
        if message is None:
            raise err
        refusals.append(message)

    # the ACL: every command the replay runs on these keys, asked without running it
    commands = required_commands(keys)
    try:
        for command, ok in zip(commands, await allowed_commands(redis, keys.stream, commands), strict=True):
            if not ok:
                name = " ".join(command[:2]) if command[0] in ("xinfo", "info") else command[0]
                key = command[2] if command[0] == "xinfo" else command[1] if command[0] not in ("info", "time") else ""
                refusals.append(
                    f"Redis ACL user {user!r} may not run {name.upper()}"
                    + (f" on {key}" if key else "")
                    + " (see deploy/redis-acl.conf)"
                )
    except ResponseError as err:
        denied(err, "asking which commands it may run")

    state, held, held_size, exact = ExperimentState.UNKNOWN.value, 0, 0, True
    oldest = newest = None
    try:
        experiment_state, held = await state_and_held(redis, keys)
        state = experiment_state.value
        held_size, exact = await held_bytes(redis, keys.held, held)
        oldest = _entry(await redis.xrange(keys.held, count=1))
        try:
            newest = _entry(await redis.xrevrange(keys.held, count=1))
        except ResponseError as err:
            if not is_denial(err):
                raise
            notes.append(f"newest held entry unknown: {denial_message(err, user, 'reading it (XREVRANGE)')}")
        claim = await fencing.claim_info(redis, keys)
    except KeyContentError as err:
        refusals.append(f"{err}: the claim would fail on it")
        claim = {}
    except ResponseError as err:
        denied(err, "reading the held tasks")
        claim = {}
    if state == ExperimentState.RUNNING.value and held == 0:
        refusals.append(
            f"experiment {inp.experiment_id} is running and holds no tasks on {inp.stream}: nothing to resume "
            "(xmc resume --force starts the workflow anyway; it ends nothing_held)"
        )
    if claim:
        notes.append(
            f"a live claim (token {claim.get('token')}, owner {show_name(claim.get('owner', ''))}): a new resumption "
            "takes it over and fences that replayer"
        )

    memory: RedisMemory | None = None
    try:
        memory = await read_memory(redis, keys.stream)
        if memory.problem:
            refusals.append(memory.problem)
        fraction = inp.max_memory_fraction
        if fraction is not None and memory.used_fraction is not None and memory.used_fraction >= fraction:
            waits.append(
                f"Redis memory {memory.used_fraction:.0%} of maxmemory >= max_memory_fraction {fraction:g}: "
                f"the replay waits ({inp.throttle_seconds:g}s at a time) until it falls"
            )
    except ResponseError as err:
        denied(err, "reading INFO memory")

    cap_row: StreamRate | None = None
    try:
        cap_row = await stream_rate(redis, inp.stream)
    except DamagedRateCapError as err:
        refusals.append(str(err))  # xmc resume refuses with the same words (XmcClient.check_resumable)
    except ResponseError as err:
        denied(err, "reading the stream's rate cap")
    if cap_row is not None:
        waits.append(f"the stream's rate cap ({cap_row.key}): at most {cap_row.limit:g} tasks/s for all its replays")
    if inp.max_tasks_per_second is not None:
        notes.append(f"this replay's own rate cap: at most {inp.max_tasks_per_second:g} tasks/s")

    groups: list[GroupReading] = []
    added: float | None = None
    stream_exists, measurable = bool(await redis.exists(keys.stream)), True
    if stream_exists:
        try:
            groups = await read_groups(redis, keys.stream, inp.max_backlog_threshold, inp.max_bytes_per_call)
            if sample_seconds > 0 and groups:
                added = await sample_drain(redis, keys.stream, groups, sample_seconds)
        except ResponseError as err:
            if str(err).startswith("WRONGTYPE"):
                measurable = False
                refusals.append(f"{keys.stream} is no stream: the replay cannot measure or publish")
            else:
                denied(err, "reading the consumer groups")
    own = next((g for g in groups if g.group == inp.consumer_group), None)
    if own is None and measurable:
        what = (
            f"the task stream {inp.stream} does not exist"
            if not stream_exists
            else f"consumer group {inp.consumer_group} does not exist on {inp.stream}"
        )
        if inp.missing_group is MissingGroupPolicy.ERROR:
            refusals.append(f"{what}: missing_group 'error' fails the run at its first measurement")
        elif inp.missing_group is MissingGroupPolicy.ZERO:
            notes.append(
                f"{what}: missing_group 'zero' counts the stream's entries as its backlog and moves up to the "
                "threshold into a stream no consumer group reads yet (a group created later at '$' never sees them)"
            )
        else:
            waits.append(f"{what}: the replay waits for it (missing_group '{inp.missing_group}')")
    # the groups that bound the replay, its own first (as the replay measures them: redisclient.backlog)
    bounding = bounding_groups(inp, groups)
    limiting = max(bounding, key=lambda g: g.backlog, default=None)
    if own is not None and limiting is not None and limiting.backlog >= inp.max_backlog_threshold:
        waits.append(
            f"backlog of {show_name(limiting.group)} is {limiting.backlog}{'+' if limiting.capped else ''} >= "
            f"threshold {inp.max_backlog_threshold}: the replay waits for the consumers first"
        )
    notes += [
        f"group {show_name(g.group)} has no consumer: nothing drains what the replay moves"
        if g in bounding
        else f"group {show_name(g.group)} has no consumer: not waited for (name it in consumer_groups to make it count)"
        for g in groups
        if g.consumers == 0
    ]

    run: dict[str, Any] | None
    if temporal is None:
        run = {"error": temporal_error or "Temporal not asked"}
        notes.append(f"whether a resumption already runs is unknown: {run['error']}")
    else:
        run = await live_run(temporal, inp.experiment_id, query_timeout)
        if run is not None and run.get("status") == WorkflowExecutionStatus.RUNNING.name.lower():
            refusals.append(
                f"a resumption is already running: {run['workflow_id']} (run {run['run_id']}); "
                f"xmc status {inp.experiment_id} shows its progress and ETA"
            )

    caps = [c for c in (inp.max_tasks_per_second, cap_row.limit if cap_row else None) if c]
    headroom = max(0, inp.max_backlog_threshold - (limiting.backlog if limiting is not None else 0))
    sampled = sample_seconds if groups else 0.0
    guess = estimate(inp, held, headroom, bounding, added, min(caps) if caps else None, sampled)
    return Plan(
        experiment_id=inp.experiment_id,
        stream=inp.stream,
        consumer_group=inp.consumer_group,
        threshold=inp.max_backlog_threshold,
        policy=inp.throttle_policy,
        state=state,
        held=held,
        held_bytes=held_size,
        held_bytes_exact=exact,
        oldest=oldest,
        newest=newest,
        stream_exists=stream_exists,
        groups=groups,
        redis_memory=memory,
        stream_rate=cap_row,
        sample_seconds=sampled,
        added_rate=added,
        rate=guess.rate,
        estimate_seconds=guess.seconds,
        at_least_seconds=guess.at_least,
        estimate_basis=guess.basis,
        refusals=refusals,
        waits=waits,
        notes=notes,
        run=run,
    )
