"""A typed client for producers and operators: ``XmcClient`` (asyncio) and ``XmcSyncClient`` (blocking).

Producers pause an experiment and enqueue its tasks: ``pause``, ``enqueue``, ``enqueue_many`` (one
script call for up to ``MAX_ENQUEUE_TASKS`` tasks), each task optionally with an idempotency key so
that a retry after a lost reply adds it once. The contract behind them, for producers in any
language: docs/producers.md. Operators start, watch and stop resumptions: ``resume`` (one or many
experiments, with the checks ``xmc resume`` makes), ``stop``, ``configure``, ``status``, ``held``,
``list_resumptions``. The ``xmc`` command is a user of this module.

Retries: a client made by ``from_settings`` turns redis-py's own retries off, because redis-py
sends a command again after a connection error, and a command whose reply was lost has run: an
enqueue without a key would be added twice. This module retries, ``retries`` times with a short
backoff, only what is safe to send twice: reads, the pause (a ``SET``), and an enqueue whose every
task has an idempotency key. A client built from a Redis client of your own keeps that client's
retry policy for everything.

``XmcSyncClient`` runs the producer calls on a blocking redis-py client (no event loop). The
operator calls need Temporal, whose SDK is asyncio only: they run an ``XmcClient`` on one event
loop in a thread of the sync client's own, started at the first such call.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError

from xmc_resumption.errors import OperatorError, one_line, operator_message
from xmc_resumption.ops import (
    DEFAULT_IDLE_SECONDS,
    MAX_LISTED,
    experiment_status,
    fleet_query,
    has_keys,
    held_experiments,
    list_resumptions,
    live_run,
    refuse_evicting_redis,
    run_update,
    running_handle,
    start_resumption,
    state_and_held,
)
from xmc_resumption.plan import DEFAULT_SAMPLE_SECONDS, Plan, plan
from xmc_resumption.redisclient import held as held_tasks
from xmc_resumption.redisclient.connection import RedisClient, SyncRedisClient
from xmc_resumption.redisclient.held import (
    MAX_ENQUEUE_TASKS,
    Enqueued,
    IdempotencyKey,
    Task,
    enqueue_args,
    parse_enqueue_reply,
)
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys
from xmc_resumption.redisclient.results import ExperimentState, GroupBacklog, IdleConsumer, RedisMemory
from xmc_resumption.redisclient.scripts import run_script, run_script_sync
from xmc_resumption.settings import Settings, connect_temporal
from xmc_resumption.workflows.models import (
    TASK_QUEUE,
    Control,
    ControlChange,
    EffectiveSettings,
    ResumptionInput,
    ResumptionResult,
)
from xmc_resumption.workflows.resumption import ResumptionWorkflow

__all__ = [
    "MAX_ENQUEUE_TASKS",
    "Enqueued",
    "ExperimentStatus",
    "FleetRow",
    "HeldRow",
    "NothingToResumeError",
    "ResumeError",
    "Stopping",
    "XmcClient",
    "XmcSyncClient",
]

T = TypeVar("T")

RETRIES = 3
"""How often a client sends a call that is safe to repeat again after a connection error or a timeout."""

RETRY_SECONDS = 0.1
"""The first wait before such a retry (seconds); it doubles with each try (0.1, 0.2, 0.4)."""

DEFAULT_THRESHOLD = ResumptionInput.model_fields["max_backlog_threshold"].default
"""The backlog ``status`` counts up to by default (entries): the input's default threshold."""

QUERY_TIMEOUT_SECONDS = 2.5
"""How long ``status`` waits for a worker to answer the progress query of a running resumption."""

RETRYABLE = (RedisConnectionError, RedisTimeoutError)
"""Redis faults after which a call may or may not have run."""

ResumptionHandle = WorkflowHandle[ResumptionWorkflow, ResumptionResult]


class BacklogSummary(BaseModel):
    """The consumer groups' backlog as ``status`` counts it (entries, up to ``threshold``): the
    largest, of ``limiting_group``; ``group`` is the one that must exist; ``missing_group`` the first
    required group not found (None when none); ``groups`` each group's part (docs/memory.md)."""

    group: str
    limiting_group: str = ""
    pending: int
    lag: int
    capped: bool
    status: str
    missing_group: str | None = None
    threshold: int
    groups: list[GroupBacklog] = []


class ExperimentStatus(BaseModel):
    """One experiment in Redis (and its resumption in Temporal): ``XmcClient.status``.

    Attributes:
        exists: False when no key of the experiment exists on this stream (``state`` is then
            ``unknown``: never paused nor resumed here).
        state: ``running``, ``paused``, ``resuming`` or ``unknown``.
        orphaned: resuming with no live claim: the replayer is gone; resuming again goes on.
        held: held tasks (entries); set_aside: tasks in the dead-letter stream.
        claim: ``token``, ``owner``, ``lease_ms`` left; {} when none. fence: the last fencing token.
        backlog: the consumer groups' backlog (``BacklogSummary``); idle_consumers: the consumers
            of those groups holding pending entries while idle for ``idle_seconds``, the most
            pending first (``redisclient.consumers``).
        redis_memory: Redis's eviction policy and memory; ``problem`` says why a resumption refuses it.
        run: the resumption ``resumption-<E>`` in Temporal (``ops.live_run``: IDs, status, search
            attributes, ``progress`` while it runs), ``{"error": <one line>}`` when Temporal could not
            be asked, None when there never was one or it was not asked.
        unknown: the parts that could not be read (a key of the wrong type, a command the ACL user
            may not run) -> why; each such part is None above (``ops.experiment_status``).
    """

    experiment_id: str
    stream: str
    exists: bool | None
    state: str
    orphaned: bool | None
    held: int | None
    claim: dict[str, str] | None
    fence: int | None
    set_aside: int | None
    backlog: BacklogSummary | None
    idle_consumers: list[IdleConsumer] | None = []
    redis_memory: RedisMemory | None
    run: dict[str, Any] | None = None
    unknown: dict[str, str] | None = None


class HeldRow(BaseModel):
    """One experiment Redis holds something for (``XmcClient.held``; see ``ops.held_experiments``)."""

    experiment_id: str
    state: str | None
    held: int | None
    claim: dict[str, str]
    condition: str
    error: str | None = None


class FleetRow(BaseModel):
    """One resumption as Temporal visibility lists it (``XmcClient.list_resumptions``)."""

    workflow_id: str
    run_id: str | None
    status: str | None
    experiment_id: str | None
    stream: str | None
    phase: str | None
    replayed: int | None
    remaining: int | None
    outcome: str | None
    start_time: str | None
    close_time: str | None


@dataclass(frozen=True)
class Stopping:
    """A resumption asked to stop (``XmcClient.stop``): its handle (``await handle.result()`` waits
    for its end, outcome ``paused``) and the settings it runs with until then."""

    handle: ResumptionHandle
    settings: EffectiveSettings


class NothingToResumeError(OperatorError):
    """An experiment is running and holds no tasks: a resumption would have nothing to replay
    (``resume(..., force=True)`` starts it anyway)."""


class ResumeError(OperatorError):
    """Some resumptions of a ``resume_many`` did not start (one already ran, or Temporal failed
    midway); the others did.

    Attributes:
        started: the handles of the runs that started, in the order given.
        failures: experiment ID -> the error its start raised.
    """

    def __init__(self, started: list[ResumptionHandle], failures: dict[str, BaseException], message: str) -> None:
        super().__init__(message)
        self.started = started
        self.failures = failures


def _backoff(attempt: int) -> float:
    return float(RETRY_SECONDS * 2**attempt)


def _safe_to_repeat(keys: Sequence[IdempotencyKey] | None, tasks: int) -> bool:
    """An enqueue may be sent again when every task carries an idempotency key."""
    return keys is not None and len(keys) == tasks and all(k for k in keys)


class XmcClient:
    """The asyncio client (see the module docstring).

    Args:
        redis: an asyncio Redis client (``Settings.redis``), bytes in and out.
        temporal: a Temporal client with the pydantic data converter; None connects through
            envconfig (``settings.connect_temporal``) at the first call that needs Temporal.
        stream: the task stream ``S`` of every call (checked by ``keys.validate_name``).
        task_queue: the task queue ``resume`` starts runs on (``XMC_TASK_QUEUE``).
        settings: the settings, to name the Redis in one-line errors (``status``'s ``run``).
        retries: how often a call that is safe to repeat is sent again (``RETRIES``).
        owns_redis: ``aclose`` closes ``redis`` too.

    Raises:
        ValueError: a bad stream name.
    """

    def __init__(
        self,
        redis: RedisClient,
        temporal: Client | None = None,
        *,
        stream: str = DEFAULT_STREAM,
        task_queue: str = TASK_QUEUE,
        settings: Settings | None = None,
        retries: int = RETRIES,
        owns_redis: bool = False,
    ) -> None:
        ExperimentKeys(stream, "x")  # checks the stream's name
        self.redis, self.stream, self.task_queue = redis, stream, task_queue
        self._temporal, self._settings, self._retries, self._owns_redis = temporal, settings, retries, owns_redis

    @classmethod
    def from_settings(
        cls,
        settings: Settings | None = None,
        *,
        stream: str = DEFAULT_STREAM,
        temporal: Client | None = None,
        retries: int = RETRIES,
    ) -> XmcClient:
        """A client on the Redis and task queue of ``settings`` (read from the environment when
        None), redis-py's own retries off; ``aclose`` closes its Redis client."""
        settings = settings or Settings()
        return cls(
            settings.redis(retries=0),
            temporal,
            stream=stream,
            task_queue=settings.task_queue,
            settings=settings,
            retries=retries,
            owns_redis=True,
        )

    async def aclose(self) -> None:
        """Close the Redis client if this client made it (``from_settings``)."""
        if self._owns_redis:
            await self.redis.aclose()

    async def __aenter__(self) -> XmcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def keys(self, experiment_id: str) -> ExperimentKeys:
        """The experiment's keys on this client's stream.

        Raises:
            ValueError: a bad experiment ID (``keys.validate_name``).
        """
        return ExperimentKeys(self.stream, experiment_id)

    async def temporal(self) -> Client:
        """The Temporal client, connected at the first call.

        Raises:
            settings.TemporalUnreachableError: Temporal cannot be reached.
        """
        if self._temporal is None:
            self._temporal = await connect_temporal()
        return self._temporal

    async def _repeat(self, call: Callable[..., Awaitable[T]], *args: Any, safe: bool = True) -> T:
        """``call(*args)``, sent again up to ``retries`` times after a connection error or a
        timeout when ``safe`` (it may have run: only what may run twice is repeated)."""
        for attempt in range(self._retries + 1):
            try:
                return await call(*args)
            except RETRYABLE:
                if not safe or attempt == self._retries:
                    raise
                await asyncio.sleep(_backoff(attempt))
        raise AssertionError("unreachable")

    # --- producers -------------------------------------------------------------------------------

    async def pause(self, experiment_id: str) -> None:
        """Pause the experiment: its new tasks are held and a running replay stops at its next turn
        (``SET {S}:experiment:E:state paused``).

        Raises:
            ValueError: a bad experiment ID. redis.exceptions.RedisError: a Redis fault.
        """
        keys = self.keys(experiment_id)
        await self._repeat(held_tasks.pause, self.redis, keys)

    async def enqueue(self, experiment_id: str, task: Task, *, idempotency_key: IdempotencyKey = None) -> Enqueued:
        """Enqueue one task: to the task stream while the experiment runs, else behind its held tasks.

        Args:
            task: the entry's field map (1..3,995 fields; str, bytes, int or float; stored byte for byte).
            idempotency_key: a key (at most 256 bytes) that makes a retry add the task once: a call
                with a key already recorded for this experiment adds nothing and returns the first
                call's destination and entry ID with ``duplicate`` True. With a key the call is
                retried after a connection error; without one it is not (it may have run).

        Raises:
            ValueError: a bad experiment ID, an empty task, too many fields, a key too long.
            redis.exceptions.RedisError: a Redis fault that outlasted the retries (with a key: call
                again with the same key).
        """
        keys = None if idempotency_key is None else [idempotency_key]
        [done] = await self.enqueue_many(experiment_id, [task], idempotency_keys=keys)
        return done

    async def enqueue_many(
        self, experiment_id: str, tasks: Sequence[Task], *, idempotency_keys: Sequence[IdempotencyKey] | None = None
    ) -> list[Enqueued]:
        """Enqueue up to ``MAX_ENQUEUE_TASKS`` tasks in order, in one script call (one round trip,
        all or none): the same rules as ``enqueue``, per task.

        Args:
            idempotency_keys: None, or one key (or None) per task. The call is retried after a
                connection error only when every task has a key.

        Returns:
            One ``Enqueued`` per task, in order.

        Raises:
            ValueError: see ``redisclient.held.enqueue_args``. redis.exceptions.RedisError: as ``enqueue``.
        """
        keys = self.keys(experiment_id)
        args = enqueue_args(tasks, idempotency_keys)
        safe = _safe_to_repeat(idempotency_keys, len(tasks))
        reply = await self._repeat(run_script, self.redis, "enqueue", keys.enqueue_keys, args, safe=safe)
        return parse_enqueue_reply(reply)

    # --- operators -------------------------------------------------------------------------------

    def _input(self, experiment: str | ResumptionInput, fields: dict[str, Any]) -> ResumptionInput:
        if isinstance(experiment, ResumptionInput):
            if fields:
                raise TypeError("give a ResumptionInput or fields, not both")
            return experiment
        return ResumptionInput.model_validate({"stream": self.stream, **fields, "experiment_id": experiment})

    async def check_resumable(self, inputs: Sequence[ResumptionInput], *, force: bool = False) -> None:
        """The checks ``resume`` makes before it starts anything: Redis's eviction policy must be
        ``noeviction`` (``ops.refuse_evicting_redis``), and an experiment that is running and holds
        no tasks, or that has no key at all on the stream, has nothing to resume (unless ``force``).

        Raises:
            OperatorError: the eviction policy (naming it). NothingToResumeError: one line naming
                each experiment with nothing to resume.
            KeyContentError: a state or held key of the wrong type.
        """
        idle: list[str] = []
        for inp in inputs:
            keys = ExperimentKeys(inp.stream, inp.experiment_id)
            state, waiting = await self._repeat(state_and_held, self.redis, keys)
            if state is ExperimentState.RUNNING and not waiting:
                if await self._repeat(has_keys, self.redis, keys):
                    idle.append(f"experiment {inp.experiment_id} is running and holds no tasks on {inp.stream}")
                else:  # an absent state key reads as running; no key at all is a name never paused here
                    idle.append(
                        f"experiment {inp.experiment_id} has no key on {inp.stream} "
                        "(never paused here: a typo, or another --stream?)"
                    )
        for stream in dict.fromkeys(inp.stream for inp in inputs):
            await self._repeat(refuse_evicting_redis, self.redis, ExperimentKeys(stream, "x"))
        if idle and not force:
            raise NothingToResumeError("; ".join(idle) + ": nothing to resume")

    async def resume(
        self, experiment: str | ResumptionInput, *, force: bool = False, task_queue: str | None = None, **fields: Any
    ) -> ResumptionHandle:
        """Start the resumption of one experiment (``ResumptionWorkflow``, ID ``resumption-<E>``)
        after ``check_resumable``.

        Args:
            experiment: an experiment ID (then ``fields`` are the other ``ResumptionInput`` fields;
                ``stream`` defaults to this client's), or a whole ``ResumptionInput``.
            force: start even when the experiment is running and holds no tasks.
            task_queue: the workers' task queue (default: this client's, ``XMC_TASK_QUEUE``).

        Returns:
            The run's handle: ``await handle.result()`` gives its ``ResumptionResult``.

        Raises:
            pydantic.ValidationError: a bad input (nothing read or started).
            NothingToResumeError, OperatorError, KeyContentError: see ``check_resumable``.
            temporalio.exceptions.WorkflowAlreadyStartedError: a resumption of it runs already.
            settings.TemporalUnreachableError, temporalio.service.RPCError: Temporal failed.
        """
        inp = self._input(experiment, fields)
        await self.check_resumable([inp], force=force)
        return await start_resumption(await self.temporal(), inp, task_queue or self.task_queue)

    async def resume_many(
        self,
        experiments: Sequence[str | ResumptionInput],
        *,
        force: bool = False,
        task_queue: str | None = None,
        **fields: Any,
    ) -> list[ResumptionHandle]:
        """Start the resumptions of several experiments, in order, with the same ``fields``.

        Every input is validated and every experiment checked (``check_resumable``) before any run
        starts, so a refusal starts none. Then each run starts; one that runs already is reported
        and the others still start. An experiment given twice starts once.

        Returns:
            The handles, in the order given.

        Raises:
            pydantic.ValidationError, NothingToResumeError, OperatorError: nothing started.
            ResumeError: some runs did not start (``started`` holds those that did); with one
                experiment, or when none started and one failed, that failure itself instead.
        """
        inputs = list({inp.experiment_id: inp for inp in (self._input(e, fields) for e in experiments)}.values())
        await self.check_resumable(inputs, force=force)
        client = await self.temporal()
        started: list[ResumptionHandle] = []
        failures: dict[str, BaseException] = {}
        untried: list[str] = []
        for inp in inputs:
            if untried or (failures and not isinstance(list(failures.values())[-1], WorkflowAlreadyStartedError)):
                untried.append(inp.experiment_id)  # Temporal itself failed: the rest are not tried
                continue
            try:
                started.append(await start_resumption(client, inp, task_queue or self.task_queue))
            except Exception as err:
                failures[inp.experiment_id] = err
        if not failures:
            return started
        if not started and len(failures) == 1 and not untried:
            raise next(iter(failures.values()))
        reasons = [
            f"{e}: {operator_message(err, self._settings) or one_line(str(err))}" for e, err in failures.items()
        ] + [f"{e}: not tried" for e in untried]
        message = f"{len(started)} of {len(inputs)} resumptions started; " + "; ".join(reasons)
        raise ResumeError(started, failures, message) from next(iter(failures.values()))

    async def stop(self, experiment_id: str, *, update_timeout: float = 30.0) -> Stopping:
        """Ask the running resumption to stop gracefully (the ``pause`` Update): at its next turn
        it releases the claim, leaves the experiment paused and ends with outcome ``paused``.

        Args:
            update_timeout: seconds to wait for a worker to accept the Update.

        Raises:
            OperatorError: no resumption of the experiment runs, the run rejected the Update or
                ended meanwhile, or no worker answered within ``update_timeout``.
        """
        handle = await running_handle(await self.temporal(), experiment_id)
        settings = await run_update(handle, Control.PAUSE, None, update_timeout)
        return Stopping(handle, settings)

    async def configure(
        self, experiment_id: str, change: ControlChange, *, update_timeout: float = 30.0
    ) -> EffectiveSettings:
        """Change a running resumption's settings (the ``configure`` Update); returns the settings
        it runs with from now on.

        Raises:
            OperatorError: as ``stop``; the message names the field a validator refused.
        """
        handle = await running_handle(await self.temporal(), experiment_id)
        return await run_update(handle, Control.CONFIGURE, change, update_timeout)

    async def status(
        self,
        experiment_id: str,
        *,
        group: str = DEFAULT_GROUP,
        threshold: int = DEFAULT_THRESHOLD,
        run: bool = True,
        query_timeout: float = QUERY_TIMEOUT_SECONDS,
        groups: Sequence[str] | None = None,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
    ) -> ExperimentStatus:
        """The experiment's state, held tasks, claim, fencing token, backlog (of ``groups``, every
        group of the stream when None, ``group`` required; counted up to ``threshold`` entries),
        the consumers holding pending entries while idle for ``idle_seconds``, and Redis memory;
        with ``run``, its resumption in Temporal (an error reaching Temporal is recorded in
        ``run``, not raised).

        Raises:
            KeyContentError: a key holds the wrong type or a value the contract does not know.
            redis.exceptions.RedisError: a Redis fault.
        """
        keys = self.keys(experiment_id)
        doc = await self._repeat(experiment_status, self.redis, keys, group, threshold, groups, idle_seconds)
        if run:
            try:
                doc["run"] = await live_run(await self.temporal(), experiment_id, query_timeout)
            except Exception as err:  # the Redis part stands; say why the Temporal part is missing
                message = operator_message(err, self._settings)
                if message is None:
                    raise
                doc["run"] = {"error": message}
        return ExperimentStatus.model_validate(doc)

    async def held(self, *, limit: int = 1_000) -> tuple[list[HeldRow], bool]:
        """Every experiment on this stream that Redis holds something for (``ops.held_experiments``:
        paused, orphaned, resuming, unknown, stranded, bad_keys), by ``SCAN``.

        Returns:
            (rows, truncated): truncated when more than ``limit`` (1..``MAX_LISTED``) were found.
        """
        rows, truncated = await self._repeat(held_experiments, self.redis, self.stream, limit)
        return [HeldRow.model_validate(r) for r in rows], truncated

    async def list_resumptions(
        self,
        *,
        running: bool = False,
        phase: str | None = None,
        experiment_id: str | None = None,
        stream: str | None = None,
        limit: int = 200,
    ) -> list[FleetRow]:
        """The resumptions Temporal visibility knows, newest first (``ops.fleet_query``: a
        continue-as-new chain once), narrowed by the filters; no worker needed.

        Raises:
            ValueError: a bad phase, experiment ID, stream, or ``limit`` outside 1..``MAX_LISTED``.
            temporalio.service.RPCError: the query is refused or Temporal fails.
        """
        if not 1 <= limit <= MAX_LISTED:
            raise ValueError(f"limit must be 1..{MAX_LISTED}, got {limit}")
        query = fleet_query(running=running, phase=phase, experiment_id=experiment_id, stream=stream)
        return [FleetRow.model_validate(r) for r in await list_resumptions(await self.temporal(), query, limit)]

    async def plan(
        self,
        experiment: str | ResumptionInput,
        *,
        sample_seconds: float = DEFAULT_SAMPLE_SECONDS,
        query_timeout: float = QUERY_TIMEOUT_SECONDS,
        **fields: Any,
    ) -> Plan:
        """What resuming ``experiment`` (as ``resume`` would start it) would move, cost and meet,
        writing nothing (``xmc_resumption.plan.plan``: held tasks and bytes, every group's backlog
        and sampled drain over ``sample_seconds``, the estimated time, the refusals and waits).
        Temporal out of reach is one of the plan's notes, not an error.

        Raises:
            pydantic.ValidationError: a bad input. ValueError: ``sample_seconds`` out of bounds.
            redis.exceptions.RedisError: a Redis fault (an ACL refusal is one of the plan's refusals).
        """
        inp = self._input(experiment, fields)
        temporal: Client | None = None
        error: str | None = None
        try:
            temporal = await self.temporal()
        except Exception as err:  # the Redis part stands; the plan says what is unknown and why
            error = operator_message(err, self._settings)
            if error is None:
                raise
        return await plan(
            self.redis,
            inp,
            temporal=temporal,
            temporal_error=error,
            sample_seconds=sample_seconds,
            query_timeout=query_timeout,
        )


class XmcSyncClient:
    """The blocking client (see the module docstring): the producer calls on a blocking Redis
    client, the operator calls on an ``XmcClient`` in a thread of its own.

    Args:
        redis: a blocking Redis client (``Settings.sync_redis``), bytes in and out.
        stream: the task stream of every call.
        operator: makes the ``XmcClient`` of the operator calls (called on the client's own event
            loop, at the first such call); None: this client makes producer calls only.
        retries: as ``XmcClient``'s. owns_redis: ``close`` closes ``redis`` too.
    """

    def __init__(
        self,
        redis: SyncRedisClient,
        *,
        stream: str = DEFAULT_STREAM,
        operator: Callable[[], XmcClient] | None = None,
        retries: int = RETRIES,
        owns_redis: bool = False,
    ) -> None:
        ExperimentKeys(stream, "x")
        self.redis, self.stream = redis, stream
        self._make_operator, self._retries, self._owns_redis = operator, retries, owns_redis
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._operator: XmcClient | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings | None = None, *, stream: str = DEFAULT_STREAM) -> XmcSyncClient:
        """A client on the Redis (and, for operator calls, the Temporal and task queue) of
        ``settings``, read from the environment when None; redis-py's own retries off."""
        settings = settings or Settings()
        return cls(
            settings.sync_redis(retries=0),
            stream=stream,
            operator=lambda: XmcClient.from_settings(settings, stream=stream),
            owns_redis=True,
        )

    def close(self) -> None:
        """Close the operator client and its thread, and the Redis client if this client made it."""
        if self._loop is not None and self._thread is not None:
            if self._operator is not None:
                asyncio.run_coroutine_threadsafe(self._operator.aclose(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            self._loop = self._thread = self._operator = None
        if self._owns_redis:
            self.redis.close()

    def __enter__(self) -> XmcSyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def keys(self, experiment_id: str) -> ExperimentKeys:
        """The experiment's keys on this client's stream (``ValueError`` for a bad ID)."""
        return ExperimentKeys(self.stream, experiment_id)

    def _repeat(self, call: Callable[..., T], *args: Any, safe: bool = True) -> T:
        """``XmcClient._repeat``, blocking."""
        for attempt in range(self._retries + 1):
            try:
                return call(*args)
            except RETRYABLE:
                if not safe or attempt == self._retries:
                    raise
                time.sleep(_backoff(attempt))
        raise AssertionError("unreachable")

    # --- producers (blocking Redis, no event loop) -----------------------------------------------

    def pause(self, experiment_id: str) -> None:
        """``XmcClient.pause``."""
        keys = self.keys(experiment_id)
        self._repeat(self.redis.set, keys.state, ExperimentState.PAUSED.value)

    def enqueue(self, experiment_id: str, task: Task, *, idempotency_key: IdempotencyKey = None) -> Enqueued:
        """``XmcClient.enqueue``."""
        keys = None if idempotency_key is None else [idempotency_key]
        [done] = self.enqueue_many(experiment_id, [task], idempotency_keys=keys)
        return done

    def enqueue_many(
        self, experiment_id: str, tasks: Sequence[Task], *, idempotency_keys: Sequence[IdempotencyKey] | None = None
    ) -> list[Enqueued]:
        """``XmcClient.enqueue_many``."""
        keys = self.keys(experiment_id)
        args = enqueue_args(tasks, idempotency_keys)
        safe = _safe_to_repeat(idempotency_keys, len(tasks))
        reply = self._repeat(run_script_sync, self.redis, "enqueue", keys.enqueue_keys, args, safe=safe)
        return parse_enqueue_reply(reply)

    # --- operators (an XmcClient on the client's own event loop) ---------------------------------

    def _call(self, use: Callable[[XmcClient], Coroutine[Any, Any, T]]) -> T:
        """Run ``use(operator client)`` on the client's event loop (started at the first call)."""
        with self._lock:
            if self._make_operator is None:
                raise RuntimeError("this XmcSyncClient was made without operator access: use from_settings")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="xmc-client", daemon=True)
                self._thread.start()
            loop, make = self._loop, self._make_operator

        async def run() -> T:
            if self._operator is None:
                self._operator = make()
            return await use(self._operator)

        return asyncio.run_coroutine_threadsafe(run(), loop).result()

    def resume(
        self, experiment: str | ResumptionInput, *, force: bool = False, task_queue: str | None = None, **fields: Any
    ) -> ResumptionHandle:
        """``XmcClient.resume``; wait for the run's end with ``result``."""
        return self._call(lambda c: c.resume(experiment, force=force, task_queue=task_queue, **fields))

    def resume_many(
        self,
        experiments: Sequence[str | ResumptionInput],
        *,
        force: bool = False,
        task_queue: str | None = None,
        **fields: Any,
    ) -> list[ResumptionHandle]:
        """``XmcClient.resume_many``."""
        return self._call(lambda c: c.resume_many(experiments, force=force, task_queue=task_queue, **fields))

    def result(self, handle: ResumptionHandle) -> ResumptionResult:
        """Wait for a run started by this client to end; returns its result.

        Raises:
            temporalio.client.WorkflowFailureError: the run ended without a result.
        """

        async def wait(_: XmcClient) -> ResumptionResult:
            return await handle.result()

        return self._call(wait)

    def stop(self, experiment_id: str, *, update_timeout: float = 30.0) -> Stopping:
        """``XmcClient.stop``."""
        return self._call(lambda c: c.stop(experiment_id, update_timeout=update_timeout))

    def configure(
        self, experiment_id: str, change: ControlChange, *, update_timeout: float = 30.0
    ) -> EffectiveSettings:
        """``XmcClient.configure``."""
        return self._call(lambda c: c.configure(experiment_id, change, update_timeout=update_timeout))

    def status(
        self, experiment_id: str, *, group: str = DEFAULT_GROUP, threshold: int = DEFAULT_THRESHOLD, run: bool = True
    ) -> ExperimentStatus:
        """``XmcClient.status``."""
        return self._call(lambda c: c.status(experiment_id, group=group, threshold=threshold, run=run))

    def held(self, *, limit: int = 1_000) -> tuple[list[HeldRow], bool]:
        """``XmcClient.held``."""
        return self._call(lambda c: c.held(limit=limit))

    def list_resumptions(
        self,
        *,
        running: bool = False,
        phase: str | None = None,
        experiment_id: str | None = None,
        stream: str | None = None,
        limit: int = 200,
    ) -> list[FleetRow]:
        """``XmcClient.list_resumptions``."""
        return self._call(
            lambda c: c.list_resumptions(
                running=running, phase=phase, experiment_id=experiment_id, stream=stream, limit=limit
            )
        )
