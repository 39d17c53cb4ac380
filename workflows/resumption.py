"""``ResumptionWorkflow``: replay an experiment's held tasks into the task stream, throttled by the
consumer group's backlog (DESIGN.md section 5).

Each turn of the loop:
  1. check the pause state and the fencing token, extending the claim's lease;
  2. measure the backlog (pending + lag of the consumer group);
  3. at or over ``max_backlog_threshold``: a durable ``workflow.sleep(throttle_seconds)``, then back
     to 1, so pause and fencing are re-checked before anything is replayed;
  4. publish the next batch through the atomic script, which re-checks token, pause state and
     backlog itself and moves at most ``min(batch_size, threshold - backlog)`` tasks.
The Redis calls are local activities (short, one history marker each). The run continues as new
after ``turns_per_run`` turns or when Temporal suggests it, carrying the token and the counters.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from redisclient.results import (
        BacklogReading,
        ClaimCheck,
        ClaimGrant,
        ExperimentState,
        PublishResult,
        PublishStatus,
    )
    from workflows.models import (
        ACQUIRE_CLAIM,
        CHECK_CLAIM,
        MEASURE_BACKLOG,
        NON_RETRYABLE_ERROR_TYPES,
        PUBLISH_BATCH,
        RELEASE_CLAIM,
        WORKFLOW_TYPE,
        AcquireRequest,
        BacklogRequest,
        Carry,
        CheckRequest,
        ExperimentRef,
        Outcome,
        Phase,
        Progress,
        PublishRequest,
        ReleaseRequest,
        ResumptionInput,
        ResumptionResult,
    )
    from workflows.throttle import must_wait, room, wait_reason

_Result = TypeVar("_Result")

REDIS_CALL_TIMEOUT = timedelta(seconds=10)
"""start-to-close of one Redis local activity: every script is O(batch + threshold)."""

REDIS_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=4),
    maximum_attempts=6,
    non_retryable_error_types=list(NON_RETRYABLE_ERROR_TYPES),
)
"""A Redis fault (connection refused, timeout, failover, OOM) is retried inside the local activity
for about 6 s of backoff. Retries stay bounded, as local activities' should: they run inside one
workflow task. A fault that outlasts them makes the turn wait on a durable timer and start again
from the top (``_wait_for_redis``), so an outage of any length is waited out, history stays small
and continue-as-new still happens. Faults that retrying cannot mend are not retried."""

RELEASE_RETRY = dataclasses.replace(REDIS_RETRY, maximum_attempts=7)
"""The release gives up after 7 attempts (about 10 s of backoff), so a cancel or a failure ends
even while Redis is away; the claim's lease then lapses and ``xmc status`` reports the experiment
as orphaned. (A local activity's schedule-to-close timeout is not enforced by temporalio 1.35 on
the dev server: attempts bound it, a timeout does not.)"""

FAILED_CALL = (ActivityError, ApplicationError)
"""What a failed call raises in workflow code: an ``ActivityError`` wrapping the cause, or, for a
local activity that failed without retrying, the activity's ``ApplicationError`` itself (measured
with temporalio 1.35)."""


def _permanent(err: BaseException) -> bool:
    """True when a failed call's cause is a fault that retrying cannot mend."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, ApplicationError):
            return cause.non_retryable or cause.type in NON_RETRYABLE_ERROR_TYPES
        cause = getattr(cause, "cause", None) or cause.__cause__
    return False


STALL_WARNING_EVERY = 30
"""Log a warning after this many throttle waits in a row without a task moving."""


@workflow.defn(name=WORKFLOW_TYPE, failure_exception_types=[ValidationError])
class ResumptionWorkflow:
    """Replays held tasks of one experiment; see the module docstring.

    Input ``ResumptionInput``, result ``ResumptionResult``; query ``progress`` -> ``Progress``.
    Cancelling the run interrupts a throttle wait, releases the claim, moves the experiment back
    to ``paused`` (held tasks untouched) and ends the run as cancelled. A bad input fails the run
    at once with a pydantic ``ValidationError`` naming the field (``failure_exception_types``).
    """

    @workflow.init
    def __init__(self, inp: ResumptionInput) -> None:
        carry = inp.carry
        self._progress = Progress(
            experiment_id=inp.experiment_id,
            threshold=inp.max_backlog_threshold,
            token=carry.token if carry else 0,
            replayed=carry.replayed if carry else 0,
            throttles=carry.throttles if carry else 0,
            turns=carry.turns if carry else 0,
            runs=carry.runs + 1 if carry else 1,
        )
        self._seq = carry.seq if carry else 0

    @workflow.query
    def progress(self) -> Progress:
        """Where the replay stands: counters, last backlog reading, throttle state, outcome."""
        return self._progress

    @workflow.run
    async def run(self, inp: ResumptionInput) -> ResumptionResult:
        """Run the resumption loop; see the class docstring."""
        self._input = inp
        self._ref = ExperimentRef(experiment_id=inp.experiment_id, stream=inp.stream, consumer_group=inp.consumer_group)
        meter = workflow.metric_meter().with_additional_attributes({"stream": inp.stream})
        self._replayed_counter = meter.create_counter("xmc_tasks_replayed", "tasks moved into the task stream")
        self._throttle_counter = meter.create_counter("xmc_throttle_waits", "throttle waits taken")
        p = self._progress
        self._owner = inp.carry.owner if inp.carry else workflow.info().workflow_id
        if inp.carry is not None and workflow.info().continued_run_id is None:
            raise ApplicationError(
                "carry: set by the workflow itself when it continues as new; leave it out of the input",
                type="InvalidInput",
                non_retryable=True,
            )
        self._started_at = inp.carry.started_at if inp.carry else workflow.now()
        # drawn once per resumption and carried: every try of the acquire, in any run, is one request
        self._request_id = inp.carry.request_id if inp.carry else str(workflow.uuid4())
        try:
            return await self._loop()
        except asyncio.CancelledError:
            p.outcome = Outcome.CANCELLED
            await self._release(back_to_paused=True)
            self._set_phase(Phase.DONE)
            raise
        except FAILED_CALL:
            # a fault retrying cannot mend: hand the experiment back as paused, then fail the run
            await self._release(back_to_paused=True)
            raise

    @property
    def _token(self) -> int:
        """The fencing token this resumption holds; 0 until the claim is taken."""
        return self._progress.token

    async def _loop(self) -> ResumptionResult:
        """Take the claim, then turn until the resumption ends. A Redis fault that outlasts a call's
        retries waits on a durable timer and starts the step over; the run continues as new after
        ``turns_per_run`` turns, or as many tries of the claim, or when Temporal suggests it (before
        the claim too, carrying token 0)."""
        inp, p = self._input, self._progress
        claim_tries = turns_this_run = 0
        while True:
            if max(claim_tries, turns_this_run) >= inp.turns_per_run or workflow.info().is_continue_as_new_suggested():
                await self._continue_as_new()
            try:
                if not self._token:
                    claim_tries += 1
                    await self._acquire()
                    continue
                turns_this_run += 1
                p.turns += 1
                result = await self._turn()
            except FAILED_CALL as err:
                if _permanent(err):
                    raise
                await self._wait_for_redis(err)
                continue
            if result is not None:
                return result

    async def _acquire(self) -> None:
        """Take the claim. The request ID makes a retry, or an attempt that reaches Redis late,
        return the same token instead of a second claim."""
        inp, p = self._input, self._progress
        self._set_phase(Phase.CLAIMING)
        grant = await self._call(
            ACQUIRE_CLAIM,
            AcquireRequest(ref=self._ref, owner=self._owner, lease_ms=inp.lease_ms, request_id=self._request_id),
            ClaimGrant,
            summary=f"take the claim on experiment {inp.experiment_id}",
        )
        p.token, p.remaining = grant.token, grant.held
        workflow.logger.info(
            "resumption started",
            extra={"experiment_id": inp.experiment_id, "token": grant.token, "held": grant.held},
        )

    async def _turn(self) -> ResumptionResult | None:
        """One turn of the loop; returns the result when the resumption ends, else None."""
        inp, p = self._input, self._progress
        # 1. pause state and fencing token (extends the lease)
        self._set_phase(Phase.CHECKING)
        check = await self._call(
            CHECK_CLAIM,
            CheckRequest(ref=self._ref, token=self._token, owner=self._owner, lease_ms=inp.lease_ms),
            ClaimCheck,
            summary=f"check pause state and fencing token {self._token}",
        )
        p.remaining = check.held
        if check.fenced:
            return self._finish(Outcome.FENCED, detail=f"token {check.current_token} took over")
        if check.state is ExperimentState.PAUSED:
            await self._release(back_to_paused=False)
            return self._finish(Outcome.PAUSED)

        # 2. backlog
        self._set_phase(Phase.MEASURING)
        reading = await self._call(
            MEASURE_BACKLOG,
            BacklogRequest(ref=self._ref, threshold=inp.max_backlog_threshold, missing_group=inp.missing_group),
            BacklogReading,
            summary=f"measure backlog of {inp.consumer_group} on {inp.stream}",
        )
        p.backlog, p.pending, p.lag = reading.backlog, reading.pending, reading.lag

        # 3. throttle, then back to the top
        if must_wait(reading.backlog, inp.max_backlog_threshold):
            await self._throttle(wait_reason(reading.pending, reading.lag, reading.capped, inp.max_backlog_threshold))
            return None

        # 4. publish
        self._set_phase(Phase.PUBLISHING)
        # the seq moves on only once a publish has answered: a publish that failed after its script
        # ran in Redis is asked again with the same seq, and returns its recorded result
        seq = self._seq + 1
        result = await self._call(
            PUBLISH_BATCH,
            PublishRequest(
                ref=self._ref,
                token=self._token,
                seq=seq,
                batch_size=inp.batch_size,
                threshold=inp.max_backlog_threshold,
                owner=self._owner,
                lease_ms=inp.lease_ms,
                missing_group=inp.missing_group,
            ),
            PublishResult,
            summary=f"publish up to {room(reading.backlog, inp.max_backlog_threshold, inp.batch_size)} tasks",
        )
        self._seq = seq
        p.replayed += result.moved
        p.remaining = result.remaining
        if result.status in (PublishStatus.PUBLISHED, PublishStatus.COMPLETED, PublishStatus.THROTTLED):
            # the script measured the backlog before its move
            p.backlog, p.pending, p.lag = result.backlog + result.moved, result.pending, result.lag + result.moved
        if result.moved:
            p.throttles_in_a_row = 0
            self._replayed_counter.add(result.moved)
        if result.status is PublishStatus.COMPLETED:
            await self._release(back_to_paused=False)
            return self._finish(Outcome.COMPLETED)
        if result.status is PublishStatus.PAUSED:
            await self._release(back_to_paused=False)
            return self._finish(Outcome.PAUSED)
        if result.status is PublishStatus.FENCED:
            return self._finish(Outcome.FENCED, detail="a newer token took over before the publish")
        if result.status is PublishStatus.THROTTLED:
            # the backlog grew between the measurement and the publish
            await self._throttle(wait_reason(result.pending, result.lag, False, inp.max_backlog_threshold))
        elif result.status is PublishStatus.STALE:
            # an older seq than the last publish recorded for this token (after a workflow reset):
            # go on from the recorded one
            workflow.logger.warning("publish refused as stale", extra={"seq": seq, "last_seq": result.last_seq})
            self._seq = max(self._seq, result.last_seq)
        return None

    async def _wait_for_redis(self, err: BaseException) -> None:
        """A Redis fault outlasted the local activity's retries: wait on a durable timer, then the
        caller starts over (from the pause and fencing check, for a turn)."""
        inp, p = self._input, self._progress
        p.redis_waits += 1
        p.last_error = str(err)[:300]
        self._set_phase(Phase.REDIS_UNAVAILABLE)
        workflow.logger.warning(
            "Redis unavailable; waiting %gs before the next try",
            inp.throttle_seconds,
            extra={"experiment_id": inp.experiment_id, "error": p.last_error},
        )
        await workflow.sleep(inp.throttle_seconds, summary=f"Redis unavailable: retrying in {inp.throttle_seconds:g}s")

    async def _throttle(self, reason: str) -> None:
        inp, p = self._input, self._progress
        p.throttles += 1
        p.throttles_in_a_row += 1
        p.throttle_reason = reason
        if p.throttles_in_a_row % STALL_WARNING_EVERY == 0:
            workflow.logger.warning(
                "replay stalled: throttled %d times in a row; are the consumers draining the group?",
                p.throttles_in_a_row,
                extra={"experiment_id": inp.experiment_id, "reason": reason},
            )
        p.throttled_until = workflow.now() + timedelta(seconds=inp.throttle_seconds)
        self._throttle_counter.add(1)
        self._set_phase(Phase.THROTTLED)
        workflow.logger.info(
            "throttled",
            extra={"experiment_id": inp.experiment_id, "reason": reason, "seconds": inp.throttle_seconds},
        )
        await workflow.sleep(inp.throttle_seconds, summary=f"throttled {inp.throttle_seconds:g}s: {reason}")
        p.throttled_until = None

    async def _continue_as_new(self) -> None:
        p = self._progress
        await workflow.wait_condition(workflow.all_handlers_finished)
        carry = Carry(
            token=self._token,
            request_id=self._request_id,
            owner=self._owner,
            seq=self._seq,
            replayed=p.replayed,
            throttles=p.throttles,
            turns=p.turns,
            runs=p.runs,
            started_at=self._started_at,
        )
        workflow.logger.info("continuing as new", extra={"experiment_id": p.experiment_id, "turns": p.turns})
        workflow.continue_as_new(self._input.model_copy(update={"carry": carry}))

    async def _release(self, *, back_to_paused: bool) -> None:
        """Release the claim; token 0 (a run cancelled before its acquire's reply was recorded)
        releases whatever claim this workflow owns. Bounded by ``RELEASE_RETRY``."""
        self._set_phase(Phase.RELEASING)
        try:
            await self._call(
                RELEASE_CLAIM,
                ReleaseRequest(ref=self._ref, token=self._token, owner=self._owner, back_to_paused=back_to_paused),
                int,
                summary=f"release the claim (token {self._token or 'of this workflow'})",
                retry_policy=RELEASE_RETRY,
            )
        except FAILED_CALL as err:
            # the lease will lapse on its own; the run's own outcome or failure matters more
            workflow.logger.warning("claim not released", extra={"error": str(err)})

    def _finish(self, outcome: Outcome, detail: str = "") -> ResumptionResult:
        p = self._progress
        p.outcome = outcome
        self._set_phase(Phase.DONE)
        workflow.logger.info(
            "resumption ended",
            extra={
                "experiment_id": p.experiment_id,
                "outcome": outcome.value,
                "replayed": p.replayed,
                "detail": detail,
            },
        )
        return ResumptionResult(
            experiment_id=p.experiment_id,
            outcome=outcome,
            replayed=p.replayed,
            remaining=p.remaining or 0,
            throttles=p.throttles,
            turns=p.turns,
            runs=p.runs,
            token=self._token,
        )

    def _set_phase(self, phase: Phase) -> None:
        """Record the phase and refresh the UI's current details (served by a query)."""
        p = self._progress
        p.phase = phase
        lines = [
            f"**{p.experiment_id}**: {phase.value}" + (f" ({p.outcome.value})" if p.outcome else ""),
            "",  # a blank line, so that markdown renders the list below as a list
            f"- replayed: {p.replayed}, remaining: {'?' if p.remaining is None else p.remaining}",
            f"- backlog: {'?' if p.backlog is None else p.backlog} / threshold {p.threshold}",
            f"- throttle waits: {p.throttles}" + (f", last: {p.throttle_reason}" if p.throttle_reason else ""),
            *([f"- Redis unavailable: {p.redis_waits} waits, last: {p.last_error}"] if p.redis_waits else []),
            *(
                [f"- **stalled**: {p.throttles_in_a_row} waits in a row without progress"]
                if p.throttles_in_a_row >= STALL_WARNING_EVERY
                else []
            ),
            f"- turns: {p.turns}, run {p.runs}, fencing token {p.token}",
        ]
        if phase is Phase.THROTTLED and p.throttled_until:
            lines.append(f"- waiting until {p.throttled_until.isoformat(timespec='seconds')}")
        workflow.set_current_details("\n".join(lines))

    async def _call(
        self,
        name: str,
        arg: BaseModel,
        result_type: type[_Result],
        *,
        summary: str,
        retry_policy: RetryPolicy = REDIS_RETRY,
    ) -> _Result:
        """Run the Redis local activity ``name`` with the shared timeout and ``retry_policy``.

        Raises:
            asyncio.CancelledError: the workflow was cancelled while the call ran or retried (the
                SDK reports that as a failed call caused by cancellation; it must not be taken for
                a Redis fault).
            ActivityError, ApplicationError: the call failed (see ``_permanent``).
        """
        try:
            return await workflow.execute_local_activity(
                name,
                arg,
                result_type=result_type,
                start_to_close_timeout=REDIS_CALL_TIMEOUT,
                retry_policy=retry_policy,
                summary=summary,
            )
        except FAILED_CALL as err:
            if is_cancelled_exception(err):
                raise asyncio.CancelledError() from err
            raise
