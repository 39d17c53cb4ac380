"""The resumption's activities, called by ``ResumptionWorkflow`` (local or regular activities: ``workflows/calls.py``).

Each takes a request envelope (``activities.requests``), returns a pydantic result and calls one
function of ``redisclient``. The workflow calls them by name (``workflow.execute_local_activity``
with the method's ``__name__``, its registered name) and validates the result against the method's
return annotation in workflow code. Errors are sorted for Temporal's retry policy: bad arguments, a
missing consumer group under the ``error`` policy, a key of the wrong type, an eviction policy that
could evict the replay's keys and other error replies that repeat on every try raise a
non-retryable ``ApplicationError`` whose ``type`` is an ``activities.errors.ErrorType``; connection
faults, timeouts and transient error replies propagate and are retried.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ConnectionError,
    MovedError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError
from temporalio import activity
from temporalio.common import MetricMeter
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from xmc_resumption.activities.errors import ErrorType
from xmc_resumption.activities.metrics import HELD_REMAINING, OUTCOMES, REDELIVERED, REPLAYED
from xmc_resumption.activities.requests import (
    TURN_SIGNAL,
    AcquireRequest,
    CheckRequest,
    DrainWaitRequest,
    ExperimentRef,
    IdleConsumersRequest,
    PublishRequest,
    ReleaseRequest,
    SetAsideRequest,
)
from xmc_resumption.redisclient import backlog, consumers, deadletter, fencing, publish
from xmc_resumption.redisclient.acl import acl_user, denial_message
from xmc_resumption.redisclient.connection import STALE_CONNECTION_ERRORS, RedisClient, drop_stale_connections
from xmc_resumption.redisclient.errors import MissingConsumerGroupError
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.memory import EVICTION_REPLY
from xmc_resumption.redisclient.readings import DrainWait, IdleConsumer
from xmc_resumption.redisclient.results import (
    ClaimCheck,
    ClaimGrant,
    PublishResult,
    PublishRounds,
    PublishStatus,
    Release,
    SetAside,
)
from xmc_resumption.redisclient.watch import BacklogWatches, TurnsRefused

TRANSIENT_ERRORS = (OutOfMemoryError, ReadOnlyError, MovedError, AskError, TryAgainError, ClusterDownError)
TRANSIENT_REPLIES = ("BUSY", "NOREPLICAS", "MISCONF")
"""Error replies of a server that is, for now, out of memory (OOM), running a long script (BUSY),
a replica after a failover (READONLY), a node that lost the slot in a failover behind a stable
address (MOVED), resharding or failing over (TRYAGAIN, CLUSTERDOWN, MASTERDOWN), short of replicas
or unable to persist: they mend themselves and are retried (READONLY and MOVED after the pool's
connections were dropped, see ``_classified``). redis-py turns the ones it knows into the classes
of ``TRANSIENT_ERRORS`` (LOADING becomes a ConnectionError), and leaves the rest as
``ResponseError`` with the reply's text. Any other error reply (WRONGTYPE, a non-integer fence
key, NOPERM, a CROSSSLOT) repeats on every retry, so it fails the call at once. (A MOVED from a
Redis Cluster addressed without a cluster client repeats too: the run then waits in
``redis_unavailable`` with the MOVED reply as its last error instead of failing.)"""


PROBE_WINDOW_SECONDS = 60.0
"""How long after a connection fault this worker's calls first probe Redis (seconds)."""

PROBE_SECONDS = 0.5
"""The probe's bound (seconds): a ``PING`` that takes longer fails the call at once."""

UNREACHED_SECONDS = 1.0
"""After a probe failed, calls fail at once for this long (seconds), without another probe."""


class Reachability:
    """Whether this worker reached Redis lately: a worker cut off from Redis fails its calls fast.

    After a connection fault or timeout (``fault``), each call during ``PROBE_WINDOW_SECONDS`` first sends a ``PING``
    bounded by ``PROBE_SECONDS`` (``probe``), and for ``UNREACHED_SECONDS`` after one failed the calls fail at once:
    while the worker is cut off, an attempt fails in half a second at most instead of a socket timeout, so the
    retries of a call handed on to the task queue (``workflows/calls.py``, ``HandOff``) soon reach a worker that
    reaches Redis. A probe answered ends the window.
    """

    def __init__(self) -> None:
        self.faulted_at: float | None = None
        self.unreached_at: float | None = None
        self.unreached: Exception | None = None
        """How the last probe failed: what the calls raise without probing for ``UNREACHED_SECONDS``."""

    def fault(self) -> None:
        """Note a connection fault or timeout now."""
        self.faulted_at = time.monotonic()

    async def probe(self, redis: RedisClient) -> None:
        """Within the window after a fault, ``PING`` within ``PROBE_SECONDS``.

        Raises:
            redis.exceptions.TimeoutError: no answer in time (the pool's connections dropped).
            redis.exceptions.ConnectionError: the connection failed (its own error, ``AuthenticationError`` too).
        """
        now = time.monotonic()
        if self.faulted_at is None or now - self.faulted_at > PROBE_WINDOW_SECONDS:
            return
        if self.unreached_at is not None and now - self.unreached_at < UNREACHED_SECONDS and self.unreached:
            raise type(self.unreached)(*self.unreached.args)  # as the probe failed, without another
        try:
            await asyncio.wait_for(redis.ping(), PROBE_SECONDS)
        except (TimeoutError, ConnectionError, RedisTimeoutError) as err:
            await drop_stale_connections(redis, err)
            self.fault()
            self.unreached_at = time.monotonic()
            if isinstance(err, ConnectionError | RedisTimeoutError):
                self.unreached = err
                raise
            self.unreached = RedisTimeoutError(
                f"Redis did not answer a PING within {PROBE_SECONDS:g}s after a connection fault on this worker"
            )
            raise self.unreached from err
        self.faulted_at = self.unreached_at = None


@asynccontextmanager
async def _classified(redis: RedisClient, reach: Reachability) -> AsyncIterator[None]:
    """Make errors that retrying cannot mend non-retryable ``ApplicationError``s.

    Connection faults, timeouts and transient error replies (``TRANSIENT_ERRORS``, ``TRANSIENT_REPLIES``) propagate and
    are retried.

    A failover: after READONLY, MOVED, a reset or refused connection or a timeout
    (``redisclient.connection.STALE_CONNECTION_ERRORS``) the pooled connections of ``redis`` are
    dropped before the error propagates, so Temporal's retry (200 ms later, ``REDIS_RETRY``)
    connects afresh to whatever server the address names now: a failover behind a stable address
    costs one failed attempt per call in flight, never a worker restart. A connection fault, timeout or attempt past
    its start-to-close is noted in ``reach``, and the call probes Redis first while it says so (``Reachability``).
    """
    await reach.probe(redis)
    try:
        yield
    except STALE_CONNECTION_ERRORS as err:
        if isinstance(err, (ConnectionError, RedisTimeoutError)):
            reach.fault()
        await drop_stale_connections(redis, err)
        raise
    except asyncio.CancelledError:  # an attempt past its start-to-close: Redis did not answer in time
        if (why := activity.cancellation_details()) is not None and why.timed_out:
            reach.fault()
        raise
    except ValueError as err:
        raise ApplicationError(str(err), type=ErrorType.INVALID_ARGUMENT, non_retryable=True) from err
    except MissingConsumerGroupError as err:
        raise ApplicationError(str(err), type=ErrorType.MISSING_CONSUMER_GROUP, non_retryable=True) from err
    except ResponseError as err:
        reply = str(err)
        if isinstance(err, TRANSIENT_ERRORS) or reply.startswith(TRANSIENT_REPLIES):
            raise
        if reply.startswith(EVICTION_REPLY):
            raise ApplicationError(
                reply.removeprefix(EVICTION_REPLY).strip(), type=ErrorType.REDIS_EVICTION_POLICY, non_retryable=True
            ) from err
        denied = denial_message(err, acl_user(redis), f"in {activity.info().activity_type}")
        if denied:
            raise ApplicationError(denied, type=ErrorType.REDIS_PERMISSION_DENIED, non_retryable=True) from err
        if reply.startswith("WRONGTYPE"):
            raise ApplicationError(
                f"a key of the wrong type is in the way: {reply}", type=ErrorType.REDIS_WRONG_TYPE, non_retryable=True
            ) from err
        raise ApplicationError(
            f"Redis refused the command: {reply}", type=ErrorType.REDIS_COMMAND_ERROR, non_retryable=True
        ) from err


def _replay_key() -> str:
    """The calling replay's workflow and run ID, ``""`` outside an activity: ``BacklogWatches``' key of it."""
    if not activity.in_activity():
        return ""
    info = activity.info()
    return f"{info.workflow_id}/{info.workflow_run_id}"


def _turn_giver(wait_id: int) -> Callable[[], Awaitable[None]] | None:
    """What signals the calling replay's run that its queued wait ``wait_id`` has its turn; None without a client.

    The signal raises ``TurnsRefused`` when the server denies it (PERMISSION_DENIED: the worker's identity may not
    signal), ``temporalio.service.RPCError`` on any other refusal.
    """
    if not activity.in_activity():
        return None
    info = activity.info()
    try:
        handle = activity.client().get_workflow_handle(info.workflow_id or "", run_id=info.workflow_run_id)
    except RuntimeError:  # no client: an ActivityEnvironment given none
        return None

    async def wake() -> None:
        try:
            await handle.signal(TURN_SIGNAL, wait_id)
        except RPCError as err:
            if err.status is RPCStatusCode.PERMISSION_DENIED:
                raise TurnsRefused(f"the worker may not signal {TURN_SIGNAL!r} (docs/security.md): {err}") from err
            raise

    return wake


def _keys(ref: ExperimentRef) -> ExperimentKeys:
    """The experiment's keys, after checking its names by the one rule (``redisclient.keys.validate_name``).

    A group is no key, but it reaches XINFO, logs and the UI: it is checked too.
    """
    try:
        backlog.validate_groups(ref.consumer_group, ref.consumer_groups)
        return ExperimentKeys(ref.stream, ref.experiment_id)
    except ValueError as err:
        raise ApplicationError(str(err), type=ErrorType.INVALID_ARGUMENT, non_retryable=True) from err


class HeldRemaining:
    """The worker's ``xmc_resumption_held_remaining`` gauge.

    See ``activities/metrics.py``. Held tasks left, per task stream and consumer group, summed over the
    experiments whose claims this worker process extended within their lease (entries).

    The label set stays bounded (stream, consumer group: never the experiment), so the sum is
    kept here: a gauge set from each workflow would show only the last experiment's count. An
    experiment drops out when its claim is released, or once its lease has passed without news
    (its workflow moved to another worker, or the worker lost it), so a sum over workers counts
    each experiment about once.

    Args:
        meter: the worker runtime's metric meter, or None for no gauge.
    """

    def __init__(self, meter: MetricMeter | None) -> None:
        self._gauge = meter.create_gauge(HELD_REMAINING, "held tasks left", "tasks") if meter else None
        self._seen: dict[tuple[str, str], dict[str, tuple[int, float]]] = {}

    def report(self, ref: ExperimentRef, remaining: int | None, lease_ms: int) -> None:
        """Record ``remaining`` held tasks of ``ref``'s experiment, valid for ``lease_ms`` ms; None forgets it."""
        group = self._seen.setdefault((ref.stream, ref.consumer_group), {})
        now = time.monotonic()
        if remaining is None:
            group.pop(ref.experiment_id, None)
        else:
            group[ref.experiment_id] = (remaining, now + lease_ms / 1000)
        for experiment, (_, until) in list(group.items()):
            if until < now:
                del group[experiment]
        if self._gauge is not None:
            self._gauge.set(
                sum(count for count, _ in group.values()), {"stream": ref.stream, "consumer_group": ref.consumer_group}
            )


class Counts:
    """The counts Redis decides, emitted where Redis answers.

    See ``activities/metrics.py``. Tasks moved (``REPLAYED``: the publish script's ``moved`` of a fresh move; a
    recorded result returned again moved nothing), of those the tasks moved again after Redis lost their move
    (``REDELIVERED``: the scripts' ``redelivered``) and resumptions ended by a release (``OUTCOMES``: a fresh release; a
    repeated one counts nothing). Labelled as the workflow's metrics are: ``stream``, ``consumer_group``, ``namespace``,
    ``task_queue``, ``workflow_type``.

    Args:
        meter: the worker runtime's metric meter; None: the activity's own (it adds
            ``activity_type``).
    """

    def __init__(self, meter: MetricMeter | None) -> None:
        self._meter = meter

    def _add(self, name: str, description: str, value: int, ref: ExperimentRef, **labels: str) -> None:
        info = activity.info()
        base = {"stream": ref.stream, "consumer_group": ref.consumer_group, "workflow_type": info.workflow_type or ""}
        if self._meter is None:
            meter = activity.metric_meter()
        else:
            meter = self._meter
            base |= {"namespace": info.namespace, "task_queue": info.task_queue}
        meter.create_counter(name, description).add(value, base | labels)

    def show(self, ref: ExperimentRef) -> None:
        """Add 0 tasks moved and moved again: the series show from a replay's first check on, not first at a move."""
        self._add(REPLAYED, "tasks moved into the task stream", 0, ref)
        self._add(REDELIVERED, "tasks moved again after Redis lost their move", 0, ref)

    def moved(self, ref: ExperimentRef, tasks: int) -> None:
        """Count ``tasks`` moved now by publishes (none of a recorded result returned again; 0 shows the series)."""
        self._add(REPLAYED, "tasks moved into the task stream", max(0, tasks), ref)

    def redelivered(self, ref: ExperimentRef, tasks: int) -> None:
        """Count ``tasks`` moved again now, marked, after Redis lost their move (``REDELIVERED``)."""
        self._add(REDELIVERED, "tasks moved again after Redis lost their move", max(0, tasks), ref)

    def released(self, ref: ExperimentRef, outcome: str, release: Release) -> None:
        """Count the resumption ended by a release done now (none for a repeated one or none at all)."""
        if outcome and release.token and not release.repeated:
            self._add(OUTCOMES, "resumptions ended, by outcome", 1, ref, outcome=outcome)


class ResumptionActivities:
    """The activities, bound to one asyncio Redis client.

    The client has ``decode_responses=False``: task field maps are moved byte for byte.

    Register the bound methods on a worker: ``Worker(..., activities=ResumptionActivities(r).all())``,
    or let ``xmc_resumption.plugin.ResumptionPlugin`` do it: it builds them without a client and
    sets ``redis`` when the worker starts. ``meter`` (the worker runtime's metric meter) feeds the
    ``HeldRemaining`` gauge and the ``Counts``.
    """

    def __init__(self, redis: RedisClient | None = None, meter: MetricMeter | None = None) -> None:
        self._redis = redis
        self.held = HeldRemaining(meter)
        self.counts = Counts(meter)
        self.reach = Reachability()
        self.watches = BacklogWatches()
        """The drain polls of this worker, sharing one backlog reading per measurement (``redisclient.watch``)."""
        self._stopping: asyncio.Task[None] | None = None

    @property
    def redis(self) -> RedisClient:
        """The Redis client the activities call.

        Raises:
            RuntimeError: none was given nor set (a worker that was never started by its plugin).
        """
        if self._redis is None:
            raise RuntimeError("ResumptionActivities has no Redis client (ResumptionPlugin sets it at worker start)")
        return self._redis

    @redis.setter
    def redis(self, client: RedisClient) -> None:
        self._redis = client

    def all(self) -> list[Callable[..., Any]]:
        """The bound activity methods, for ``Worker(activities=...)``."""
        return [
            self.acquire_claim,
            self.check_claim,
            self.wait_for_drain,
            self.publish_rounds,
            self.idle_consumers,
            self.set_aside,
            self.release_claim,
        ]

    @activity.defn
    async def acquire_claim(self, req: AcquireRequest) -> ClaimGrant:
        """Take the claim (a new fencing token); moves the experiment paused -> resuming."""
        async with _classified(self.redis, self.reach):
            grant = await fencing.acquire_claim(
                self.redis, _keys(req.ref), req.owner, req.lease_ms, req.request_id, moved_through=req.moved_through
            )
        self.held.report(req.ref, grant.held, req.lease_ms)
        activity.logger.info(
            "claim taken",
            extra={
                "experiment_id": req.ref.experiment_id,
                "token": grant.token,
                "held": grant.held,
                "held_again": grant.held_again,
            },
        )
        return grant

    @activity.defn
    async def check_claim(self, req: CheckRequest) -> ClaimCheck:
        """Check pause state and fencing token; extend the claim's lease."""
        self.watches.left(_replay_key())  # it turns: not in line any more (its promised turn lasts until its publish)
        async with _classified(self.redis, self.reach):
            check = await fencing.check_claim(self.redis, _keys(req.ref), req.token, req.owner, req.lease_ms)
        # a fenced run ends without a release: it stops counting here at once
        self.held.report(req.ref, None if check.fenced or check.fence_lost else check.held, req.lease_ms)
        self.counts.show(req.ref)
        if check.reestablished:
            activity.logger.warning(
                "claim lease had lapsed; re-established for the current token",
                extra={"experiment_id": req.ref.experiment_id, "token": req.token},
            )
        return check

    @activity.defn
    async def wait_for_drain(self, req: DrainWaitRequest) -> DrainWait:
        """Poll the backlog until it falls to the low watermark, within the request's bounds (a short wait).

        On the readings every poll of this worker of the same measurement shares (``redisclient.watch``); a poll may
        stay queued past its bound (``req.queue_seconds``), given its turn by signal ``TURN_SIGNAL``. Without a
        Temporal client (an ``ActivityEnvironment`` given none) it never queues. Once its worker begins to stop, no
        poll queues and every queued one has its turn at once (``_close_at_shutdown``).
        """
        _keys(req.ref)
        wake = _turn_giver(req.wait_id) if req.queue_seconds > 0 else None
        if wake is not None and (self._stopping is None or self._stopping.done()):
            if self._stopping is not None:  # the worker that closed the line stopped: this poll's worker is another
                self.watches.reopen()
            self._stopping = asyncio.create_task(self._close_at_shutdown())
        async with _classified(self.redis, self.reach):
            return await self.watches.wait_for_drain(
                self.redis,
                req.ref.stream,
                req.ref.consumer_group,
                req.threshold,
                req.low_watermark,
                min_seconds=req.min_seconds,
                max_seconds=req.max_seconds,
                poll_seconds=req.poll_seconds,
                missing_group=req.missing_group,
                max_bytes=req.max_bytes,
                groups=req.ref.consumer_groups,
                take=req.take,
                replay=_replay_key(),
                queue_seconds=req.queue_seconds if wake is not None else 0.0,
                wake=wake,
            )

    async def _close_at_shutdown(self) -> None:
        """When the worker begins to stop, close the line (``BacklogWatches.close``): its queued replays go on."""
        await activity.wait_for_worker_shutdown()  # the worker's event: this task runs in a poll's activity context
        await self.watches.close()

    @activity.defn
    async def publish_rounds(self, req: PublishRequest) -> PublishRounds:
        """Move held tasks in rounds of atomic publishes while headroom is left (``publish.publish_rounds``)."""
        async with _classified(self.redis, self.reach):
            rounds = await publish.publish_rounds(
                self.redis, _keys(req.ref), req.ref.consumer_group, req.params, req.ref.consumer_groups
            )
        self.watches.called(_replay_key())  # its turn is taken: the next reading shows what it moved
        self._published(req, rounds.final, rounds.fresh_moved, rounds.fresh_redelivered)
        return rounds

    def _published(self, req: PublishRequest, result: PublishResult, moved_now: int, again_now: int) -> None:
        """Report a publish's held tasks left to the gauge and count the tasks it moved now, and moved again now."""
        fenced = result.status in (PublishStatus.FENCED, PublishStatus.FENCE_LOST, PublishStatus.RELEASED)
        self.held.report(req.ref, None if fenced else result.remaining, req.params.lease_ms)
        self.counts.moved(req.ref, moved_now)
        self.counts.redelivered(req.ref, again_now)

    @activity.defn
    async def idle_consumers(self, req: IdleConsumersRequest) -> list[IdleConsumer]:
        """The consumers holding pending entries of the request's groups while idle for its window.

        Read with ``XINFO CONSUMERS``, and only when a replay is stalled. The groups are names found in
        Redis (a reading's limiting group): any name Redis accepts, not held to the name rule of the
        experiment's own (``_keys``).
        """
        _keys(req.ref)
        async with _classified(self.redis, self.reach):
            return await consumers.idle_consumers(self.redis, req.ref.stream, req.groups, req.min_idle_ms, req.limit)

    @activity.defn
    async def set_aside(self, req: SetAsideRequest) -> SetAside:
        """Move a held task the publish script cannot move into the dead-letter stream.

        The move is fenced and atomic (see ``redisclient.deadletter``).
        """
        async with _classified(self.redis, self.reach):
            result = await deadletter.set_aside(self.redis, _keys(req.ref), req.token, req.entry_id)
        activity.logger.warning(
            "held task set aside: too many fields for the publish script",
            extra={"experiment_id": req.ref.experiment_id, "entry_id": req.entry_id, "status": result.status.value},
        )
        return result

    @activity.defn
    async def release_claim(self, req: ReleaseRequest) -> Release:
        """Release the claim and revoke its token if still current, recording the outcome.

        Returns the release (token 0: nothing released) with the resume's count and the held tasks left.
        """
        self.watches.called(_replay_key())  # it ends: not in line any more
        async with _classified(self.redis, self.reach):
            released = await fencing.release_claim(
                self.redis,
                _keys(req.ref),
                req.token,
                owner=req.owner,
                back_to_paused=req.back_to_paused,
                outcome=req.outcome,
            )
        self.held.report(req.ref, None, 0)
        self.counts.released(req.ref, req.outcome, released)
        if released.repeated:
            message = "claim released before, by this token: its record returned"
        else:
            message = "claim released" if released.token else "no claim to release: none held, or a newer token owns it"
        activity.logger.info(
            message,
            extra={
                "experiment_id": req.ref.experiment_id,
                "token": released.token or req.token,
                "outcome": released.outcome,
                "replayed": released.replayed,
                "remaining": released.remaining,
            },
        )
        return released
