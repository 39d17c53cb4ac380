"""How ``ResumptionWorkflow`` calls Redis: activities, local within a task's budget (docs/contract.md, "Faults").

A first attempt that fails with a connection fault goes on as a regular activity on the task queue, which any worker
that reaches Redis takes (``HandOff``): a local activity would keep the replay on a worker cut off from Redis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from pydantic import TypeAdapter
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

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
"""The error types of a Redis connection fault as an activity reports them (redis-py's ``ConnectionError`` and
``TimeoutError``, the classes ``redisclient.connection`` drops stale connections on): a local attempt that fails
with one hands the call on to a regular activity (``HandOff``) instead of retrying on the same worker."""

HAND_OFF_SECONDS = 60.0
"""After a connection fault on a local attempt, the calls run as regular activities for this long (workflow time,
seconds) before a local attempt tries this worker again: each local attempt on a worker cut off from Redis costs a
socket timeout (``XMC_REDIS_TIMEOUT_SECONDS``) before it fails."""

HAND_OFF_ATTEMPTS = 12
"""The attempts of a call handed on (at least): each attempt goes to whichever worker polls first, and one cut off
from Redis fails its attempt within half a second (``activities.resumption.Reachability``), so the next soon reaches
a worker that does."""


def handed_on_retry(policy: RetryPolicy) -> RetryPolicy:
    """``policy`` for a call handed on: retries 100 ms to 1 s apart, ``HAND_OFF_ATTEMPTS`` attempts or more.

    About 10 s of backoff in all, as ``REDIS_RETRY``'s; ``policy``'s attempts if they are more.
    """
    attempts = max(HAND_OFF_ATTEMPTS, policy.maximum_attempts)
    return dataclasses.replace(
        policy,
        initial_interval=timedelta(milliseconds=100),
        backoff_coefficient=1.5,
        maximum_interval=timedelta(seconds=1),
        maximum_attempts=attempts,
    )


FAILED_CALL = (ActivityError, ApplicationError)
"""What a failed call raises in workflow code: an ``ActivityError`` wrapping the cause, or, for a local activity that
failed without retrying, the activity's ``ApplicationError`` itself."""


TASK_BUDGET_SECONDS = 0.5
"""How long one workflow task may run local activities (seconds); a call that could pass it is a regular activity."""

ROUNDS_LOCAL_SECONDS = 0.1
"""How long one ``publish_rounds`` call run as a local activity may start scripts for (seconds)."""

ROUNDS_SECONDS = 0.5
"""How long one ``publish_rounds`` call run as a regular activity may start scripts for (seconds)."""

MAX_SCRIPTS_PER_CALL = 1_000
"""The most publish scripts one ``publish_rounds`` call runs (its time bound usually ends it first)."""


@dataclass
class TaskBudget:
    """How long the current workflow task has been open, from workflow time and history length (both replay the same).

    A workflow instance's ``task_budget`` attribute of this type keeps its calls within ``TASK_BUDGET_SECONDS``.
    """

    history_length: int = -1
    opened_at: datetime | None = None

    def open_for(self, history_length: int, now: datetime) -> float:
        """Seconds the workflow task has been open at workflow time ``now`` (since a call saw ``history_length``)."""
        if history_length != self.history_length or self.opened_at is None:
            self.history_length, self.opened_at = history_length, now
        return (now - self.opened_at).total_seconds()

    def passed_by(self, longest: float) -> bool:
        """Whether a call of ``longest`` seconds would keep the workflow task open past ``TASK_BUDGET_SECONDS``."""
        opened = self.open_for(workflow.info().get_current_history_length(), workflow.now())
        return opened + longest > TASK_BUDGET_SECONDS


@dataclass
class HandOff:
    """Whether the workflow's Redis calls run as regular activities, after a connection fault on a local attempt.

    A workflow whose instance has a ``hand_off`` attribute of this type has its calls handed on (``call``): once a
    local attempt failed with a connection fault (at workflow time ``since``), every call is a regular activity for
    ``HAND_OFF_SECONDS``, then the next tries locally again, and the calls stay local once one succeeds there.
    ``on_fault`` is told of the fault (the workflow shows it in its progress at once), ``on_back`` when the first call
    after it succeeded (on whichever worker). Not carried across continue-as-new: a new run tries locally first.
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
    """True when a failed call's cause is a Redis connection fault (``CONNECTION_FAULTS``)."""
    cause: BaseException | None = err
    while cause is not None:
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
) -> _Res:
    """Run ``activity`` (a method of ``ResumptionActivities``) on ``arg`` and return its validated result.

    A local activity, or a regular one when the call, which may last ``longest`` seconds, would pass ``TaskBudget``,
    or while the calls are handed on (``HandOff``): a first attempt that fails with a connection fault is shown at
    once and the call runs again as a regular activity (the same request: every activity is idempotent).

    Raises:
        asyncio.CancelledError: the workflow was cancelled while the call ran or retried (never a Redis fault).
        ActivityError, ApplicationError: the call failed (see ``permanent``).
        pydantic.ValidationError: the result does not match the method's return type.
    """
    instance = workflow.instance()
    budget = getattr(instance, "task_budget", None)
    if not isinstance(budget, TaskBudget):
        budget = None
    hand_off = getattr(instance, "hand_off", None)
    if not isinstance(hand_off, HandOff):
        hand_off = None

    async def regular(policy: RetryPolicy) -> Any:
        return await workflow.execute_activity(
            activity.__name__,
            arg,
            result_type=None,
            start_to_close_timeout=start_to_close,
            retry_policy=policy,
            summary=summary,
        )

    async def local_activity(policy: RetryPolicy) -> Any:
        return await workflow.execute_local_activity(
            activity.__name__,  # the activity's registered name (activity.defn's default)
            arg,
            result_type=None,
            start_to_close_timeout=start_to_close,
            retry_policy=policy,
            summary=summary,
            local_retry_threshold=timedelta(seconds=TASK_BUDGET_SECONDS) if budget else None,
        )

    handed = hand_off is not None and hand_off.handed_on(workflow.now())
    local = not handed and not (budget is not None and budget.passed_by(longest))
    first = handed_on_retry(retry_policy) if handed else retry_policy
    if hand_off is not None and not handed:  # a connection fault is shown at once, then goes to the task queue
        faults = [*(retry_policy.non_retryable_error_types or ()), *CONNECTION_FAULTS]
        first = dataclasses.replace(retry_policy, non_retryable_error_types=faults)
    try:
        try:
            raw = await (local_activity(first) if local else regular(first))
        except FAILED_CALL as err:
            if hand_off is None or handed or is_cancelled_exception(err) or not connection_fault(err):
                raise
            hand_off.fault(err, workflow.now())
            local = False
            raw = await regular(handed_on_retry(retry_policy))
    except FAILED_CALL as err:
        if is_cancelled_exception(err):
            raise asyncio.CancelledError() from err
        raise
    if hand_off is not None:
        hand_off.succeeded(local=local)
    # read here, not by the SDK: a result the workflow cannot read fails the run through ``run``, which hands back
    return cast(_Res, _result_adapter(activity).validate_python(raw))
