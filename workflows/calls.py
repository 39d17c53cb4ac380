"""How ``ResumptionWorkflow`` calls Redis: activities, local within a task's budget (docs/contract.md, "Faults")."""

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

    A local activity, or a regular one when the call, which may last ``longest`` seconds, would pass ``TaskBudget``.

    Raises:
        asyncio.CancelledError: the workflow was cancelled while the call ran or retried (never a Redis fault).
        ActivityError, ApplicationError: the call failed (see ``permanent``).
        pydantic.ValidationError: the result does not match the method's return type.
    """
    budget = getattr(workflow.instance(), "task_budget", None)
    if not isinstance(budget, TaskBudget):
        budget = None
    try:
        if budget is not None and budget.passed_by(longest):
            raw = await workflow.execute_activity(
                activity.__name__,
                arg,
                result_type=None,
                start_to_close_timeout=start_to_close,
                retry_policy=retry_policy,
                summary=summary,
            )
        else:
            raw = await workflow.execute_local_activity(
                activity.__name__,  # the activity's registered name (activity.defn's default)
                arg,
                result_type=None,
                start_to_close_timeout=start_to_close,
                retry_policy=retry_policy,
                summary=summary,
                local_retry_threshold=timedelta(seconds=TASK_BUDGET_SECONDS) if budget else None,
            )
    except FAILED_CALL as err:
        if is_cancelled_exception(err):
            raise asyncio.CancelledError() from err
        raise
    # read here, not by the SDK: a result the workflow cannot read fails the run through ``run``, which hands back
    return cast(_Res, _result_adapter(activity).validate_python(raw))
