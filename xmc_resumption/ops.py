"""Operator actions shared by the CLI and the demo.

Status of an experiment, the experiments held in Redis, starting a resumption, the fleet of
resumptions in Temporal visibility, and the control Updates of a running one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from redis.exceptions import ResponseError
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from xmc_resumption.errors import KeyContentError, OperatorError, update_failure_message
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.acl import acl_user, denial_message
from xmc_resumption.redisclient.backlog import measure_backlog
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.consumers import idle_consumers
from xmc_resumption.redisclient.keys import ExperimentKeys, as_text, validate_name
from xmc_resumption.redisclient.memory import read_memory
from xmc_resumption.redisclient.results import ExperimentState, GroupStatus
from xmc_resumption.redisclient.text import one_line
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.control import Control, EffectiveSettings
from xmc_resumption.workflows.models import WORKFLOW_TYPE, Progress, ResumptionInput, ResumptionResult, workflow_id_for
from xmc_resumption.workflows.resumption import ResumptionWorkflow

T = TypeVar("T")

MAX_SHOWN_VALUE_CHARS = 40
"""Longest part of a garbage key's value an error message quotes."""


async def _read_key(redis: RedisClient, key: str, expected: str, read: Awaitable[T], *, parses: bool = False) -> T:
    """Await ``read`` of ``key``, turning content the contract does not allow into ``KeyContentError``.

    A key of the wrong type (WRONGTYPE), or for a read that ``parses`` the value a ``ValueError``,
    becomes ``KeyContentError`` naming the key, what it holds and what the contract expects
    (``expected``).
    """
    try:
        return await read
    except ResponseError as err:
        if not str(err).startswith("WRONGTYPE"):
            raise
        kind = as_text(await redis.type(key))
        raise KeyContentError(f"key {key} is a {kind}, expected {expected}") from err
    except ValueError as err:
        if not parses:
            raise
        raw = as_text(await redis.get(key) or b"")
        shown = repr(raw[:MAX_SHOWN_VALUE_CHARS]) + ("..." if len(raw) > MAX_SHOWN_VALUE_CHARS else "")
        raise KeyContentError(f"key {key} holds {shown}, expected {expected}") from err


async def state_and_held(redis: RedisClient, keys: ExperimentKeys) -> tuple[ExperimentState, int]:
    """The experiment's state and its held tasks (entries).

    A state value the contract does not know is ``unknown``, not an error: producers hold their
    tasks behind it and the next claim normalizes it (``lua/tokens.lua``).

    Raises:
        KeyContentError: the state or held key holds the wrong type.
    """
    state = await _read_key(
        redis, keys.state, "a string: paused, resuming (absent: running)", held.get_state(redis, keys)
    )
    return state, await _read_key(redis, keys.held, "a stream (the held tasks)", held.held_count(redis, keys))


async def has_keys(redis: RedisClient, keys: ExperimentKeys) -> bool:
    """True when any key of the experiment exists; False for an experiment never paused nor resumed on this stream.

    The keys: state, held, claim, fence, publish record, acquire log, replay record, release log, dead
    letters.
    """
    every = (
        keys.state, keys.held, keys.claim, keys.fence, keys.publish, keys.acquire_log, keys.replay, keys.released,
        keys.dead,
    )  # fmt: skip
    return bool(await redis.exists(*every))


DEFAULT_IDLE_SECONDS = 60.0
"""``xmc status`` names the consumers that hold pending entries while idle for this long (seconds)."""


async def experiment_status(
    redis: RedisClient,
    keys: ExperimentKeys,
    group: str,
    threshold: int,
    groups: Sequence[str] | None = None,
    idle_seconds: float = DEFAULT_IDLE_SECONDS,
) -> dict[str, object]:
    """The status of an experiment as a dict.

    State, held tasks (entries), claim, last fencing token, the consumer groups' backlog and the idle
    consumers holding pending entries.

    ``backlog`` is the reading of the groups that bound a replay (``groups``, or every group of the
    stream when None; ``group`` must exist): the largest backlog, the group that has it
    (``limiting_group``), the first missing group (``missing_group``) and ``groups``, each group's
    part. ``idle_consumers`` lists the consumers of those groups holding pending entries while idle
    for at least ``idle_seconds`` (``XINFO CONSUMERS``; ``redisclient.consumers``), the most
    pending first.

    An experiment with no key at all on this stream has state ``unknown`` and ``exists`` False:
    it was never paused nor resumed here (a typo, or another ``--stream``), which an absent state
    key alone (``running``) cannot tell.

    ``orphaned`` is True for an experiment that is resuming with no live claim: its replayer is
    gone (a failed or terminated run whose lease lapsed) and producers are still holding its tasks;
    starting a resumption again continues the replay in order. ``redis_memory`` is Redis's
    ``maxmemory-policy``, used memory and ``maxmemory`` (bytes, 0: no limit) and ``problem``, why a
    resumption would refuse this Redis (None under ``noeviction``; ``redisclient.memory``).

    Each part is read on its own: a part that cannot be read (a key of the wrong type or holding
    garbage, a command the ACL user may not run) is None, and ``unknown`` maps its name to the
    one-line reason; the other parts are still shown. (``state`` stands for the state and the held
    tasks, ``orphaned`` is None when the state or the claim is unknown.)

    Raises:
        redis.exceptions.RedisError: a fault that is not one part's (Redis unreachable, a timeout).
    """
    unknown: dict[str, str] = {}

    async def part(name: str, read: Awaitable[T]) -> T | None:
        try:
            return await read
        except KeyContentError as err:
            unknown[name] = str(err)
        except ResponseError as err:
            # only this part's: a refused command or key, a key of the wrong type, a script's
            # refusal of what a key holds (XMC...); any other reply (no such database, OOM,
            # LOADING) is the whole Redis's and fails the command
            denied = denial_message(err, acl_user(redis), f"reading {name}")
            if denied is None and not str(err).startswith(("WRONGTYPE", "XMC")):
                raise
            unknown[name] = denied or one_line(str(err))
        return None

    reading = await part(
        "backlog",
        _read_key(
            redis,
            keys.stream,
            "a stream (the task stream)",
            measure_backlog(redis, keys.stream, group, threshold, groups=groups),
        ),
    )
    present = [g.name for g in reading.groups if not g.missing] if reading is not None else []
    idle_ms = round(idle_seconds * 1000)
    idle = await part("idle_consumers", idle_consumers(redis, keys.stream, present, idle_ms)) if present else []
    state_held = await part("state", state_and_held(redis, keys))
    claim = await part("claim", _read_key(redis, keys.claim, "a hash (token, owner)", fencing.claim_info(redis, keys)))
    fence = await part(
        "fence",
        _read_key(redis, keys.fence, "an integer (the fencing token)", fencing.current_token(redis, keys), parses=True),
    )
    exists = await part("exists", has_keys(redis, keys))
    set_aside = await part(
        "set_aside", _read_key(redis, keys.dead, "a stream (the set-aside tasks)", redis.xlen(keys.dead))
    )
    memory = await part("redis_memory", read_memory(redis, keys.stream))
    state, held_tasks = state_held if state_held is not None else (None, None)
    doc: dict[str, object] = {
        "experiment_id": keys.experiment_id,
        "stream": keys.stream,
        "exists": exists,
        "state": state.value if state is not None and exists is not False else ExperimentState.UNKNOWN.value,
        "orphaned": None if state is None or claim is None else state is ExperimentState.RESUMING and not claim,
        "held": held_tasks,
        "claim": claim,
        "fence": fence,
        "set_aside": set_aside,
        "backlog": None
        if reading is None
        else {
            "group": group,
            "limiting_group": reading.limiting_group,
            "pending": reading.pending,
            "lag": reading.lag,
            "capped": reading.capped,
            "status": reading.status.value,
            "missing_group": reading.missing_group if reading.status is not GroupStatus.OK else None,
            "threshold": threshold,
            "groups": [g.model_dump() for g in reading.groups],
        },
        "idle_consumers": [c.model_dump() for c in idle] if idle is not None else None,
        "redis_memory": memory.model_dump() if memory is not None else None,
    }
    if unknown:
        doc["unknown"] = unknown
    return doc


async def refuse_evicting_redis(redis: RedisClient, keys: ExperimentKeys) -> None:
    """Refuse, before anything starts, a Redis whose ``maxmemory-policy`` could evict the replay's keys.

    Such a resumption would fail at its claim (``redisclient.memory``).

    Raises:
        OperatorError: the policy is not ``noeviction``; the message names it.
    """
    memory = await read_memory(redis, keys.stream)
    if memory.problem:
        raise OperatorError(memory.problem)


async def start_resumption(
    client: Client, inp: ResumptionInput, task_queue: str
) -> WorkflowHandle[ResumptionWorkflow, ResumptionResult]:
    """Start ``ResumptionWorkflow`` with the conventional ID ``resumption-<E>``, without any check.

    ``xmc_resumption.client.XmcClient.resume`` makes ``xmc resume``'s checks first, then calls this.

    Raises:
        temporalio.exceptions.WorkflowAlreadyStartedError: a resumption of this experiment runs.
    """
    return await client.start_workflow(ResumptionWorkflow.run, inp, **inp.start_options(task_queue))


SCAN_COUNT = 1_000
"""``SCAN ... COUNT`` hint: keys Redis looks at per call (bounded work per round trip)."""

MAX_LISTED = 100_000
"""The most experiments or runs one listing returns."""


async def held_experiments(redis: RedisClient, stream: str, limit: int) -> tuple[list[dict[str, object]], bool]:
    """Every experiment on ``stream`` that Redis holds something for, sorted by experiment ID.

    An experiment counts when it has a state key (paused, resuming, or a value the contract does not
    know) or held tasks, found by ``SCAN MATCH`` on ``{S}:experiment:*:state`` and
    ``{S}:experiment:*:held`` (never ``KEYS``: it blocks Redis).

    Each row: ``experiment_id``, ``state``, ``held`` (entries), ``claim`` (owner, token, lease
    left; {} when none) and ``condition``: ``paused``; ``orphaned`` (resuming with no live claim:
    its replayer is gone, producers still hold; start a resumption again); ``resuming`` (a live
    claim: a replay runs); ``unknown`` (a state value the contract does not know); ``stranded``
    (no state key, so producers no longer hold, but tasks are held: a resume replays them); or
    ``bad_keys`` with ``error`` naming a key of the wrong type. Sorted by experiment ID.

    Args:
        stream: the task stream ``S``; checked by ``validate_name``, whose characters hold no glob
            character, so the pattern matches this stream's keys only.
        limit: the most experiments returned (1..``MAX_LISTED``).

    Returns:
        (rows, truncated): truncated is True when more experiments than ``limit`` were found.

    Raises:
        ValueError: a bad stream name or limit.
    """
    validate_name("stream", stream)
    if not 1 <= limit <= MAX_LISTED:
        raise ValueError(f"limit must be 1..{MAX_LISTED}, got {limit}")
    prefix = f"{{{stream}}}:experiment:"
    found: set[str] = set()
    for suffix in (":state", ":held"):
        async for raw in redis.scan_iter(match=f"{prefix}*{suffix}", count=SCAN_COUNT):
            experiment_id = as_text(raw)[len(prefix) : -len(suffix)]
            try:
                found.add(validate_name("experiment_id", experiment_id))
            except ValueError:
                continue  # not a key this project wrote
    ids = sorted(found)
    rows = [await _held_row(redis, ExperimentKeys(stream, e)) for e in ids[:limit]]
    return [row for row in rows if row["condition"] is not None], len(ids) > limit


async def _held_row(redis: RedisClient, keys: ExperimentKeys) -> dict[str, object]:
    """One row of ``held_experiments``; ``condition`` None for a running experiment holding nothing."""
    row: dict[str, object] = {"experiment_id": keys.experiment_id}
    try:
        state, held_tasks = await state_and_held(redis, keys)
        claim = await _read_key(redis, keys.claim, "a hash (token, owner)", fencing.claim_info(redis, keys))
    except KeyContentError as err:
        return {**row, "state": None, "held": None, "claim": {}, "condition": "bad_keys", "error": str(err)}
    condition: str | None
    if state is ExperimentState.RESUMING:
        condition = "resuming" if claim else "orphaned"
    elif state is ExperimentState.RUNNING:
        condition = "stranded" if held_tasks else None
    else:
        condition = state.value  # paused, unknown
    return {**row, "state": state.value, "held": held_tasks, "claim": claim, "condition": condition}


FLEET_COLUMNS: dict[str, Any] = {
    "experiment_id": fleet.EXPERIMENT_ID,
    "stream": fleet.STREAM,
    "phase": fleet.PHASE,
    "replayed": fleet.REPLAYED,
    "remaining": fleet.REMAINING,
    "outcome": fleet.OUTCOME,
}
"""The fleet view's columns and the search attributes they come from (``workflows/fleet.py``)."""


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="seconds") if moment else None


def fleet_row(
    workflow_id: str,
    run_id: str | None,
    status: WorkflowExecutionStatus | None,
    attributes: TypedSearchAttributes,
    start_time: datetime | None,
    close_time: datetime | None,
) -> dict[str, object]:
    """One resumption as visibility shows it.

    IDs, the run's status (``running``, ``completed``, ``failed``, ``terminated``, ...) and the fleet
    search attributes (None where not set yet).
    """
    row: dict[str, object] = {"workflow_id": workflow_id, "run_id": run_id}
    row["status"] = status.name.lower() if status else None
    row.update({column: attributes.get(key) for column, key in FLEET_COLUMNS.items()})
    row["start_time"], row["close_time"] = _iso(start_time), _iso(close_time)
    return row


def fleet_query(
    *, running: bool = False, phase: str | None = None, experiment_id: str | None = None, stream: str | None = None
) -> str:
    """The visibility query of ``list_resumptions``, narrowed by the filters.

    Every ``ResumptionWorkflow`` run but those that continued as new (a chain shows once, by its newest
    run).

    Raises:
        ValueError: an experiment ID or stream that breaks ``validate_name`` (its characters hold
            no quote, so a checked value cannot change the query); a phase that is not
            among ``fleet.phase_values``.
    """
    clauses = [f"WorkflowType = '{WORKFLOW_TYPE}'", "ExecutionStatus != 'ContinuedAsNew'"]
    if running:
        clauses.append("ExecutionStatus = 'Running'")
    if phase is not None:
        if phase not in fleet.phase_values():
            raise ValueError(f"phase must be one of {', '.join(fleet.phase_values())}, got {phase[:40]!r}")
        clauses.append(f"{fleet.PHASE.name} = '{phase}'")
    if experiment_id is not None:
        name = validate_name("experiment_id", experiment_id)
        # by ID too: a run no worker has started yet has no search attribute set
        clauses.append(f"({fleet.EXPERIMENT_ID.name} = '{name}' OR WorkflowId = '{workflow_id_for(name)}')")
    if stream is not None:
        clauses.append(f"{fleet.STREAM.name} = '{validate_name('stream', stream)}'")
    return " AND ".join(clauses)


async def list_resumptions(client: Client, query: str, limit: int) -> list[dict[str, object]]:
    """The resumptions visibility lists for ``query`` (``fleet_query``), newest first.

    Rows as ``fleet_row``. Needs no worker: search attributes live on the server.

    Raises:
        temporalio.service.RPCError: the query is refused (e.g. the search attributes are not
            registered on the namespace) or Temporal fails.
    """
    rows: list[dict[str, object]] = []
    execution: WorkflowExecution
    async for execution in client.list_workflows(query, limit=limit, page_size=min(limit, 1_000)):
        rows.append(
            fleet_row(
                execution.id,
                execution.run_id,
                execution.status,
                execution.typed_search_attributes,
                execution.start_time,
                execution.close_time,
            )
        )
    return rows


async def live_run(client: Client, experiment_id: str, query_timeout: float) -> dict[str, object] | None:
    """The resumption ``resumption-<E>`` as Temporal knows it, None when there never was one.

    Its ``fleet_row`` and, while it runs, ``progress`` (the ``progress`` query, or None when no worker
    answered within ``query_timeout`` seconds, with ``progress_error`` saying so); once it completed,
    its result's ``release_error`` when the claim could not be released at its end.

    Raises:
        temporalio.service.RPCError: Temporal fails otherwise.
    """
    handle = client.get_workflow_handle(workflow_id_for(experiment_id))
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            return None
        raise
    row = fleet_row(desc.id, desc.run_id, desc.status, desc.typed_search_attributes, desc.start_time, desc.close_time)
    if desc.status is WorkflowExecutionStatus.RUNNING:
        try:
            progress: Progress = await asyncio.wait_for(handle.query(ResumptionWorkflow.progress), query_timeout)
            row["progress"] = progress.model_dump(mode="json")
        except (TimeoutError, RPCError) as err:
            row["progress"] = None
            row["progress_error"] = (
                f"no worker answered the progress query within {query_timeout:g}s"
                if isinstance(err, TimeoutError)
                else one_line(err.message)
            )
    elif desc.status is WorkflowExecutionStatus.COMPLETED:
        # the result is in the closed run's history: no worker needed
        closed = client.get_workflow_handle(desc.id, run_id=desc.run_id, result_type=ResumptionResult)
        try:
            result = await asyncio.wait_for(closed.result(), query_timeout)
        except (TimeoutError, RPCError) as err:
            row["result_error"] = (
                f"the result was not read within {query_timeout:g}s"
                if isinstance(err, TimeoutError)
                else one_line(err.message)
            )
        else:
            if result.release_error:
                row["release_error"] = result.release_error
    return row


async def running_handle(client: Client, experiment_id: str) -> WorkflowHandle[Any, Any]:
    """A handle on the running resumption ``resumption-<E>``.

    Bound to no run: its calls reach the newest run, after a continue-as-new too.

    Raises:
        OperatorError: no resumption of the experiment runs (none ever did, or it ended).
    """
    workflow_id = workflow_id_for(experiment_id)
    handle = client.get_workflow_handle(workflow_id, result_type=ResumptionResult)
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status is not RPCStatusCode.NOT_FOUND:
            raise
        raise OperatorError(f"no resumption of {experiment_id} runs: {workflow_id} not found") from err
    if desc.status is not WorkflowExecutionStatus.RUNNING:
        ended = desc.status.name.lower() if desc.status else "unknown"
        raise OperatorError(f"no resumption of {experiment_id} runs: {workflow_id} ended ({ended}, run {desc.run_id})")
    return handle  # no run ID: Updates reach the newest run of the chain


async def run_update(handle: WorkflowHandle[Any, Any], name: Control, arg: Any, seconds: float) -> EffectiveSettings:
    """Run Update ``name`` on the running resumption; returns the settings the run goes on with.

    With ``arg``, or none; at most ``seconds``.

    Raises:
        OperatorError: the validator rejected it, the run ended meanwhile, or no worker answered.
    """
    args = [] if arg is None else [arg]
    try:
        return await asyncio.wait_for(
            handle.execute_update(
                name.value, args=args, result_type=EffectiveSettings, rpc_timeout=timedelta(seconds=seconds)
            ),
            seconds,
        )
    except WorkflowUpdateFailedError as err:
        raise OperatorError(update_failure_message(err, handle.id)) from err
    except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError) as err:
        raise OperatorError(
            f"no worker answered the {name.value} Update of {handle.id} within {seconds:g}s: is a worker running?"
        ) from err
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            raise OperatorError(f"{handle.id} ended before the {name.value} Update: {one_line(err.message)}") from err
        raise


async def add_etas(client: Client, rows: list[dict[str, object]], most: int, within_seconds: float) -> None:
    """Add ``eta_seconds`` and ``eta_at`` (the ``progress`` query's) to each running row of ``list_resumptions``.

    At most ``most`` runs, the first in ``rows``, asked together and all within ``within_seconds``; a
    run not asked, or not answering in time, gets None. Visibility holds no ETA: it changes with every
    reading, and a search attribute per change would cost a history event each (``workflows/fleet.py``
    refreshes the counts at most every 30 s); a query costs none.

    Raises:
        ValueError: ``most`` < 0 or ``within_seconds`` not > 0.
    """
    if most < 0 or not within_seconds > 0:
        raise ValueError(f"need most >= 0 and within_seconds > 0, got {most} and {within_seconds}")
    for row in rows:
        row["eta_seconds"] = row["eta_at"] = None
    running = [row for row in rows if row["status"] == "running"][:most]

    async def ask(row: dict[str, object]) -> None:
        handle = client.get_workflow_handle(str(row["workflow_id"]))
        try:
            progress: Progress = await handle.query(ResumptionWorkflow.progress)
        except RPCError:
            return  # no worker, or the run ended meanwhile: no ETA
        row["eta_seconds"] = progress.eta_seconds
        row["eta_at"] = _iso(progress.eta_at)

    tasks = [asyncio.ensure_future(ask(row)) for row in running]
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=within_seconds)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
