"""``ResumptionWorkflow``: replay an experiment's held tasks into the task stream, throttled by the
consumer group's backlog (DESIGN.md section 5).

Each turn of the loop:
  1. check the pause state and the fencing token, extending the claim's lease;
  2. measure the backlog (pending + lag of the consumer group);
  3. wait while the backlog is at or over ``max_backlog_threshold`` (how long and how is the
     throttle policy's choice, ``workflows/throttle.py``), then back to 1, so pause and fencing
     are re-checked before anything is replayed;
  4. publish the next batch through the atomic script, which re-checks token, pause state and
     backlog itself and moves at most ``min(batch_size, threshold - backlog)`` tasks.
A publish that left headroom is followed at once by the next publish: the script re-checks
everything 1, 2 and 4 need in the same step as its move, so such a turn is one Redis call. Under
the adaptive policy a publish that filled the headroom goes straight to the wait, which measures
the drain itself; under the fixed one the next turn measures again, as the seed's rule does. The
Redis calls are local activities (short, one history marker each). The run continues as new after
``turns_per_run`` turns or when
Temporal suggests it, carrying the token, the counters and what the pacing measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import typing
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from pydantic import TypeAdapter, ValidationError
from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.activities.errors import NON_RETRYABLE_ERROR_TYPES
    from xmc_resumption.activities.requests import (
        AcquireRequest,
        BacklogRequest,
        CheckRequest,
        DrainWaitRequest,
        ExperimentRef,
        PublishRequest,
        ReleaseRequest,
        SetAsideRequest,
    )
    from xmc_resumption.activities.resumption import ResumptionActivities
    from xmc_resumption.redisclient.memory import memory_reason
    from xmc_resumption.redisclient.results import BacklogReading, ExperimentState, PublishResult, PublishStatus
    from xmc_resumption.workflows import fleet, metrics
    from xmc_resumption.workflows.eta import NetRate, eta_seconds
    from xmc_resumption.workflows.models import (
        WORKFLOW_TYPE,
        Carry,
        Control,
        ControlChange,
        EffectiveSettings,
        Outcome,
        Phase,
        Progress,
        ResumptionInput,
        ResumptionResult,
        ThrottlePolicy,
    )
    from xmc_resumption.workflows.ratecap import TaskBucket
    from xmc_resumption.workflows.throttle import (
        POLL_LIMIT_SECONDS,
        Pacer,
        StallWatch,
        WaitKind,
        WaitPlan,
        wait_reason,
    )

_Req = TypeVar("_Req")
_Res = TypeVar("_Res")

REDIS_CALL_TIMEOUT = timedelta(seconds=10)
"""start-to-close of one Redis local activity: every script is O(batch + threshold). A bounded
poll (``wait_for_drain``) gets its bound on top."""

FLEET_SEARCH_ATTRIBUTES = "fleet-search-attributes"
"""``workflow.patched`` ID of the fleet view's search attribute upserts (``workflows/fleet.py``):
runs recorded before them replay without."""

FLEET_REFRESH = timedelta(seconds=30)
"""While the fleet phase stays the same, ``XmcReplayed`` and ``XmcRemaining`` are refreshed at most
this often (workflow time): each upsert is one history event."""

CHAINED_PUBLISH = "chained-publish"
"""``workflow.patched`` ID of the cheap turn: a publish that left headroom is followed by the next
publish without a check and a measurement in between (and, adaptive, one that filled it goes
straight to the wait). Runs recorded before it (tests/histories/v0_*, v1_*) replay on the old path."""

RATE_CAP = "rate-cap"
"""``workflow.patched`` ID of the rate cap's waits (``_rate_wait``): a run that waited for a rate
cap's bucket records it once. Runs recorded before the cap existed never reach a rate wait (their
input has no ``max_tasks_per_second`` and their publish results no ``rate_limited``)."""

MIN_RATE_WAIT_SECONDS = 0.01
"""The shortest rate wait (seconds); the longest is half the claim's lease, so the lease, extended
once per turn, outlasts it (a longer wait for a bucket is taken in several)."""

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


@functools.cache
def _result_adapter(activity: Callable[..., Any]) -> TypeAdapter[Any]:
    """A pydantic adapter for the return type of activity method ``activity``."""
    return TypeAdapter(typing.get_type_hints(activity)["return"])


def _permanent(err: BaseException) -> bool:
    """True when a failed call's cause is a fault that retrying cannot mend."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, ApplicationError):
            return cause.non_retryable or cause.type in NON_RETRYABLE_ERROR_TYPES
        cause = getattr(cause, "cause", None) or cause.__cause__
    return False


@workflow.defn(name=WORKFLOW_TYPE, failure_exception_types=[ValidationError, TypeError])
class ResumptionWorkflow:
    """Replays held tasks of one experiment; see the module docstring.

    Input ``ResumptionInput``, result ``ResumptionResult``; query ``progress`` -> ``Progress``.
    Cancelling the run interrupts a throttle wait, releases the claim, moves the experiment back
    to ``paused`` (held tasks untouched) and ends the run as cancelled. A bad input fails the run
    at once with a pydantic ``ValidationError`` naming the field, and the wrong number of inputs
    (two ``--input`` flags from the Temporal CLI, or none) with a ``TypeError`` saying so: both
    are ``failure_exception_types``, raised before ``run`` starts, so they fail the run instead of
    retrying its first workflow task for ever.
    """

    @workflow.init
    def __init__(self, inp: ResumptionInput) -> None:
        carry = inp.carry
        self._input = inp
        self._progress = Progress(
            experiment_id=inp.experiment_id,
            threshold=inp.max_backlog_threshold,
            policy=inp.throttle_policy,
            token=carry.token if carry else 0,
            replayed=carry.replayed if carry else 0,
            throttles=carry.throttles if carry else 0,
            turns=carry.turns if carry else 0,
            runs=carry.runs + 1 if carry else 1,
            drain_rate=carry.drain_rate if carry else None,
            max_tasks_per_second=inp.max_tasks_per_second,
        )
        self._seq = carry.seq if carry else 0
        self._net = carry.net_rate.model_copy() if carry and carry.net_rate else NetRate()
        """The net drain rate behind the ETA (``workflows/eta.py``)."""
        self._bucket = carry.rate_bucket.model_copy() if carry and carry.rate_bucket else TaskBucket()
        """The ``max_tasks_per_second`` bucket (``workflows/ratecap.py``)."""
        self._pacer = Pacer(
            adaptive=inp.throttle_policy is ThrottlePolicy.ADAPTIVE,
            threshold=inp.max_backlog_threshold,
            throttle_seconds=inp.throttle_seconds,
            min_wait=inp.min_wait_seconds,
            max_wait=inp.longest_wait_seconds,
            rate=carry.drain_rate if carry else None,
            reaction=carry.reaction_seconds if carry else None,
        )
        self._stall = StallWatch(
            inp.stall_window_seconds,
            inp.max_stall_seconds,
            progress_at=carry.progress_at if carry else None,
            last=carry.stall_reading if carry else None,
        )
        self._publish_next = False
        """The last publish left headroom: the next turn publishes without a check and a measurement."""
        self._nothing_held = False
        """The claim found the experiment running and holding nothing: the run ends ``nothing_held``."""
        self._stopping = False
        """The ``pause`` Update was accepted: the run ends ``paused`` at its next turn."""
        self._failed = False
        """The run is failing (a fault retrying cannot mend, or a fault of the workflow code)."""
        self._wake = False
        """An accepted Update ends the durable throttle wait in progress, if any."""
        self._fleet_shown: tuple[str, datetime] | None = None
        """The fleet phase last upserted and when (workflow time); None before the first upsert."""
        self._fleet_counts: tuple[int, int | None] = (0, None)
        """The (replayed, remaining) last upserted."""

    # -- control: validated Updates (workflows/models.py Control); a rejected one leaves no event

    @workflow.update(name=Control.CONFIGURE)
    def configure(self, change: ControlChange) -> EffectiveSettings:
        """Change settings of the running replay; returns the effective settings. An accepted
        change wakes a durable throttle wait, so the next turn (check, measure, publish) runs
        under it at once; it is carried across continue-as-new (it is part of the input)."""
        return self._apply(change)

    @configure.validator
    def _check_configure(self, change: ControlChange) -> None:
        self._validate(change)

    @workflow.update(name=Control.SET_THRESHOLD)
    def set_threshold(self, value: int) -> EffectiveSettings:
        """``configure`` with ``max_backlog_threshold`` only (entries)."""
        return self._apply(ControlChange(max_backlog_threshold=value))

    @set_threshold.validator
    def _check_threshold(self, value: int) -> None:
        self._validate(ControlChange(max_backlog_threshold=value))

    @workflow.update(name=Control.SET_BATCH_SIZE)
    def set_batch_size(self, value: int) -> EffectiveSettings:
        """``configure`` with ``batch_size`` only (entries)."""
        return self._apply(ControlChange(batch_size=value))

    @set_batch_size.validator
    def _check_batch_size(self, value: int) -> None:
        self._validate(ControlChange(batch_size=value))

    @workflow.update(name=Control.SET_THROTTLE_SECONDS)
    def set_throttle_seconds(self, value: float) -> EffectiveSettings:
        """``configure`` with ``throttle_seconds`` only (seconds)."""
        return self._apply(ControlChange(throttle_seconds=value))

    @set_throttle_seconds.validator
    def _check_throttle_seconds(self, value: float) -> None:
        self._validate(ControlChange(throttle_seconds=value))

    @workflow.update(name=Control.SET_THROTTLE_POLICY)
    def set_throttle_policy(self, value: ThrottlePolicy) -> EffectiveSettings:
        """``configure`` with ``throttle_policy`` only (``fixed`` or ``adaptive``)."""
        return self._apply(ControlChange(throttle_policy=value))

    @set_throttle_policy.validator
    def _check_throttle_policy(self, value: ThrottlePolicy) -> None:
        self._validate(ControlChange(throttle_policy=value))

    @workflow.update(name=Control.SET_MAX_TASKS_PER_SECOND)
    def set_max_tasks_per_second(self, value: float) -> EffectiveSettings:
        """``configure`` with ``max_tasks_per_second`` only (tasks per second; 0 removes the cap)."""
        return self._apply(ControlChange(max_tasks_per_second=value))

    @set_max_tasks_per_second.validator
    def _check_max_tasks_per_second(self, value: float) -> None:
        self._validate(ControlChange(max_tasks_per_second=value))

    @workflow.update(name=Control.PAUSE)
    def pause(self) -> EffectiveSettings:
        """Graceful stop: the run ends ``paused`` at its next turn (a durable throttle wait ends at
        once): claim released, experiment back to paused, held tasks kept for a later resume."""
        self._stopping = self._wake = self._progress.stopping = True
        workflow.logger.info("pause requested", extra={"experiment_id": self._input.experiment_id})
        self._set_phase(self._progress.phase)
        return EffectiveSettings.of(self._input, stopping=True)

    @pause.validator
    def _check_pause(self) -> None:
        self._validate(ControlChange())

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """Any signal: this workflow takes none. Logged, so a misdirected one is not silently lost."""
        workflow.logger.warning(
            "signal %r ignored: this workflow is controlled by Updates (%s)",
            name,
            ", ".join(c.value for c in Control),
            extra={"experiment_id": self._input.experiment_id},
        )

    def _validate(self, change: ControlChange) -> None:
        """An Update's validator: refuse once the run is ending, or a change that breaks a bound
        or a rule of ``ResumptionInput``. Raises ``ApplicationError`` (one line naming the field)."""
        if self._progress.outcome is not None or self._stopping:
            raise ApplicationError("the resumption is ending; nothing to change", type="ResumptionEnding")
        try:
            change.applied_to(self._input)
        except ValidationError as err:
            first = err.errors()[0]
            field = ".".join(str(x) for x in first["loc"]) or "input"
            raise ApplicationError(f"{field}: {first['msg']}", type="InvalidControl") from None

    def _apply(self, change: ControlChange) -> EffectiveSettings:
        """Apply a validated change: input, pacer and progress; wake a durable throttle wait."""
        inp = self._input = change.applied_to(self._input)
        pacer, p = self._pacer, self._progress
        pacer.adaptive = inp.throttle_policy is ThrottlePolicy.ADAPTIVE
        pacer.threshold, pacer.throttle_seconds = inp.max_backlog_threshold, inp.throttle_seconds
        pacer.max_wait = inp.longest_wait_seconds
        p.threshold, p.policy = inp.max_backlog_threshold, inp.throttle_policy
        p.max_tasks_per_second = inp.max_tasks_per_second
        p.settings_changes += 1
        self._wake = True
        workflow.logger.info(
            "settings changed",
            extra={"experiment_id": inp.experiment_id, **change.model_dump(mode="json", exclude_none=True)},
        )
        self._set_phase(p.phase)
        return EffectiveSettings.of(inp, stopping=self._stopping)

    @workflow.query
    def progress(self) -> Progress:
        """Where the replay stands: counters, last backlog reading, pacing, stall, outcome."""
        return self._progress

    @workflow.run
    async def run(self, inp: ResumptionInput) -> ResumptionResult:
        """Run the resumption loop; see the class docstring."""
        self._ref = ExperimentRef(experiment_id=inp.experiment_id, stream=inp.stream, consumer_group=inp.consumer_group)
        meter = workflow.metric_meter().with_additional_attributes(
            {"stream": inp.stream, "consumer_group": inp.consumer_group}
        )
        self._replayed_counter = meter.create_counter(metrics.REPLAYED, "tasks moved into the task stream", "tasks")
        self._throttle_counter = meter.create_counter(metrics.THROTTLES, "throttle waits taken")
        self._wait_histogram = meter.create_histogram_float(metrics.THROTTLE_WAIT, "planned throttle wait", "s")
        self._outcome_counter = meter.create_counter(metrics.OUTCOMES, "resumptions ended, by outcome")
        self._backlog_gauge = meter.create_gauge(metrics.BACKLOG, "consumer group backlog at the last reading")
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
            self._progress.outcome = Outcome.CANCELLED
            self._outcome_counter.add(1, {"outcome": Outcome.CANCELLED.value})
            await self._release(back_to_paused=True)
            self._set_phase(Phase.DONE)
            raise
        except FAILED_CALL:
            # a fault retrying cannot mend: hand the experiment back as paused, then fail the run
            await self._fail()
            raise
        except workflow.NondeterminismError:
            raise  # (a sandbox violation too) the workflow task retries, so a fixed worker can go on
        except Exception as err:
            # a fault of the workflow code itself (or of a result it cannot read): fail the run and
            # hand the experiment back, instead of retrying the workflow task for ever. (A
            # nondeterminism error is not raised here: it still retries, so a fixed worker can
            # take the run over.)
            await self._fail()
            raise ApplicationError(
                f"{type(err).__name__}: {err}", type="WorkflowCodeError", non_retryable=True
            ) from err

    async def _fail(self) -> None:
        """The run is failing: hand the experiment back as paused, and show ``failed`` in the fleet
        view (``XmcPhase`` and ``XmcOutcome``) and the outcome counter."""
        self._failed = True
        self._outcome_counter.add(1, {"outcome": fleet.FAILED})
        await self._release(back_to_paused=True)
        self._set_phase(Phase.DONE)

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
            if self._stopping:
                return await self._stop()
            if max(claim_tries, turns_this_run) >= inp.turns_per_run or workflow.info().is_continue_as_new_suggested():
                await self._continue_as_new()
                continue  # it returns only when a pause was accepted meanwhile: stop instead
            try:
                if not self._token:
                    claim_tries += 1
                    await self._acquire()
                    continue
                turns_this_run += 1
                p.turns += 1
                self._wake = False  # an Update accepted from here on ends this turn's durable wait
                # adding 0 shows the counters from the first live turn on (a worker that took the
                # run over after a restart, too: the meter skips replayed code), not first at a move
                self._replayed_counter.add(0)
                self._throttle_counter.add(0, {"policy": p.policy.value})
                result = await self._turn()
            except FAILED_CALL as err:
                if _permanent(err):
                    raise
                self._publish_next = False
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
            ResumptionActivities.acquire_claim,
            AcquireRequest(ref=self._ref, owner=self._owner, lease_ms=inp.lease_ms, request_id=self._request_id),
            summary=f"take the claim on experiment {inp.experiment_id}",
        )
        p.token, p.remaining = grant.token, grant.held
        workflow.logger.info(
            "resumption started",
            extra={"experiment_id": inp.experiment_id, "token": grant.token, "held": grant.held},
        )
        if grant.held == 0 and grant.previous_state is ExperimentState.RUNNING:
            self._nothing_held = True

    async def _stop(self) -> ResumptionResult:
        """The ``pause`` Update: release the claim, experiment back to paused, held tasks kept."""
        await self._release(back_to_paused=True)
        return self._finish(Outcome.PAUSED, detail="stopped by the pause Update")

    async def _turn(self) -> ResumptionResult | None:
        """One turn: check, measure, wait or publish (a turn right after a publish that left
        headroom only publishes). Returns the result when the resumption ends, else None."""
        if self._publish_next:
            self._publish_next = False
            return await self._publish()
        if self._nothing_held:
            # neither paused nor holding tasks: most likely a mistyped experiment ID or stream
            await self._release(back_to_paused=False)
            return self._finish(Outcome.NOTHING_HELD, detail="the experiment was not paused and holds no tasks")
        ended = await self._check()
        if ended is not None:
            return ended
        reading = await self._measure()
        if reading.headroom == 0:
            reason = wait_reason(reading.pending, reading.lag, reading.capped, reading.threshold, reading.bytes_capped)
            return await self._wait(reading.backlog, reason)
        return await self._publish()

    async def _check(self) -> ResumptionResult | None:
        """Step 1: pause state and fencing token (extends the lease). Returns the result when the
        run ends here (fenced, or paused: claim released), else None."""
        inp, p = self._input, self._progress
        self._set_phase(Phase.CHECKING)
        check = await self._call(
            ResumptionActivities.check_claim,
            CheckRequest(ref=self._ref, token=self._token, owner=self._owner, lease_ms=inp.lease_ms),
            summary=f"check pause state and fencing token {self._token}",
        )
        p.remaining = check.held
        if check.fence_lost:
            return self._fence_lost(check.current_token)
        if check.fenced:
            return self._finish(Outcome.FENCED, detail=f"token {check.current_token} took over")
        if check.state is ExperimentState.PAUSED:
            await self._release(back_to_paused=False)
            return self._finish(Outcome.PAUSED)
        return None

    async def _measure(self) -> BacklogReading:
        """Step 2: the consumer group's backlog, capped against the threshold."""
        inp = self._input
        self._set_phase(Phase.MEASURING)
        reading = await self._call(
            ResumptionActivities.measure_backlog,
            BacklogRequest(
                ref=self._ref,
                threshold=inp.max_backlog_threshold,
                missing_group=inp.missing_group,
                max_bytes=inp.max_bytes_per_call,
            ),
            summary=f"measure backlog of {inp.consumer_group} on {inp.stream}",
        )
        self._observe(reading.pending, reading.lag, reading.capped, reading.last_delivered_id)
        return reading

    def _observe(self, pending: int, lag: int, capped: bool, last_delivered_id: str, moved: int = 0) -> None:
        """Record a backlog reading (``pending + lag`` measured before a move of ``moved`` entries
        in the same step) in the progress, the pacer and the stall watch."""
        p, now = self._progress, workflow.now()
        backlog = pending + lag
        p.backlog, p.pending, p.lag = backlog + moved, pending, lag + moved
        self._backlog_gauge.set(backlog + moved)
        self._pacer.observe(backlog, backlog + moved, capped, now)
        p.drain_rate, p.low_watermark = self._pacer.rate, self._pacer.low_watermark
        self._net.observe(p.replayed, backlog + moved, capped, now)
        p.net_rate = self._net.rate
        p.stalled_seconds = self._stall.observe(now, backlog, pending, last_delivered_id, moved)
        stalled = self._stall.stalled(p.stalled_seconds)
        if stalled and not p.stalled:
            workflow.logger.warning(
                "replay stalled: the backlog has not gone down for %gs; are the consumers draining the group?",
                p.stalled_seconds,
                extra={"experiment_id": p.experiment_id, "backlog": backlog, "pending": pending},
            )
        p.stalled = stalled
        p.stall_reason = (
            f"backlog {backlog} (pending {pending}) not going down, last-delivered-id {last_delivered_id or 'none'}"
            if stalled
            else None
        )

    async def _wait(self, backlog: int, reason: str, seconds: float | None = None) -> ResumptionResult | None:
        """Step 3: wait while the backlog is at or over the threshold, as the pacer plans it (or a
        durable timer of ``seconds`` when given), then back to the top of the loop. Returns the
        result when a stall outlasted ``max_stall_seconds`` (the run ends ``stalled``), else None."""
        inp, p = self._input, self._progress
        if self._stall.over_limit(p.stalled_seconds):
            await self._release(back_to_paused=True)
            return self._finish(Outcome.STALLED, detail=f"no progress for {p.stalled_seconds:g}s: {p.stall_reason}")
        plan = self._pacer.plan(backlog) if seconds is None else WaitPlan(WaitKind.TIMER, seconds)
        p.throttles += 1
        p.throttles_in_a_row += 1
        described = self._pacer.describe(plan) if seconds is None else f"fixed {seconds:g}s wait"
        p.throttle_reason, p.wait_plan, p.wait_seconds = reason, described, plan.seconds
        self._throttle_counter.add(1, {"policy": p.policy.value})
        self._wait_histogram.record(plan.seconds)
        workflow.logger.info(
            "throttled",
            extra={
                "experiment_id": inp.experiment_id,
                "token": self._token,
                "backlog": backlog,
                "threshold": inp.max_backlog_threshold,
                "reason": reason,
                "plan": p.wait_plan,
                "seconds": plan.seconds,
            },
        )
        timer = plan.kind is WaitKind.TIMER
        p.throttled_until = workflow.now() + timedelta(seconds=plan.seconds) if timer else None
        self._set_phase(Phase.STALLED if p.stalled else Phase.THROTTLED)
        if not timer:
            await self._poll(plan, reason)
        elif not self._wake:  # an Update accepted earlier in this turn: no wait at all
            # a durable timer an accepted Update ends early: a timer all the same, so histories
            # recorded with ``workflow.sleep`` replay unchanged
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._wake,
                    timeout=plan.seconds,
                    timeout_summary=f"throttled {plan.seconds:.3g}s: {reason}",
                )
        p.throttled_until = None
        self._pacer.woke(workflow.now())
        return None

    async def _poll(self, plan: WaitPlan, reason: str) -> None:
        """A short wait: poll the backlog inside one local activity until it reaches the plan's low
        watermark (or the plan's bound); its last reading feeds the drain-rate estimate."""
        inp = self._input
        drain = await self._call(
            ResumptionActivities.wait_for_drain,
            DrainWaitRequest(
                ref=self._ref,
                threshold=inp.max_backlog_threshold,
                low_watermark=plan.low_watermark,
                min_seconds=plan.min_seconds,
                max_seconds=plan.seconds,
                poll_seconds=plan.poll_seconds,
                missing_group=inp.missing_group,
                max_bytes=inp.max_bytes_per_call,
            ),
            summary=f"throttled, up to {plan.seconds:g}s until backlog <= {plan.low_watermark}: {reason}",
            start_to_close=REDIS_CALL_TIMEOUT + timedelta(seconds=plan.seconds),
        )
        r = drain.reading
        self._observe(r.pending, r.lag, r.capped, r.last_delivered_id)

    async def _publish(self) -> ResumptionResult | None:
        """Step 4: publish the next batch through the atomic script. Returns the result when the
        resumption ends (completed, paused, fenced, or stalled during the wait that follows)."""
        inp, p = self._input, self._progress
        batch, cap = inp.batch_size, inp.max_tasks_per_second
        if cap is not None:
            allowed = self._bucket.allowance(cap, workflow.now())
            if allowed < 1:
                seconds = self._bucket.wait_seconds(cap, p.remaining or 1)
                await self._rate_wait(seconds, f"replay cap {cap:g} tasks/s (max_tasks_per_second)")
                return None
            batch = min(batch, allowed)
        self._set_phase(Phase.PUBLISHING)
        # the seq moves on only once a publish has answered: a publish that failed after its script
        # ran in Redis is asked again with the same seq, and returns its recorded result
        seq = self._seq + 1
        result = await self._call(
            ResumptionActivities.publish_batch,
            PublishRequest(
                ref=self._ref,
                token=self._token,
                seq=seq,
                batch_size=batch,
                threshold=inp.max_backlog_threshold,
                owner=self._owner,
                lease_ms=inp.lease_ms,
                missing_group=inp.missing_group,
                max_bytes=inp.max_bytes_per_call,
                max_memory_fraction=inp.max_memory_fraction,
                fair_share=inp.fair_share,
            ),
            summary=f"publish up to {min(batch, p.remaining or batch)} tasks",
        )
        self._seq = seq
        if cap is not None:
            self._bucket.take(result.moved)
        p.stream_rate_limit = result.rate_limit or None
        # Redis's count is the authority: publishes whose history was lost are in it too, and the
        # metric follows it (a stale reply after a lost history adds what this run never saw)
        counted = p.replayed
        p.replayed = result.total_moved if result.total_moved is not None else p.replayed + result.moved
        if p.replayed > counted:
            self._replayed_counter.add(p.replayed - counted)
        p.remaining = result.remaining
        if result.status in (
            PublishStatus.PUBLISHED,
            PublishStatus.COMPLETED,
            PublishStatus.THROTTLED,
            PublishStatus.MEMORY,
            PublishStatus.RATE_LIMITED,
        ):
            # the script measured the backlog before its move
            self._observe(result.pending, result.lag, result.capped, result.last_delivered_id, result.moved)
        if result.moved:
            p.throttles_in_a_row = 0
            self._pacer.published(workflow.now())
        if result.poison_id:
            await self._set_aside(result.poison_id)
        return await self._after_publish(result, seq)

    async def _set_aside(self, entry_id: str) -> None:
        """A held task stopped the publish (more fields than a script can pass to XADD): move it to
        the experiment's dead-letter stream, so the tasks behind it go on in order."""
        p = self._progress
        aside = await self._call(
            ResumptionActivities.set_aside,
            SetAsideRequest(ref=self._ref, token=self._token, entry_id=entry_id),
            summary=f"set held task {entry_id} aside: too many fields to move by script",
        )
        p.set_aside, p.dead_letter_key = aside.dead, aside.key
        workflow.logger.warning(
            "held task set aside into the dead-letter stream",
            extra={"experiment_id": p.experiment_id, "entry_id": entry_id, "status": aside.status.value},
        )

    async def _after_publish(self, result: PublishResult, seq: int) -> ResumptionResult | None:
        """What a publish's status means for the loop: end, wait, publish again, or start over."""
        p = self._progress
        match result.status:
            case PublishStatus.COMPLETED:
                await self._release(back_to_paused=False)
                return self._finish(Outcome.COMPLETED)
            case PublishStatus.PAUSED:
                await self._release(back_to_paused=False)
                return self._finish(Outcome.PAUSED)
            case PublishStatus.FENCED:
                return self._finish(Outcome.FENCED, detail="a newer token took over before the publish")
            case PublishStatus.FENCE_LOST:
                return self._fence_lost(None)
            case PublishStatus.THROTTLED:
                # the backlog grew between the measurement and the publish
                reason = wait_reason(result.pending, result.lag, result.capped, p.threshold, result.bytes_capped)
                return await self._wait(result.backlog, reason)
            case PublishStatus.MEMORY:
                # Redis's used memory reached max_memory_fraction of maxmemory: nothing moved. A
                # durable timer of throttle_seconds whatever the policy (the backlog may be low, so
                # an adaptive poll for the drain would return at once), then the check again
                reason = memory_reason(result.used_memory, result.maxmemory, self._input.max_memory_fraction or 1.0)
                ended = await self._wait(result.backlog, reason, self._input.throttle_seconds)
                # Redis's memory, not the consumers, held the replay: not a stall of theirs
                self._stall.restart(workflow.now())
                return ended
            case PublishStatus.RATE_LIMITED:
                # the stream-wide cap's bucket holds no whole task: nothing moved
                await self._rate_wait(result.rate_wait_ms / 1000, self._stream_rate_reason(result))
            case PublishStatus.PUBLISHED if result.rate_limited and result.rate_wait_ms > 0:
                # the stream-wide cap cut this move short: wait for the bucket, not for the next publish
                await self._rate_wait(result.rate_wait_ms / 1000, self._stream_rate_reason(result))
            case PublishStatus.STALE:
                # an older seq than the last publish recorded for this token (after a workflow
                # reset): go on from the recorded one
                workflow.logger.warning("publish refused as stale", extra={"seq": seq, "last_seq": result.last_seq})
                self._seq = max(self._seq, result.last_seq)
            case PublishStatus.PUBLISHED if workflow.patched(CHAINED_PUBLISH):
                if result.headroom_left > 0:
                    self._publish_next = True
                elif self._pacer.adaptive:
                    # filled up to the threshold: the adaptive wait measures the drain itself
                    return await self._wait(
                        result.backlog + result.moved,
                        wait_reason(
                            result.pending, result.lag + result.moved, result.capped, p.threshold, result.bytes_capped
                        ),
                    )
                # else (fixed): the next turn measures again, as the seed's rule does
        return None

    def _stream_rate_reason(self, result: PublishResult) -> str:
        return f"stream cap {result.rate_limit:g} tasks/s ({{{self._input.stream}}}:rate)"

    async def _rate_wait(self, seconds: float, reason: str) -> None:
        """A rate cap holds the replay back: wait about ``seconds`` (clamped to
        ``MIN_RATE_WAIT_SECONDS`` .. half the claim's lease) for its bucket, then the caller
        starts the next turn over from the check. A short wait polls the backlog inside one local
        activity (its reading feeds the pacing and the ETA), a long one is a durable timer that an
        accepted Update ends. Neither is a throttle wait, and the consumers are not to blame: the
        stall window starts again after it."""
        workflow.patched(RATE_CAP)
        inp, p = self._input, self._progress
        seconds = min(max(seconds, MIN_RATE_WAIT_SECONDS), inp.claim_lease_seconds / 2)
        p.rate_waits += 1
        p.rate_reason = f"{reason}: {seconds:.3g}s for the bucket"
        poll = seconds <= POLL_LIMIT_SECONDS
        p.throttled_until = None if poll else workflow.now() + timedelta(seconds=seconds)
        self._set_phase(Phase.RATE_LIMITED)
        workflow.logger.info(
            "rate limited",
            extra={"experiment_id": inp.experiment_id, "reason": reason, "seconds": seconds},
        )
        if poll:
            drain = await self._call(
                ResumptionActivities.wait_for_drain,
                DrainWaitRequest(
                    ref=self._ref,
                    threshold=inp.max_backlog_threshold,
                    low_watermark=0,
                    min_seconds=seconds,
                    max_seconds=seconds,
                    poll_seconds=min(1.0, seconds),
                    missing_group=inp.missing_group,
                    max_bytes=inp.max_bytes_per_call,
                ),
                summary=f"rate limited {seconds:.3g}s: {reason}",
                start_to_close=REDIS_CALL_TIMEOUT + timedelta(seconds=seconds),
            )
            r = drain.reading
            self._observe(r.pending, r.lag, r.capped, r.last_delivered_id)
        elif not self._wake:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._wake, timeout=seconds, timeout_summary=f"rate limited {seconds:.3g}s: {reason}"
                )
        p.throttled_until = None
        self._stall.restart(workflow.now())

    async def _wait_for_redis(self, err: BaseException) -> None:
        """A Redis fault outlasted the local activity's retries: wait ``redis_retry_seconds`` on a
        durable timer, then the caller starts over (from the pause and fencing check, for a turn)."""
        inp, p = self._input, self._progress
        p.redis_waits += 1
        p.last_error = str(err)[:300]
        self._set_phase(Phase.REDIS_UNAVAILABLE)
        workflow.logger.warning(
            "Redis unavailable; waiting %gs before the next try",
            inp.redis_retry_seconds,
            extra={"experiment_id": inp.experiment_id, "error": p.last_error},
        )
        # a durable timer the pause Update ends early: the run stops at once (the release then
        # tries Redis, bounded by RELEASE_RETRY)
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: self._stopping,
                timeout=inp.redis_retry_seconds,
                timeout_summary=f"Redis unavailable: retrying in {inp.redis_retry_seconds:g}s",
            )
        self._stall.restart(workflow.now())  # the consumers could not drain while Redis was away

    async def _continue_as_new(self) -> None:
        p = self._progress
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._stopping:
            return  # the pause Update was accepted while the handlers finished: stop, do not carry on
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
            drain_rate=self._pacer.rate,
            reaction_seconds=self._pacer.reaction,
            progress_at=self._stall.progress_at,
            stall_reading=self._stall.last,
            net_rate=self._net,
            rate_bucket=self._bucket if self._bucket.at is not None else None,
        )
        workflow.logger.info("continuing as new", extra={"experiment_id": p.experiment_id, "turns": p.turns})
        workflow.continue_as_new(self._input.model_copy(update={"carry": carry}))

    async def _release(self, *, back_to_paused: bool) -> None:
        """Release the claim; token 0 (a run cancelled before its acquire's reply was recorded)
        releases whatever claim this workflow owns. Bounded by ``RELEASE_RETRY``."""
        self._set_phase(Phase.RELEASING)
        try:
            await self._call(
                ResumptionActivities.release_claim,
                ReleaseRequest(ref=self._ref, token=self._token, owner=self._owner, back_to_paused=back_to_paused),
                summary=f"release the claim (token {self._token or 'of this workflow'})",
                retry_policy=RELEASE_RETRY,
            )
        except FAILED_CALL as err:
            # the lease will lapse on its own; the run's own outcome or failure matters more
            workflow.logger.warning("claim not released", extra={"error": str(err)})

    def _fence_lost(self, counter: int | None) -> ResumptionResult:
        """The fence counter went back below this run's token: Redis lost data (a restart without
        persistence or a failover to a replica that had not caught up), not a takeover. Nothing
        more is published; the claim is not released (its counter is no longer trustworthy)."""
        detail = f"the fence counter is {counter if counter is not None else 'below'} < token {self._token}"
        workflow.logger.error(
            "fence counter went back: Redis lost data; stopping without publishing",
            extra={"experiment_id": self._progress.experiment_id, "token": self._token, "counter": counter},
        )
        return self._finish(Outcome.FENCE_LOST, detail=detail)

    def _finish(self, outcome: Outcome, detail: str = "") -> ResumptionResult:
        p = self._progress
        p.outcome = outcome
        self._outcome_counter.add(1, {"outcome": outcome.value})
        self._set_phase(Phase.DONE)
        workflow.logger.info(
            "resumption ended",
            extra={
                "experiment_id": p.experiment_id,
                "token": self._token,
                "outcome": outcome.value,
                "replayed": p.replayed,
                "remaining": p.remaining,
                "throttles": p.throttles,
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
            set_aside=p.set_aside,
        )

    def _set_phase(self, phase: Phase) -> None:
        """Record the phase, refresh the UI's current details (served by a query) and the fleet
        view's search attributes."""
        self._progress.phase = phase
        self._estimate()
        workflow.set_current_details(self._progress.details_markdown())
        self._show_in_fleet()

    def _estimate(self) -> None:
        """The ETA from the net drain rate, the last reading and the rate caps (``workflows/eta.py``):
        0 once completed; None once ended otherwise."""
        p, now = self._progress, workflow.now()
        if p.outcome is not None or self._failed:
            p.eta_seconds = 0.0 if p.outcome is Outcome.COMPLETED else None
        else:
            headroom = p.threshold - p.backlog if p.backlog is not None else 0
            caps = [c for c in (self._input.max_tasks_per_second, p.stream_rate_limit) if c]
            low = self._pacer.low_watermark
            refill = p.threshold - low if low is not None else 0
            wait_left = (p.throttled_until - now).total_seconds() if p.throttled_until else 0.0
            p.eta_seconds = eta_seconds(
                p.remaining, headroom, self._net.rate, min(caps) if caps else None, refill, max(0.0, wait_left)
            )
        p.eta_at = None if p.eta_seconds is None else now + timedelta(seconds=p.eta_seconds)

    def _fleet_phase(self) -> str:
        """``XmcPhase``: the outcome once ended, else the coarse ``FleetPhase`` of the phase. A short
        poll (adaptive, a second or two) counts as replaying: only a durable wait is ``throttled``."""
        p = self._progress
        if p.outcome is not None:
            return p.outcome.value
        if self._failed:
            return fleet.FAILED
        if self._stopping:
            return fleet.FleetPhase.STOPPING
        match p.phase:
            case Phase.CLAIMING:
                return fleet.FleetPhase.CLAIMING
            case Phase.STALLED:
                return fleet.FleetPhase.STALLED
            case Phase.THROTTLED if p.throttled_until is not None:
                return fleet.FleetPhase.THROTTLED
            case Phase.REDIS_UNAVAILABLE:
                return fleet.FleetPhase.REDIS_UNAVAILABLE
        return fleet.FleetPhase.REPLAYING

    def _show_in_fleet(self) -> None:
        """Upsert the fleet view's search attributes when the fleet phase changes, or the counts
        changed and ``FLEET_REFRESH`` has passed: each upsert is a history event, so not every turn.
        Not in runs recorded before the fleet view (``FLEET_SEARCH_ATTRIBUTES``)."""
        if not workflow.patched(FLEET_SEARCH_ATTRIBUTES):
            return
        p, now = self._progress, workflow.now()
        phase, counts = self._fleet_phase(), (p.replayed, p.remaining)
        shown = self._fleet_shown
        if shown is not None and shown[0] == phase and (counts == self._fleet_counts or now - shown[1] < FLEET_REFRESH):
            return
        updates: list[SearchAttributeUpdate[typing.Any]] = [
            fleet.PHASE.value_set(phase),
            fleet.REPLAYED.value_set(p.replayed),
        ]
        if p.remaining is not None:
            updates.append(fleet.REMAINING.value_set(p.remaining))
        if shown is None:
            updates += [fleet.EXPERIMENT_ID.value_set(p.experiment_id), fleet.STREAM.value_set(self._input.stream)]
        if p.outcome is not None or self._failed:
            updates.append(fleet.OUTCOME.value_set(p.outcome.value if p.outcome else fleet.FAILED))
        workflow.upsert_search_attributes(updates)
        self._fleet_shown, self._fleet_counts = (phase, now), counts

    async def _call(
        self,
        activity: Callable[[ResumptionActivities, _Req], Awaitable[_Res]],
        arg: _Req,
        *,
        summary: str,
        retry_policy: RetryPolicy = REDIS_RETRY,
        start_to_close: timedelta = REDIS_CALL_TIMEOUT,
    ) -> _Res:
        """Run the Redis local activity ``activity`` (a method of ``ResumptionActivities``) with
        ``start_to_close`` timeout and ``retry_policy``; returns its result as the method's
        return annotation says.

        Raises:
            asyncio.CancelledError: the workflow was cancelled while the call ran or retried (the
                SDK reports that as a failed call caused by cancellation; it must not be taken for
                a Redis fault).
            ActivityError, ApplicationError: the call failed (see ``_permanent``).
            pydantic.ValidationError: the result does not match the method's return type.
        """
        try:
            raw = await workflow.execute_local_activity(
                activity.__name__,  # the activity's registered name (activity.defn's default)
                arg,
                result_type=None,
                start_to_close_timeout=start_to_close,
                retry_policy=retry_policy,
                summary=summary,
            )
        except FAILED_CALL as err:
            if is_cancelled_exception(err):
                raise asyncio.CancelledError() from err
            raise
        # called by name and read here, in workflow code, rather than by the SDK while it applies
        # the activation: a result the workflow cannot read then fails the run through ``run``'s
        # handler, which hands the experiment back, instead of failing the run before it can
        return cast(_Res, _result_adapter(activity).validate_python(raw))
