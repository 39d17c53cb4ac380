"""``ResumptionWorkflow``: replay an experiment's held tasks into the task stream (docs/contract.md, "The loop").

Its helpers, each in its own module: docs/development.md, "Layout".
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.exceptions import ApplicationError

# each module by its full name: a submodule named from its package (``from xmc_resumption.workflows import x``)
# would be loaded again in every run's sandbox, the package being the sandbox's own
with workflow.unsafe.imports_passed_through():
    from xmc_resumption.activities.requests import AcquireRequest, CheckRequest, PublishRequest, SetAsideRequest
    from xmc_resumption.activities.resumption import ResumptionActivities
    from xmc_resumption.redisclient.failover import REDELIVERY_FIELD
    from xmc_resumption.redisclient.memory import memory_reason
    from xmc_resumption.redisclient.readings import GroupStatus, MissingGroupPolicy
    from xmc_resumption.redisclient.results import ExperimentState, PublishResult, PublishStatus, ReleaseRecord
    from xmc_resumption.workflows.calls import (
        FAILED_CALL,
        ROUNDS_LOCAL_MARGIN_SECONDS,
        ROUNDS_LOCAL_SECONDS,
        ROUNDS_SECONDS,
        HandOff,
        call,
        failure_text,
        permanent,
    )
    from xmc_resumption.workflows.control import first_error
    from xmc_resumption.workflows.fleet import FAILED as FLEET_FAILED
    from xmc_resumption.workflows.handlers import ControlHandlers
    from xmc_resumption.workflows.models import WORKFLOW_TYPE, Outcome, Phase, ResumptionInput, ResumptionResult
    from xmc_resumption.workflows.release import release_claim
    from xmc_resumption.workflows.throttle import wait_reason
    from xmc_resumption.workflows.waits import Waits

MOVED = (
    PublishStatus.PUBLISHED,
    PublishStatus.COMPLETED,
    PublishStatus.THROTTLED,
    PublishStatus.MEMORY,
    PublishStatus.WAITING_FOR_GROUP,
    PublishStatus.RATE_LIMITED,
)
"""The publish statuses whose result holds the backlog the script measured before its move."""


FAILURE_EXCEPTION_TYPES = [ValidationError, TypeError]
"""What fails a run instead of retrying its first workflow task for ever: a bad input, or the wrong number of inputs."""

INVALID_INPUT = "InvalidInput"
"""``ApplicationError.type`` of a run failed for its input (non-retryable)."""


def parse_input(inp: Any) -> ResumptionInput:
    """The run's input, read from what the data converter decoded (a ``ResumptionInput``, or any JSON value).

    The run takes any JSON so that a bad input reaches this check, not the converter's multi-line, retryable
    ``ValidationError``: it is read as the converter would (JSON mode).

    Raises:
        ApplicationError: non-retryable, type ``INVALID_INPUT``, one line naming the field (docs/contract.md, "Input").
    """
    if isinstance(inp, ResumptionInput):
        return inp
    try:
        return ResumptionInput.model_validate_json(json.dumps(inp))
    except ValidationError as err:
        message = f"invalid input: {first_error(None, err, inp, whole='ResumptionInput')}"
        raise ApplicationError(message, type=INVALID_INPUT, non_retryable=True) from None


@workflow.defn(name=WORKFLOW_TYPE, failure_exception_types=FAILURE_EXCEPTION_TYPES)
class ResumptionWorkflow(ControlHandlers):
    """Replays held tasks of one experiment: docs/contract.md, "The workflow"."""

    @workflow.init
    def __init__(self, inp: ResumptionInput | Any) -> None:
        # the state and the view are built here, not in ``run``: an Update delivered with the start is handled first;
        # a bad input is raised by ``run`` (raised here, it would leave the SDK's run coroutine never awaited)
        try:
            inp = parse_input(inp)
        except ApplicationError as err:
            self._bad_input, inp = err, ResumptionInput.model_construct(experiment_id="")
        super().__init__(inp)
        self._waits = Waits(self._state, self._view)
        self.hand_off = HandOff(on_fault=self._handed_off, on_back=self._reached_again)
        self._phase_before_fault = Phase.CLAIMING

    @workflow.run
    async def run(self, inp: ResumptionInput | Any) -> ResumptionResult:
        """Run the resumption loop; see the class docstring."""
        if self._bad_input is not None:
            raise self._bad_input
        info = workflow.info()
        self._state.begin(info.workflow_id, info.continued_run_id, self.clock.now(), lambda: str(workflow.uuid4()))
        try:
            return await self._loop()
        except asyncio.CancelledError:
            self._state.progress.outcome = Outcome.CANCELLED
            await self._release(back_to_paused=True, outcome=Outcome.CANCELLED)
            self._view.count_outcome(Outcome.CANCELLED)
            self._view.phase(Phase.DONE)
            raise
        except FAILED_CALL:
            await self._fail()  # a fault retrying cannot mend: hand the experiment back as paused, then fail the run
            raise
        except workflow.NondeterminismError:
            raise  # (a sandbox violation too) the workflow task retries, so a fixed worker can go on
        except Exception as err:
            # a fault of the workflow code (or a result it cannot read): fail the run instead of retrying for ever
            await self._fail()
            raise ApplicationError(
                f"{type(err).__name__}: {err}", type="WorkflowCodeError", non_retryable=True
            ) from err

    def _handed_off(self, err: BaseException) -> None:
        """A local call failed with a connection fault: show it at once (docs/contract.md, "Faults")."""
        p = self._state.progress
        p.last_error, p.redis_handoffs = failure_text(err)[:300], p.redis_handoffs + 1
        self._phase_before_fault = p.phase
        self._view.phase(Phase.REDIS_UNAVAILABLE)
        workflow.logger.warning(
            "this worker cannot reach Redis; its calls go to the task queue, for any worker that can",
            extra={"experiment_id": p.experiment_id, "error": p.last_error},
        )

    def _reached_again(self) -> None:
        """A call handed on succeeded: back to the phase the fault interrupted (``_handed_off`` noted it)."""
        if self._state.progress.phase is Phase.REDIS_UNAVAILABLE:
            self._view.phase(self._phase_before_fault)

    async def _fail(self) -> None:
        """Hand the experiment back as paused; show ``failed`` in the fleet view and the outcomes metric."""
        self._state.failed = True
        await self._release(back_to_paused=True, outcome=FLEET_FAILED)
        self._view.count_outcome(FLEET_FAILED)
        self._view.phase(Phase.DONE)

    async def _loop(self) -> ResumptionResult:
        """Take the claim, then turn until the resumption ends, or continue as new (docs/contract.md, "The loop")."""
        state = self._state
        claim_tries = turns_this_run = 0
        run_started = self.clock.now()
        while True:
            if state.stopping:
                await self._release(back_to_paused=True, outcome=Outcome.PAUSED)
                return self._finish(Outcome.PAUSED, detail="stopped by the pause Update")
            inp = state.input
            if (
                max(claim_tries, turns_this_run) >= inp.turns_per_run
                or (self.clock.now() - run_started).total_seconds() >= inp.max_run_seconds
                or self.clock.suggested
                or self.clock.moved_on
            ):
                await self._continue_as_new()
                continue  # it returns only when a pause was accepted meanwhile: stop instead
            try:
                if not state.token:
                    claim_tries += 1
                    await self._acquire()
                    continue
                turns_this_run += 1
                state.progress.turns += 1
                state.wake = False  # an Update accepted from here on ends this turn's durable wait
                # add 0: the counter shows from the first live turn on (the meter skips replayed code)
                self._view.metrics.throttles.add(0, {"policy": state.input.throttle_policy.value})
                result = await self._turn()
            except FAILED_CALL as err:
                if permanent(err):
                    raise
                state.publish_next = False
                await self._waits.redis(err)
                continue
            if result is not None:
                return result

    async def _acquire(self) -> None:
        """Take the claim; the request ID makes a retry, or an attempt that reaches Redis late, get the same token."""
        state = self._state
        inp = state.input
        self._view.phase(Phase.CLAIMING)
        grant = await call(
            ResumptionActivities.acquire_claim,
            AcquireRequest(
                ref=state.ref,
                owner=state.owner,
                lease_ms=inp.lease_ms,
                request_id=state.request_id,
                moved_through=state.progress.last_moved_id,
            ),
            summary=f"take the claim on experiment {inp.experiment_id}",
        )
        state.claimed(grant)
        state.leased(self.clock.now())
        workflow.logger.info(
            "resumption started",
            extra={
                "experiment_id": inp.experiment_id,
                "token": grant.token,
                "held": grant.held,
                "held_again": grant.held_again,
            },
        )
        if grant.held == 0 and grant.previous_state is ExperimentState.RUNNING:
            state.nothing_held = True
        else:
            state.publish_next = True  # the claim checked the state; the publish checks it all again

    async def _turn(self) -> ResumptionResult | None:
        """One turn: check (not right after the claim or a publish that left headroom), publish, wait; the result."""
        state = self._state
        if state.nothing_held:
            # neither paused nor holding tasks: most likely a mistyped experiment ID or stream
            await self._release(back_to_paused=False, outcome=Outcome.NOTHING_HELD)
            return self._finish(Outcome.NOTHING_HELD, detail="the experiment was not paused and holds no tasks")
        if state.publish_next:
            state.publish_next = False
        else:
            ended = await self._check()
            if ended is not None:
                return ended
        return await self._publish()

    async def _check(self) -> ResumptionResult | None:
        """Check the pause state and the fencing token, extending the lease; returns the result when the run ends."""
        state = self._state
        self._view.phase(Phase.CHECKING)
        check = await call(
            ResumptionActivities.check_claim,
            CheckRequest(ref=state.ref, token=state.token, owner=state.owner, lease_ms=state.input.lease_ms),
            summary=f"check pause state and fencing token {state.token}",
        )
        state.checked(check)
        state.leased(self.clock.now())
        if check.fence_lost:
            return self._fence_lost(check.current_token)
        if check.released is not None:
            return self._ended_before(check.released)
        if check.fenced:
            return self._finish(Outcome.FENCED, detail=f"token {check.current_token} took over")
        if check.state is ExperimentState.PAUSED:
            await self._release(back_to_paused=False, outcome=Outcome.PAUSED)
            return self._finish(Outcome.PAUSED)
        return None

    async def _publish(self) -> ResumptionResult | None:
        """Publish in rounds, within the replay's rate cap, then do what the last status asks; the result once ended."""
        state = self._state
        inp, p = state.input, state.progress
        batch, cap = state.batch_size, inp.max_tasks_per_second
        allowed: int | None = None
        if cap is not None:
            allowed = state.bucket.allowance(cap, self.clock.now())
            if allowed < 1:
                seconds = state.bucket.wait_seconds(cap, p.remaining or 1)
                await self._waits.rate(seconds, f"replay cap {cap:g} tasks/s (max_tasks_per_second)")
                return None
            batch = min(batch, allowed)
        self._view.phase(Phase.PUBLISHING)
        # local while ROUNDS_LOCAL_SECONDS fit the task's budget, for what is left of it; else regular
        seconds, budget = ROUNDS_SECONDS, self.clock
        if not budget.passed_by(ROUNDS_LOCAL_SECONDS):
            seconds = max(ROUNDS_LOCAL_SECONDS, budget.left() - ROUNDS_LOCAL_MARGIN_SECONDS)
        params = state.publish_params(batch, allowed, seconds)
        most = min(x for x in (allowed, p.remaining, params.threshold) if x is not None)
        rounds = await call(
            ResumptionActivities.publish_rounds,
            PublishRequest(ref=state.ref, params=params),
            summary=f"publish up to {most} tasks, {batch} a script",
            longest=seconds,
            took=lambda rounds: rounds.seconds,
        )
        state.seq = params.seq + rounds.scripts - 1
        state.leased(self.clock.now())
        replayed_before = p.replayed
        for result in rounds.results():
            p.stream_rate_limit = result.rate_limit or None
            state.stream_capped = result.rate_limited
            state.count(result)  # Redis's count (the metric is the activity's: activities/metrics.py)
            if result.status in MOVED:
                self._view.observe(result.reading, result.moved)  # measured before its move
        redelivered_before = p.redelivered
        state.moved_again(rounds)
        if p.redelivered and not redelivered_before:
            self._redelivery_seen(rounds.first.behind, params.moved_through)
        # a call asked again after a lost reply moved what Redis counted then
        moved = max(rounds.moved, p.replayed - replayed_before)
        if cap is not None:
            state.bucket.take(moved, self.clock.now())
        if moved:
            p.throttles_in_a_row = 0
            state.pacer.published(self.clock.now())
        last = rounds.final
        if last.poison_id:
            await self._set_aside(last.poison_id)
        return await self._after_publish(last)

    def _redelivery_seen(self, behind: int, moved_through: str) -> None:
        """Log once that tasks moved again, marked (docs/contract.md, "Redelivered tasks")."""
        p = self._state.progress
        workflow.logger.error(
            "Redis lost moves this resumption was told of (a crash failover?): tasks moved again, marked %s",
            REDELIVERY_FIELD.decode(),
            extra={
                "experiment_id": p.experiment_id,
                "token": p.token,
                "redelivered": p.redelivered,
                "behind": behind,
                "moved_through": moved_through,
            },
        )

    async def _set_aside(self, entry_id: str) -> None:
        """Move held task ``entry_id``, which stopped the publish, to the dead-letter stream (docs/contract.md)."""
        state = self._state
        p = state.progress
        aside = await call(
            ResumptionActivities.set_aside,
            SetAsideRequest(ref=state.ref, token=state.token, entry_id=entry_id),
            summary=f"set held task {entry_id} aside: too many fields to move by script",
        )
        p.set_aside, p.dead_letter_key = aside.dead, aside.key
        workflow.logger.warning(
            "held task set aside into the dead-letter stream",
            extra={"experiment_id": p.experiment_id, "entry_id": entry_id, "status": aside.status.value},
        )

    async def _after_publish(self, result: PublishResult) -> ResumptionResult | None:
        """What a publish's last status means for the loop: end, wait, publish again, or the next turn."""
        state = self._state
        inp = state.input
        threshold = inp.max_backlog_threshold
        match result.status:
            case PublishStatus.COMPLETED:
                await self._release(back_to_paused=False, outcome=Outcome.COMPLETED)
                return self._finish(Outcome.COMPLETED)
            case PublishStatus.PAUSED:
                await self._release(back_to_paused=False, outcome=Outcome.PAUSED)
                return self._finish(Outcome.PAUSED)
            case PublishStatus.RELEASED:
                return self._ended_before(
                    ReleaseRecord(outcome=result.outcome, replayed=result.replayed, remaining=result.remaining)
                )
            case PublishStatus.FENCED:
                return self._finish(Outcome.FENCED, detail="a newer token took over before the publish")
            case PublishStatus.FENCE_LOST:
                return self._fence_lost(None)
            case PublishStatus.THROTTLED:
                stalled = await self._waits.throttle(result.reading.backlog, wait_reason(result.reading, threshold))
                return await self._end_stalled() if stalled else None
            case PublishStatus.WAITING_FOR_GROUP if (
                result.reading.status is not GroupStatus.OK and inp.missing_group is MissingGroupPolicy.WAIT
            ):
                # the stream or a required group is missing: nothing moved or written
                return await self._end_stalled() if await self._waits.for_group(result.reading) else None
            case PublishStatus.MEMORY:
                # a durable timer of throttle_seconds whatever the policy: an adaptive poll may return at once
                state.hold = memory_reason(result.used_memory, result.maxmemory, inp.max_memory_fraction or 1.0)
                stalled = await self._waits.throttle(result.reading.backlog, state.hold, inp.throttle_seconds)
                return await self._end_stalled() if stalled else None
            case PublishStatus.RATE_LIMITED:
                # the stream-wide cap's bucket holds no whole task: nothing moved
                await self._waits.rate(result.rate_wait_ms / 1000, self._stream_rate_reason(result))
            case PublishStatus.PUBLISHED if result.rate_limited and result.rate_wait_ms > 0:
                # the stream-wide cap cut this move short: wait for the bucket, not for the next publish
                await self._waits.rate(result.rate_wait_ms / 1000, self._stream_rate_reason(result))
            case PublishStatus.STALE:
                # an older seq than the last one recorded for this token (after a workflow reset): go on from it
                workflow.logger.warning(
                    "publish refused as stale", extra={"seq": state.seq, "last_seq": result.last_seq}
                )
                state.seq = max(state.seq, result.last_seq)
            case PublishStatus.PUBLISHED if result.headroom_left > 0:
                state.publish_next = True
            case PublishStatus.PUBLISHED if inp.pacing.adaptive:
                # filled up to the threshold: the adaptive wait measures the drain itself
                backlog = result.reading.backlog + result.moved
                stalled = await self._waits.throttle(backlog, wait_reason(result.reading, threshold, result.moved))
                return await self._end_stalled() if stalled else None
            # else (fixed, headroom filled): the next turn's publish measures again
        return None

    def _stream_rate_reason(self, result: PublishResult) -> str:
        """Why the stream-wide cap holds the replay, for the UI."""
        return f"stream cap {result.rate_limit:g} tasks/s ({{{self._state.input.stream}}}:rate)"

    async def _end_stalled(self) -> ResumptionResult:
        """End the run ``stalled``: a stall outlasted ``max_stall_seconds``; claim released, experiment paused."""
        p = self._state.progress
        await self._release(back_to_paused=True, outcome=Outcome.STALLED)
        return self._finish(Outcome.STALLED, detail=f"no progress for {p.stalled_seconds:g}s: {p.stall_reason}")

    async def _continue_as_new(self) -> None:
        """Hand the state (``RunState.carry``) to the next run once every handler has finished."""
        p = self._state.progress
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._state.stopping:
            return  # the pause Update was accepted while the handlers finished: stop, do not carry on
        workflow.logger.info("continuing as new", extra={"experiment_id": p.experiment_id, "turns": p.turns})
        # a pinned run hands over to the task queue's current Worker Deployment Version here (docs/operating.md)
        workflow.continue_as_new(
            self._state.next_input(), initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE
        )

    async def _release(self, *, back_to_paused: bool, outcome: str) -> None:
        """Release the claim, recording ``outcome`` (``workflows/release.py``); a failure shows as ``release_error``."""
        self._view.phase(Phase.RELEASING)
        self._state.progress.release_error = await release_claim(
            self._state, back_to_paused=back_to_paused, outcome=outcome
        )

    def _ended_before(self, record: ReleaseRecord) -> ResumptionResult:
        """End, as Redis recorded it, a turn run again after its release (completion lost: temporalio/temporal#5921)."""
        outcome = self._state.recorded_release(record)
        return self._finish(outcome, detail="released before, in a workflow task run again: its recorded release")

    def _fence_lost(self, counter: int | None) -> ResumptionResult:
        """End the run ``fence_lost``: the fence counter (``counter``; None: not read) went below this run's token."""
        detail = f"the fence counter is {counter if counter is not None else 'below'} < token {self._state.token}"
        workflow.logger.error(
            "fence counter went back: Redis lost data; stopping without publishing",
            extra={"experiment_id": self._state.progress.experiment_id, "token": self._state.token, "counter": counter},
        )
        return self._finish(Outcome.FENCE_LOST, detail=detail)

    def _finish(self, outcome: Outcome, detail: str = "") -> ResumptionResult:
        """End the run with ``outcome``: count it, show it, log it, and return the result."""
        p = self._state.progress
        p.outcome = outcome
        self._view.count_outcome(outcome.value)
        self._view.phase(Phase.DONE)
        workflow.logger.info(
            "resumption ended",
            extra={
                "experiment_id": p.experiment_id,
                "token": self._state.token,
                "outcome": outcome.value,
                "replayed": p.replayed,
                "remaining": p.remaining,
                "throttles": p.throttles,
                "redelivered": p.redelivered,
                "detail": detail,
            },
        )
        return self._state.result()
