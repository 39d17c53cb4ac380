"""How ``ResumptionWorkflow`` calls Redis: activities, local within a task's budget (docs/contract.md, "Faults")."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import typing
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from pydantic import TypeAdapter
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType, is_cancelled_exception
from temporalio.exceptions import TimeoutError as AttemptTimeout

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.activities.errors import NON_RETRYABLE_ERROR_TYPES
    from xmc_resumption.activities.resumption import ResumptionActivities

_Req = TypeVar("_Req")
_Res = TypeVar("_Res")

REDIS_CALL_TIMEOUT = timedelta(seconds=10)
"""start-to-close of one Redis call: every script is O(batch + threshold); a poll gets its bound on top."""

REDIS_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=4),
    maximum_attempts=6,
    non_retryable_error_types=list(NON_RETRYABLE_ERROR_TYPES),
)
"""A Redis fault is retried for about 6 s of backoff, then waited out (``Waits.redis``; docs/contract.md, "Faults")."""

RELEASE_RETRY = dataclasses.replace(REDIS_RETRY, maximum_attempts=7)
"""One round of release tries: 7 attempts, about 10 s of backoff (docs/contract.md, "Faults")."""

CONNECTION_FAULTS = ("ConnectionError", "TimeoutError")
"""The error types of a Redis connection fault (redis-py's): they hand the calls on (``HandOff``), as timeouts do."""

HAND_OFF_SECONDS = 60.0
"""How long the calls stay handed on after a connection fault (workflow time, seconds; docs/contract.md, "Faults")."""

HAND_OFF_ATTEMPTS = 12
"""The least attempts of a call handed on: each goes to whichever worker polls first (docs/contract.md, "Faults")."""


def handed_on_retry(policy: RetryPolicy) -> RetryPolicy:
    """``policy`` for a call handed on: retries 100 ms to 1 s apart, ``HAND_OFF_ATTEMPTS`` attempts or more."""
    attempts = max(HAND_OFF_ATTEMPTS, policy.maximum_attempts)
    return dataclasses.replace(
        policy,
        initial_interval=timedelta(milliseconds=100),
        backoff_coefficient=1.5,
        maximum_interval=timedelta(seconds=1),
        maximum_attempts=attempts,
    )


FAILED_CALL = (ActivityError, ApplicationError)
"""What a failed call raises: an ``ActivityError``, or a local activity's own ``ApplicationError``."""


TASK_BUDGET_SECONDS = 0.5
"""How long one workflow task may run local activities (seconds); a call that could pass it is a regular activity."""

ROUNDS_LOCAL_SECONDS = 0.1
"""The least budget left for a ``publish_rounds`` call to run as a local activity (seconds).

Such a call starts scripts for what is left of the budget, less ``ROUNDS_LOCAL_MARGIN_SECONDS``: one call a workflow
task, not one every 0.1 s (each call costs the worker about 5-10 ms between two:
docs/benchmarks.md, "Large batches (issue 25 item 3)").
"""

ROUNDS_LOCAL_MARGIN_SECONDS = 0.05
"""What a local ``publish_rounds`` call leaves of the task's budget: the last script it starts (at most 50 ms)."""

ROUNDS_SECONDS = 0.5
"""How long one ``publish_rounds`` call run as a regular activity may start scripts for (seconds)."""

MAX_SCRIPTS_PER_CALL = 1_000
"""The most publish scripts one ``publish_rounds`` call runs (its time bound usually ends it first)."""

LOCAL_CALL_SECONDS = 0.005
"""What a local call that does not report its own time counts against the budget (seconds): a short Redis call's
usual 2.6-3 ms, rounded up (docs/development.md, "Temporal facts")."""


@dataclass
class TaskClock:
    """Workflow time and the server's continue-as-new hints as a run and its replay both see them; the local budget.

    ``workflow.now()`` and the hints are read only where the workflow waited on the server (``sync``: the run's start,
    a regular activity, a timer, a signal), where a run and its replay stand at the same workflow task; from there the
    clock moves on by what the local calls report (``charge``). Read just after a local activity, ``workflow.now()``
    and the history length need not replay alike (docs/development.md, "Temporal facts"): a choice of a command taken
    from them broke a replay. An Update handler, which runs at its workflow task's start, reads ``workflow.now()``
    (``handling``).
    """

    synced_at: datetime | None = None
    spent: float = 0.0
    """Seconds the local calls reported since ``synced_at``: what the workflow task's budget has spent."""
    suggested: bool = False
    """``is_continue_as_new_suggested()`` at ``synced_at``."""
    moved_on: bool = False
    """``is_target_worker_deployment_version_changed()`` at ``synced_at``."""
    handler_now: datetime | None = None

    def now(self) -> datetime:
        """Workflow time: ``synced_at`` plus the local calls' ``spent`` (an Update handler's own time while it runs)."""
        if self.handler_now is not None:
            return self.handler_now
        if self.synced_at is None:
            self.sync()
        assert self.synced_at is not None
        return self.synced_at + timedelta(seconds=self.spent)

    def sync(self) -> None:
        """The workflow waited on the server: read the time and the hints again; the budget starts again."""
        info = workflow.info()
        self.synced_at, self.spent = workflow.now(), 0.0
        self.suggested = info.is_continue_as_new_suggested()
        self.moved_on = info.is_target_worker_deployment_version_changed()

    @contextlib.contextmanager
    def handling(self) -> Iterator[None]:
        """Within an Update handler: ``now`` is ``workflow.now()``, the handler's workflow task's start."""
        self.handler_now = workflow.now()
        try:
            yield
        finally:
            self.handler_now = None

    def passed_by(self, longest: float) -> bool:
        """Whether a call of ``longest`` seconds would take the local time past ``TASK_BUDGET_SECONDS``."""
        return self.spent + longest > TASK_BUDGET_SECONDS

    def left(self) -> float:
        """What is left of ``TASK_BUDGET_SECONDS`` (seconds; negative once passed)."""
        return TASK_BUDGET_SECONDS - self.spent

    def charge(self, seconds: float) -> None:
        """Count a local call of ``seconds`` (at least ``LOCAL_CALL_SECONDS``)."""
        self.spent += max(LOCAL_CALL_SECONDS, seconds)


def clock() -> TaskClock:
    """The running ``ResumptionWorkflow``'s ``TaskClock``."""
    return cast(TaskClock, workflow.instance().clock)


def now() -> datetime:
    """Workflow time as a replay sees it too: ``TaskClock.now`` of the running ``ResumptionWorkflow``."""
    return clock().now()


def waited() -> None:
    """The running ``ResumptionWorkflow`` waited on the server: ``TaskClock.sync``."""
    clock().sync()


@dataclass
class HandOff:
    """Whether the Redis calls run as regular activities, after a connection fault (docs/contract.md, "Faults").

    ``on_fault`` is told of the fault, ``on_back`` when the first call after it succeeded; a new run starts local.
    """

    remote: bool = False
    since: datetime | None = None
    told_back: bool = True
    on_fault: Callable[[BaseException], None] | None = None
    on_back: Callable[[], None] | None = None

    def handed_on(self, now: datetime) -> bool:
        """Whether a call at workflow time ``now`` runs as a regular activity."""
        return self.remote and self.since is not None and (now - self.since).total_seconds() < HAND_OFF_SECONDS

    def fault(self, err: BaseException, now: datetime) -> None:
        """Hand the calls on from ``now`` on, after ``err``."""
        self.remote, self.since, self.told_back = True, now, False
        if self.on_fault is not None:
            self.on_fault(err)

    def succeeded(self, *, local: bool) -> None:
        """A call succeeded (``local``: as a local activity, so on this worker: calls stay local)."""
        if not self.told_back:
            self.told_back = True
            if self.on_back is not None:
                self.on_back()
        if local:
            self.remote = False


def connection_fault(err: BaseException) -> bool:
    """True when a failed call's cause is a Redis connection fault (``CONNECTION_FAULTS``) or start-to-close timeout."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, AttemptTimeout):
            return cause.type == TimeoutType.START_TO_CLOSE
        if isinstance(cause, ApplicationError):
            return cause.type in CONNECTION_FAULTS
        cause = getattr(cause, "cause", None) or cause.__cause__
    return False


@functools.cache
def _result_adapter(activity: Callable[..., Any]) -> TypeAdapter[Any]:
    """A pydantic adapter for the return type of activity method ``activity``."""
    return TypeAdapter(typing.get_type_hints(activity)["return"])


def failure_text(err: BaseException) -> str:
    """What a failed call's fault says: its cause's message, not the wrapper's ("Activity task failed")."""
    while isinstance(err, ActivityError) and err.cause is not None:
        err = err.cause
    return str(err)


def permanent(err: BaseException) -> bool:
    """True when a failed call's cause is a fault that retrying cannot mend."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, ApplicationError):
            return cause.non_retryable or cause.type in NON_RETRYABLE_ERROR_TYPES
        cause = getattr(cause, "cause", None) or cause.__cause__
    return False


async def call(
    activity: Callable[[ResumptionActivities, _Req], Awaitable[_Res]],
    arg: _Req,
    *,
    summary: str,
    retry_policy: RetryPolicy = REDIS_RETRY,
    start_to_close: timedelta = REDIS_CALL_TIMEOUT,
    longest: float = 0.0,
    took: Callable[[_Res], float] | None = None,
) -> _Res:
    """Run ``activity`` (a method of ``ResumptionActivities``) on ``arg`` and return its validated result.

    A regular activity when the call (up to ``longest`` seconds) would pass the task's budget (``TaskClock``), or
    ``HandOff`` says so. A local call moves the clock on by ``took(result)`` (its own measure of its seconds), else
    ``LOCAL_CALL_SECONDS``; a regular one syncs it.

    Raises:
        asyncio.CancelledError: the workflow was cancelled while the call ran or retried (never a Redis fault).
        ActivityError, ApplicationError: the call failed (see ``permanent``).
        pydantic.ValidationError: the result does not match the method's return type.
    """
    instance = workflow.instance()  # a ResumptionWorkflow: the only workflow that calls Redis
    budget: TaskClock = instance.clock
    hand_off: HandOff = instance.hand_off
    options: dict[str, Any] = {"result_type": None, "start_to_close_timeout": start_to_close, "summary": summary}
    handed = hand_off.handed_on(budget.now())
    local = not handed and not budget.passed_by(longest)
    if handed:
        first = handed_on_retry(retry_policy)
    else:  # a connection fault is shown at once, then goes to the task queue
        faults = [*(retry_policy.non_retryable_error_types or ()), *CONNECTION_FAULTS]
        first = dataclasses.replace(retry_policy, non_retryable_error_types=faults)
    try:
        try:
            if local:
                threshold = timedelta(seconds=TASK_BUDGET_SECONDS)
                raw = await workflow.execute_local_activity(
                    activity.__name__, arg, retry_policy=first, local_retry_threshold=threshold, **options
                )
            else:
                raw = await workflow.execute_activity(activity.__name__, arg, retry_policy=first, **options)
        except FAILED_CALL as err:
            if handed or is_cancelled_exception(err) or not connection_fault(err):
                raise
            budget.charge(0.0) if local else budget.sync()
            hand_off.fault(err, budget.now())
            local = False
            raw = await workflow.execute_activity(
                activity.__name__, arg, retry_policy=handed_on_retry(retry_policy), **options
            )
    except FAILED_CALL as err:
        budget.charge(0.0) if local else budget.sync()
        if is_cancelled_exception(err):
            raise asyncio.CancelledError() from err
        raise
    hand_off.succeeded(local=local)
    # read here, not by the SDK: a result the workflow cannot read fails the run through ``run``, which hands back
    result = cast(_Res, _result_adapter(activity).validate_python(raw))
    if local:
        budget.charge(took(result) if took is not None else 0.0)
    else:
        budget.sync()
    return result
