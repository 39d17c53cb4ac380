"""``XmcClient``: the asyncio client of producers and operators (see ``xmc_resumption.client``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import RedisError
from temporalio.client import Client
from temporalio.exceptions import WorkflowAlreadyStartedError

from xmc_resumption.client.retries import RETRIES, repeat
from xmc_resumption.client.views import (
    ExperimentStatus,
    FleetRow,
    HeldRow,
    NothingToResumeError,
    ResumeError,
    ResumptionHandle,
    Stopping,
)
from xmc_resumption.errors import OperatorError, operator_message
from xmc_resumption.plan import DEFAULT_SAMPLE_SECONDS, Plan, plan
from xmc_resumption.redisclient import held as held_tasks
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.held import (
    Enqueued,
    EnqueueInterruptedError,
    IdempotencyKey,
    Task,
    enqueue_calls,
    parse_enqueue_reply,
)
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys
from xmc_resumption.redisclient.ratecap import DamagedRateCapError, stream_rate
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.redisclient.scripts import run_script
from xmc_resumption.redisclient.text import one_line
from xmc_resumption.runs import fleet_query, list_resumptions, live_run, run_update, running_handle, start_resumption
from xmc_resumption.settings import Settings, connect_temporal
from xmc_resumption.status import (
    DEFAULT_IDLE_SECONDS,
    MAX_LISTED,
    experiment_status,
    has_keys,
    held_experiments,
    refuse_evicting_redis,
    state_and_held,
)
from xmc_resumption.workflows.control import Control, ControlChange, EffectiveSettings
from xmc_resumption.workflows.models import TASK_QUEUE, ResumptionInput

T = TypeVar("T")

DEFAULT_THRESHOLD = ResumptionInput.model_fields["max_backlog_threshold"].default
"""The backlog ``status`` counts up to by default (entries): the input's default threshold."""

QUERY_TIMEOUT_SECONDS = 2.5
"""How long ``status`` waits for a worker to answer the progress query of a running resumption."""


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
        """A client on the Redis and task queue of ``settings`` (read from the environment when None).

        redis-py's own retries are off; ``aclose`` closes its Redis client.
        """
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
        """``retries.repeat`` with this client's ``retries``."""
        return await repeat(self._retries, call, *args, safe=safe)

    # --- producers -------------------------------------------------------------------------------

    async def pause(self, experiment_id: str) -> None:
        """Pause the experiment: its new tasks are held and a running replay stops at its next turn.

        Runs ``SET {S}:experiment:E:state paused``.

        Raises:
            ValueError: a bad experiment ID. redis.exceptions.RedisError: a Redis fault.
        """
        keys = self.keys(experiment_id)
        await self._repeat(held_tasks.pause, self.redis, keys)

    async def enqueue(
        self, experiment_id: str, task: Task, *, idempotency_key: IdempotencyKey = None, request_id: str | None = None
    ) -> Enqueued:
        """Enqueue one task: to the task stream while the experiment runs, else behind its held tasks.

        Args:
            task: the entry's field map (1..3,995 fields; str, bytes, int or float; stored byte for byte).
            idempotency_key: a key (at most 256 bytes) that makes a retry add the task once: a call
                with a key already recorded for this experiment adds nothing and returns the first
                call's destination and entry ID with ``duplicate`` True. With a key the call is
                retried after a connection error (and a retry that finds the task added by its own
                lost first send answers ``duplicate`` False); without one it is not (it may have run).
            request_id: see ``enqueue_many``.

        Raises:
            ValueError: a bad experiment ID, an empty task, too many fields, a key too long.
            redis.exceptions.RedisError: a Redis fault that outlasted the retries (with a key: call
                again with the same key and request ID).
        """
        keys = None if idempotency_key is None else [idempotency_key]
        [done] = await self.enqueue_many(experiment_id, [task], idempotency_keys=keys, request_id=request_id)
        return done

    async def enqueue_many(
        self,
        experiment_id: str,
        tasks: Sequence[Task],
        *,
        idempotency_keys: Sequence[IdempotencyKey] | None = None,
        request_id: str | None = None,
    ) -> list[Enqueued]:
        """Enqueue any number of tasks in order, in atomic script calls of up to ``MAX_ENQUEUE_TASKS`` tasks.

        The same rules as ``enqueue``, per task. Each call (a chunk: at most ``MAX_ENQUEUE_TASKS``
        tasks and 64 MiB, ``redisclient.held.enqueue_calls``) is one round trip, all of its tasks or
        none, with one hold decision; the chunks go one after the other, so a pause or a replay
        between two of them may send the later ones elsewhere (order is kept either way). Every
        task is checked before the first call.

        Args:
            idempotency_keys: None, or one key (or None) per task. A chunk is sent again after a
                connection error only when every task in it has a key.
            request_id: 1..64 bytes naming this enqueue; None: a new one. Give one to retry a
                failed enqueue yourself: the same tasks, keys and request ID answer each task that
                an earlier send added with ``duplicate`` False, as the first send would have.

        Returns:
            One ``Enqueued`` per task, in order.

        Raises:
            ValueError, TypeError: see ``redisclient.held.enqueue_calls``; nothing was sent.
            redis.exceptions.RedisError: as ``enqueue``, when the first chunk failed.
            EnqueueInterruptedError: a later chunk failed; its ``enqueued`` holds the answers of the
                chunks before it. Call again with the same tasks, keys and request ID.
        """
        keys = self.keys(experiment_id)
        done: list[Enqueued] = []
        for call in enqueue_calls(tasks, idempotency_keys, request_id):
            try:
                reply = await self._repeat(self._send_enqueue, keys, call.args, safe=call.safe)
            except RedisError as err:
                if not done:
                    raise
                raise EnqueueInterruptedError(done, len(tasks), err) from err
            done += parse_enqueue_reply(reply)
        return done

    async def _send_enqueue(self, keys: ExperimentKeys, args: list[bytes]) -> Any:
        """One enqueue script call, as sent (and sent again) by ``enqueue_many``; the script's reply."""
        return await run_script(self.redis, "enqueue", keys.enqueue_keys, args)

    # --- operators -------------------------------------------------------------------------------

    def _input(self, experiment: str | ResumptionInput, fields: dict[str, Any]) -> ResumptionInput:
        if isinstance(experiment, ResumptionInput):
            if fields:
                raise TypeError("give a ResumptionInput or fields, not both")
            return experiment
        return ResumptionInput.model_validate({"stream": self.stream, **fields, "experiment_id": experiment})

    async def check_resumable(self, inputs: Sequence[ResumptionInput], *, force: bool = False) -> None:
        """The checks ``resume`` makes before it starts anything.

        Redis's eviction policy must be ``noeviction`` (``status.refuse_evicting_redis``), the stream's rate
        cap one a publish accepts (``ratecap.stream_rate``: ``plan``'s refusal too), and an experiment that is
        running and holds no tasks, or that has no key at all on the stream, has nothing to resume (unless
        ``force``).

        Raises:
            OperatorError: the eviction policy (naming it), a damaged ``{S}:rate`` (naming the key and the
                field). NothingToResumeError: one line naming each experiment with nothing to resume.
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
            try:  # the check xmc plan makes: a cap every publish would refuse (ratecap.stream_rate)
                await self._repeat(stream_rate, self.redis, stream)
            except DamagedRateCapError as err:
                raise OperatorError(str(err)) from err
        if idle and not force:
            raise NothingToResumeError("; ".join(idle) + ": nothing to resume")

    async def resume(
        self, experiment: str | ResumptionInput, *, force: bool = False, task_queue: str | None = None, **fields: Any
    ) -> ResumptionHandle:
        """Start the resumption of one experiment after ``check_resumable``.

        The run is ``ResumptionWorkflow``, ID ``resumption-<E>``.

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
        """Ask the running resumption to stop gracefully (the ``pause`` Update).

        At its next turn it releases the claim, leaves the experiment paused and ends with outcome
        ``paused``.

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
        """Change a running resumption's settings (the ``configure`` Update); returns the settings it runs with now.

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
        """The experiment's status in Redis and, with ``run``, its resumption in Temporal.

        State, held tasks, claim, fencing token, backlog (of ``groups``; None: ``group``, which is required, and
        every group with a consumer; counted up to ``threshold`` entries), the consumers holding pending
        entries while idle for ``idle_seconds``, and Redis memory; with ``run``, its resumption in Temporal
        (an error reaching Temporal is recorded in ``run``, not raised).

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
        """Every experiment on this stream that Redis holds something for, found by ``SCAN``.

        See ``status.held_experiments``: paused, orphaned, resuming, unknown, stranded, bad_keys.

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
        redelivered: bool = False,
    ) -> list[FleetRow]:
        """The resumptions Temporal visibility knows, newest first, narrowed by the filters; no worker needed.

        A continue-as-new chain shows once (``runs.fleet_query``).

        Raises:
            ValueError: a bad phase, experiment ID, stream, or ``limit`` outside 1..``MAX_LISTED``.
            temporalio.service.RPCError: the query is refused or Temporal fails.
        """
        if not 1 <= limit <= MAX_LISTED:
            raise ValueError(f"limit must be 1..{MAX_LISTED}, got {limit}")
        query = fleet_query(
            running=running, phase=phase, experiment_id=experiment_id, stream=stream, redelivered=redelivered
        )
        return [FleetRow.model_validate(r) for r in await list_resumptions(await self.temporal(), query, limit)]

    async def plan(
        self,
        experiment: str | ResumptionInput,
        *,
        sample_seconds: float = DEFAULT_SAMPLE_SECONDS,
        query_timeout: float = QUERY_TIMEOUT_SECONDS,
        **fields: Any,
    ) -> Plan:
        """What resuming ``experiment`` (as ``resume`` would start it) would move, cost and meet, writing nothing.

        See ``xmc_resumption.plan.plan``: held tasks and bytes, every group's backlog and sampled drain over
        ``sample_seconds``, the estimated time, the refusals and waits. Temporal out of reach is one of the
        plan's notes, not an error.

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
