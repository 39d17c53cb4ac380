"""``XmcSyncClient``: the blocking client; operator calls run an ``XmcClient`` on a loop of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from redis.exceptions import RedisError

from xmc_resumption.client.aio import DEFAULT_THRESHOLD, QUERY_TIMEOUT_SECONDS, XmcClient
from xmc_resumption.client.retries import RETRIES, repeat_sync
from xmc_resumption.client.views import (
    ExperimentStatus,
    FleetRow,
    HeldRow,
    ResumptionHandle,
    Stopping,
)
from xmc_resumption.plan import DEFAULT_SAMPLE_SECONDS, Plan
from xmc_resumption.redisclient.connection import SyncRedisClient
from xmc_resumption.redisclient.held import (
    Enqueued,
    EnqueueInterruptedError,
    IdempotencyKey,
    Task,
    enqueue_calls,
    parse_enqueue_reply,
)
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.redisclient.scripts import run_script_sync
from xmc_resumption.settings import Settings
from xmc_resumption.status import DEFAULT_IDLE_SECONDS
from xmc_resumption.workflows.control import ControlChange, EffectiveSettings
from xmc_resumption.workflows.models import ResumptionInput, ResumptionResult

T = TypeVar("T")


class XmcSyncClient:
    """The blocking client (see the module docstring).

    The producer calls run on a blocking Redis client, the operator calls on an ``XmcClient`` in a
    thread of its own.

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
    def from_settings(
        cls, settings: Settings | None = None, *, stream: str = DEFAULT_STREAM, retries: int = RETRIES
    ) -> XmcSyncClient:
        """A client on the Redis of ``settings`` (read from the environment when None); redis-py's own retries off.

        For operator calls, also on the Temporal and task queue of ``settings``. ``retries``: as
        ``XmcClient.from_settings``'s, for both.
        """
        settings = settings or Settings()
        return cls(
            settings.sync_redis(retries=0),
            stream=stream,
            operator=lambda: XmcClient.from_settings(settings, stream=stream, retries=retries),
            retries=retries,
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
        """``retries.repeat_sync`` with this client's ``retries``."""
        return repeat_sync(self._retries, call, *args, safe=safe)

    # --- producers (blocking Redis, no event loop) -----------------------------------------------

    def pause(self, experiment_id: str) -> None:
        """``XmcClient.pause``."""
        keys = self.keys(experiment_id)
        self._repeat(self.redis.set, keys.state, ExperimentState.PAUSED.value)

    def enqueue(
        self, experiment_id: str, task: Task, *, idempotency_key: IdempotencyKey = None, request_id: str | None = None
    ) -> Enqueued:
        """``XmcClient.enqueue``."""
        keys = None if idempotency_key is None else [idempotency_key]
        [done] = self.enqueue_many(experiment_id, [task], idempotency_keys=keys, request_id=request_id)
        return done

    def enqueue_many(
        self,
        experiment_id: str,
        tasks: Sequence[Task],
        *,
        idempotency_keys: Sequence[IdempotencyKey] | None = None,
        request_id: str | None = None,
    ) -> list[Enqueued]:
        """``XmcClient.enqueue_many``: any number of tasks, in atomic chunks of up to ``MAX_ENQUEUE_TASKS``.

        Raises:
            ValueError, TypeError: a bad task or key; nothing was sent.
            redis.exceptions.RedisError: the first chunk failed after the retries.
            EnqueueInterruptedError: a later chunk failed; ``enqueued`` holds the chunks done before it.
        """
        keys = self.keys(experiment_id)
        done: list[Enqueued] = []
        for call in enqueue_calls(tasks, idempotency_keys, request_id):
            try:
                reply = self._repeat(self._send_enqueue, keys, call.args, safe=call.safe)
            except RedisError as err:
                if not done:
                    raise
                raise EnqueueInterruptedError(done, len(tasks), err) from err
            done += parse_enqueue_reply(reply)
        return done

    def _send_enqueue(self, keys: ExperimentKeys, args: list[bytes]) -> Any:
        """One enqueue script call, as sent (and sent again) by ``enqueue_many``; the script's reply."""
        return run_script_sync(self.redis, "enqueue", keys.enqueue_keys, args)

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

    def check_resumable(self, inputs: Sequence[ResumptionInput], *, force: bool = False) -> None:
        """``XmcClient.check_resumable``."""
        self._call(lambda c: c.check_resumable(inputs, force=force))

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
        """``XmcClient.status``."""
        return self._call(
            lambda c: c.status(
                experiment_id,
                group=group,
                threshold=threshold,
                run=run,
                query_timeout=query_timeout,
                groups=groups,
                idle_seconds=idle_seconds,
            )
        )

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
        redelivered: bool = False,
    ) -> list[FleetRow]:
        """``XmcClient.list_resumptions``."""
        return self._call(
            lambda c: c.list_resumptions(
                running=running,
                phase=phase,
                experiment_id=experiment_id,
                stream=stream,
                limit=limit,
                redelivered=redelivered,
            )
        )

    def plan(
        self,
        experiment: str | ResumptionInput,
        *,
        sample_seconds: float = DEFAULT_SAMPLE_SECONDS,
        query_timeout: float = QUERY_TIMEOUT_SECONDS,
        **fields: Any,
    ) -> Plan:
        """``XmcClient.plan``: blocks for about ``sample_seconds`` while it samples the consumers' drain."""
        return self._call(
            lambda c: c.plan(experiment, sample_seconds=sample_seconds, query_timeout=query_timeout, **fields)
        )
