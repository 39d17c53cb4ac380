"""``ResumptionWorkflow``: replay an experiment's held tasks into the task stream, throttled by the
consumer groups' backlog (docs/contract.md, "The loop"; docs/memory.md).

Each turn of the loop:
  1. check the pause state and the fencing token, extending the claim's lease;
  2. measure the backlog (the largest pending + lag among the consumer groups); a missing stream
     or required group under ``missing_group: wait`` is waited for (``waiting_for_group``);
  3. wait while the backlog is at or over ``max_backlog_threshold`` (how long and how is the
     throttle policy's choice, ``workflows/throttle.py``), then back to 1, so pause and fencing
     are re-checked before anything is replayed;
  4. publish the next batch through the atomic script, which re-checks token, pause state and
     backlog itself and moves at most ``min(batch_size, threshold - backlog)`` tasks.
A publish that left headroom is followed at once by the next publish: the script re-checks
everything 1, 2 and 4 need in the same step as its move, so such a turn is one Redis call. Under
the adaptive policy a publish that filled the headroom goes straight to the wait, which measures
the drain itself; under the fixed one the next turn measures again, as the seed's rule does.

The Redis calls are local activities (``workflows/calls.py``). The run's state is one ``RunState``
(``workflows/state.py``), handed on as its ``Carry`` when the run continues as new after
``turns_per_run`` turns or when Temporal suggests it. Beside the loop: the fleet view's upserts
(``workflows/fleet.py``) and the metrics (``workflows/metrics.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.activities.requests import (
        AcquireRequest,
        BacklogRequest,
        CheckRequest,
        DrainWaitRequest,
        ExperimentRef,
        IdleConsumersRequest,
        PublishRequest,
        SetAsideRequest,
    )
    from xmc_resumption.activities.resumption import ResumptionActivities
    from xmc_resumption.redisclient.memory import memory_reason
    from xmc_resumption.redisclient.results import (
        BacklogReading,
        ExperimentState,
        GroupStatus,
        MissingGroupPolicy,
        PublishResult,
        PublishStatus,
        ReleaseRecord,
    )
    from xmc_resumption.workflows import fleet
    from xmc_resumption.workflows.calls import FAILED_CALL, REDIS_CALL_TIMEOUT, TaskBudget, call, permanent
    from xmc_resumption.workflows.control import (
        INVALID_CONTROL,
        Control,
        ControlChange,
        EffectiveSettings,
        InvalidControlError,
    )
    from xmc_resumption.workflows.metrics import Instruments
    from xmc_resumption.workflows.models import (
        WORKFLOW_TYPE,
        Outcome,
        Phase,
        Progress,
        ResumptionInput,
        ResumptionResult,
    )
    from xmc_resumption.workflows.release import release_claim
    from xmc_resumption.workflows.state import RunState
    from xmc_resumption.workflows.throttle import POLL_LIMIT_SECONDS, WaitKind, WaitPlan, wait_reason


CHAINED_PUBLISH = "chained-publish"
"""``workflow.patched`` ID of the cheap turn: a publish that left headroom is followed by the next
publish without a check and a measurement in between (and, adaptive, one that filled it goes
straight to the wait). Runs recorded before it (tests/histories/v0_*, v1_*) replay on the old path."""

RATE_CAP = "rate-cap"
"""``workflow.patched`` ID of the rate cap's waits (``_rate_wait``): a run that waited for a rate
cap's bucket records it once. Runs recorded before the caps existed never reach a rate wait (their
input has no ``max_tasks_per_second`` and their publish results no ``rate_limited``)."""

MIN_RATE_WAIT_SECONDS = 0.01
"""The shortest rate wait (seconds); the longest is half the claim's lease, so the lease, extended
once per turn, outlasts it (a longer wait for a bucket is taken in several)."""

WAIT_FOR_GROUP = "wait-for-group"
"""``workflow.patched`` ID of the ``waiting_for_group`` wait: under ``missing_group: wait`` a missing
stream or required group is waited for on a durable timer of ``throttle_seconds`` in its own phase
(runs recorded before it never met a missing group under that policy, which did not exist)."""

NAME_IDLE_CONSUMERS = "name-idle-consumers"
"""``workflow.patched`` ID of the read of idle consumers (``XINFO CONSUMERS``, one local activity)
when a replay is stalled: runs recorded before it replay without."""

PACING_PROBE = "pacing-probe"
"""``workflow.patched`` ID of issue 17's pacing, asked once at the start of a run that is adaptive or
leaves ``throttle_policy`` out (``RunState.start_pacing``): the adaptive estimator that learns bursts
and probes upwards, and ``adaptive`` as the default. Runs recorded before it keep the old estimator,
and an input without the field keeps ``fixed``."""

STALL_COUNTS_EVERY_WAIT = "stall-counts-every-wait"
"""``workflow.patched`` ID of the stall rule that every wait the operator did not ask for (backlog,
missing group, Redis memory) counts against ``max_stall_seconds``: a memory wait no longer starts
the stall window again (runs recorded before it replay with the restart). A rate cap's wait is the
operator's own request (``max_tasks_per_second``, ``{S}:rate``) and still starts it again."""

IDLE_CONSUMERS_SHOWN = 5
"""The most idle consumers a stall reason names."""


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
        self._state = RunState.of(inp)
        """All of the run's state; ``Carry`` of it is what continue-as-new hands the next run."""
        self._fleet = fleet.FleetView(inp.stream)
        """The fleet view's upserts (not carried: each run shows itself afresh)."""
        self.task_budget = TaskBudget()
        """How long the current workflow task has been open: ``call`` keeps it short, for queries."""

    # -- control: validated Updates (workflows/control.py Control, RunState.refuse); a rejected one leaves no event

    # Each Update takes its arguments as JSON decoded them (any type) and reads them strictly in
    # its validator (``ControlChange.of_update``): a typed parameter would have the data converter
    # coerce ``true`` to 1 and turn a wrong type into a multi-line, retryable ValidationError
    # before the validator could say which field is wrong.

    @workflow.update(name=Control.CONFIGURE)
    def configure(self, *args: Any) -> EffectiveSettings:
        """Change settings of the running replay (a ``ControlChange``, as a JSON object); returns
        the effective settings. An accepted change wakes a durable throttle wait, so the next
        turn (check, measure, publish) runs under it at once; it is carried across
        continue-as-new (it is part of the input)."""
        return self._apply(self._change(Control.CONFIGURE, args))

    @configure.validator
    def _check_configure(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.CONFIGURE, args))

    @workflow.update(name=Control.SET_THRESHOLD)
    def set_threshold(self, *args: Any) -> EffectiveSettings:
        """``configure`` with ``max_backlog_threshold`` only (an integer, entries)."""
        return self._apply(self._change(Control.SET_THRESHOLD, args))

    @set_threshold.validator
    def _check_threshold(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.SET_THRESHOLD, args))

    @workflow.update(name=Control.SET_BATCH_SIZE)
    def set_batch_size(self, *args: Any) -> EffectiveSettings:
        """``configure`` with ``batch_size`` only (an integer, entries)."""
        return self._apply(self._change(Control.SET_BATCH_SIZE, args))

    @set_batch_size.validator
    def _check_batch_size(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.SET_BATCH_SIZE, args))

    @workflow.update(name=Control.SET_THROTTLE_SECONDS)
    def set_throttle_seconds(self, *args: Any) -> EffectiveSettings:
        """``configure`` with ``throttle_seconds`` only (a number, seconds)."""
        return self._apply(self._change(Control.SET_THROTTLE_SECONDS, args))

    @set_throttle_seconds.validator
    def _check_throttle_seconds(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.SET_THROTTLE_SECONDS, args))

    @workflow.update(name=Control.SET_THROTTLE_POLICY)
    def set_throttle_policy(self, *args: Any) -> EffectiveSettings:
        """``configure`` with ``throttle_policy`` only (``fixed`` or ``adaptive``)."""
        return self._apply(self._change(Control.SET_THROTTLE_POLICY, args))

    @set_throttle_policy.validator
    def _check_throttle_policy(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.SET_THROTTLE_POLICY, args))

    @workflow.update(name=Control.SET_MAX_TASKS_PER_SECOND)
    def set_max_tasks_per_second(self, *args: Any) -> EffectiveSettings:
        """``configure`` with ``max_tasks_per_second`` only (a number, tasks per second; 0 removes the cap)."""
        return self._apply(self._change(Control.SET_MAX_TASKS_PER_SECOND, args))

    @set_max_tasks_per_second.validator
    def _check_max_tasks_per_second(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.SET_MAX_TASKS_PER_SECOND, args))

    @workflow.update(name=Control.PAUSE)
    def pause(self, *args: Any) -> EffectiveSettings:
        """Graceful stop: the run ends ``paused`` at its next turn (a durable throttle wait ends at
        once): claim released, experiment back to paused, held tasks kept for a later resume."""
        self._state.stopping = self._state.wake = self._state.progress.stopping = True
        workflow.logger.info("pause requested", extra={"experiment_id": self._state.input.experiment_id})
        self._set_phase(self._state.progress.phase)
        return EffectiveSettings.of(self._state.input, stopping=True)

    @pause.validator
    def _check_pause(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.PAUSE, args))

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """Any signal: this workflow takes none. Logged, so a misdirected one is not silently lost."""
        workflow.logger.warning(
            "signal %r ignored: this workflow is controlled by Updates (%s)",
            name,
            ", ".join(c.value for c in Control),
            extra={"experiment_id": self._state.input.experiment_id},
        )

    @staticmethod
    def _change(update: Control, args: Sequence[Any]) -> ControlChange:
        """The change Update ``update`` asks for, from its arguments (``ControlChange.of_update``).

        Raises:
            ApplicationError: non-retryable, type ``InvalidControl``: one line naming the field.
        """
        try:
            return ControlChange.of_update(update, args)
        except InvalidControlError as err:
            raise ApplicationError(str(err), type=INVALID_CONTROL, non_retryable=True) from None

    def _apply(self, change: ControlChange) -> EffectiveSettings:
        """Apply a validated change (``RunState.apply``), which wakes a durable throttle wait."""
        inp = self._state.apply(change)
        workflow.logger.info(
            "settings changed",
            extra={"experiment_id": inp.experiment_id, **change.model_dump(mode="json", exclude_none=True)},
        )
        self._set_phase(self._state.progress.phase)
        return EffectiveSettings.of(inp, stopping=self._state.stopping)

    @workflow.query
    def progress(self) -> Progress:
        """Where the replay stands: counters, last backlog reading, pacing, stall, outcome."""
        return self._state.progress

    @workflow.run
    async def run(self, inp: ResumptionInput) -> ResumptionResult:
        """Run the resumption loop; see the class docstring."""
        self._ref = ExperimentRef(
            experiment_id=inp.experiment_id,
            stream=inp.stream,
            consumer_group=inp.consumer_group,
            consumer_groups=inp.consumer_groups,
        )
        self._metrics = Instruments.create(inp.stream, inp.consumer_group)
        info = workflow.info()
        self._state.begin(info.workflow_id, info.continued_run_id, workflow.now(), lambda: str(workflow.uuid4()))
        if self._state.asks_pacing_patch():
            self._state.start_pacing(workflow.patched(PACING_PROBE))
        try:
            return await self._loop()
        except asyncio.CancelledError:
            self._state.progress.outcome = Outcome.CANCELLED
            await self._release(back_to_paused=True, outcome=Outcome.CANCELLED)
            self._count_outcome(Outcome.CANCELLED)
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
        self._state.failed = True
        await self._release(back_to_paused=True, outcome=fleet.FAILED)
        self._count_outcome(fleet.FAILED)
        self._set_phase(Phase.DONE)

    async def _loop(self) -> ResumptionResult:
        """Take the claim, then turn until the resumption ends. A Redis fault that outlasts a call's
        retries waits on a durable timer and starts the step over; the run continues as new after
        ``turns_per_run`` turns, or as many tries of the claim, or when Temporal suggests it (before
        the claim too, carrying token 0)."""
        inp, p = self._state.input, self._state.progress
        claim_tries = turns_this_run = 0
        while True:
            if self._state.stopping:
                return await self._stop()
            if max(claim_tries, turns_this_run) >= inp.turns_per_run or workflow.info().is_continue_as_new_suggested():
                await self._continue_as_new()
                continue  # it returns only when a pause was accepted meanwhile: stop instead
            try:
                if not self._state.token:
                    claim_tries += 1
                    await self._acquire()
                    continue
                turns_this_run += 1
                p.turns += 1
                self._state.wake = False  # an Update accepted from here on ends this turn's durable wait
                # adding 0 shows the counter from the first live turn on (a worker that took the
                # run over after a restart, too: the meter skips replayed code), not first at a
                # wait; the check activity does so for the tasks moved (``Counts.show``)
                self._metrics.throttles.add(0, {"policy": p.policy.value})
                result = await self._turn()
            except FAILED_CALL as err:
                if permanent(err):
                    raise
                self._state.publish_next = False
                await self._wait_for_redis(err)
                continue
            if result is not None:
                return result

    async def _acquire(self) -> None:
        """Take the claim. The request ID makes a retry, or an attempt that reaches Redis late,
        return the same token instead of a second claim."""
        inp = self._state.input
        self._set_phase(Phase.CLAIMING)
        grant = await call(
            ResumptionActivities.acquire_claim,
            AcquireRequest(
                ref=self._ref, owner=self._state.owner, lease_ms=inp.lease_ms, request_id=self._state.request_id
            ),
            summary=f"take the claim on experiment {inp.experiment_id}",
        )
        self._state.claimed(grant)
        self._state.leased(workflow.now())
        workflow.logger.info(
            "resumption started",
            extra={"experiment_id": inp.experiment_id, "token": grant.token, "held": grant.held},
        )
        if grant.held == 0 and grant.previous_state is ExperimentState.RUNNING:
            self._state.nothing_held = True

    async def _stop(self) -> ResumptionResult:
        """The ``pause`` Update: release the claim, experiment back to paused, held tasks kept."""
        await self._release(back_to_paused=True, outcome=Outcome.PAUSED)
        return self._finish(Outcome.PAUSED, detail="stopped by the pause Update")

    async def _turn(self) -> ResumptionResult | None:
        """One turn: check, measure, wait or publish (a turn right after a publish that left
        headroom only publishes). Returns the result when the resumption ends, else None."""
        if self._state.publish_next:
            self._state.publish_next = False
            return await self._publish()
        if self._state.nothing_held:
            # neither paused nor holding tasks: most likely a mistyped experiment ID or stream
            await self._release(back_to_paused=False, outcome=Outcome.NOTHING_HELD)
            return self._finish(Outcome.NOTHING_HELD, detail="the experiment was not paused and holds no tasks")
        ended = await self._check()
        if ended is not None:
            return ended
        reading = await self._measure()
        if self._waits_for_group(reading.status):
            if self._state.progress.remaining == 0:
                return await self._publish()  # nothing held, nothing to wait for: the publish completes
            return await self._wait_for_group(reading)
        if reading.headroom == 0:
            return await self._wait(reading.backlog, wait_reason(reading, reading.threshold))
        return await self._publish()

    async def _check(self) -> ResumptionResult | None:
        """Step 1: pause state and fencing token (extends the lease). Returns the result when the
        run ends here (fenced, or paused: claim released), else None."""
        inp = self._state.input
        self._set_phase(Phase.CHECKING)
        check = await call(
            ResumptionActivities.check_claim,
            CheckRequest(ref=self._ref, token=self._state.token, owner=self._state.owner, lease_ms=inp.lease_ms),
            summary=f"check pause state and fencing token {self._state.token}",
        )
        self._state.checked(check)
        self._state.leased(workflow.now())
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

    def _waits_for_group(self, status: GroupStatus) -> bool:
        """True when the stream or a required group is missing under ``missing_group: wait``."""
        return (
            status is not GroupStatus.OK
            and self._state.input.missing_group is MissingGroupPolicy.WAIT
            and workflow.patched(WAIT_FOR_GROUP)
        )

    async def _wait_for_group(self, reading: BacklogReading) -> ResumptionResult | None:
        """The stream or a required group is missing under ``missing_group: wait``: nothing moved.
        Wait in phase ``waiting_for_group`` on a durable timer of ``throttle_seconds``, then back to
        the check. Stall detection applies: a group that never comes ends the run ``stalled``."""
        reason = self._state.missing_text(reading) or "waiting for the consumer group"
        return await self._wait(0, reason, self._state.input.throttle_seconds, Phase.WAITING_FOR_GROUP)

    async def _measure(self) -> BacklogReading:
        """Step 2: the consumer groups' largest backlog, capped against the threshold."""
        inp = self._state.input
        self._set_phase(Phase.MEASURING)
        reading = await call(
            ResumptionActivities.measure_backlog,
            BacklogRequest(
                ref=self._ref,
                threshold=inp.max_backlog_threshold,
                missing_group=inp.missing_group,
                max_bytes=inp.max_bytes_per_call,
            ),
            summary=f"measure backlog of {inp.groups_text().replace('`', '')} on {inp.stream}",
        )
        self._observe(reading)
        return reading

    def _observe(self, reading: BacklogReading, moved: int = 0) -> None:
        """Record a backlog ``reading`` (measured before a move of ``moved`` entries in the same
        step): ``RunState.observe``, the backlog gauge, and a warning when a stall begins."""
        p = self._state.progress
        if self._state.observe(reading, workflow.now(), moved):
            workflow.logger.warning(
                "replay stalled: the backlog has not gone down for %gs; are the consumers draining the group?",
                p.stalled_seconds,
                extra={"experiment_id": p.experiment_id, "backlog": reading.backlog, "pending": reading.pending},
            )
        self._metrics.backlog.set(reading.backlog + moved)

    async def _name_idle_consumers(self) -> None:
        """A stall: read which consumers of the limiting group hold pending entries while idle for
        the stall window (one ``XINFO CONSUMERS``), for the stall reason. At the stall's start, then
        at most once per stall window; never while a group is missing. Best effort: a failed read
        (e.g. an ACL rule without ``xinfo|consumers``) is logged and the reason goes without."""
        state, now = self._state, workflow.now()
        inp, p = state.input, state.progress
        window = timedelta(seconds=inp.stall_window_seconds)
        if state.idle_read_at is not None and now - state.idle_read_at < window:
            return
        if not workflow.patched(NAME_IDLE_CONSUMERS):
            return
        state.idle_read_at = now
        group = p.limiting_group or inp.consumer_group
        try:
            p.idle_consumers = await call(
                ResumptionActivities.idle_consumers,
                IdleConsumersRequest(
                    ref=self._ref,
                    groups=[group],
                    min_idle_ms=round(inp.stall_window_seconds * 1000),
                    limit=IDLE_CONSUMERS_SHOWN,
                ),
                summary=f"stalled: which consumers of {group} hold pending entries while idle",
            )
        except FAILED_CALL as err:
            workflow.logger.warning(
                "idle consumers not read", extra={"experiment_id": inp.experiment_id, "error": str(err)}
            )
            return
        state.show_stall()
        if p.idle_consumers:
            workflow.logger.warning(
                "stalled: pending entries held by idle consumers",
                extra={"experiment_id": inp.experiment_id, "reason": p.stall_reason},
            )

    async def _wait(
        self, backlog: int, reason: str, seconds: float | None = None, phase: Phase | None = None
    ) -> ResumptionResult | None:
        """Step 3: wait while the backlog is at or over the threshold, as the pacer plans it (or a
        durable timer of ``seconds`` when given), in ``phase`` (default: throttled, or stalled),
        then back to the top of the loop. A stalled replay first names the idle consumers holding
        pending entries. Returns the result when a stall outlasted ``max_stall_seconds`` (the run
        ends ``stalled``), else None."""
        inp, p = self._state.input, self._state.progress
        if p.stalled and phase is not Phase.WAITING_FOR_GROUP:
            await self._name_idle_consumers()
        if self._state.stall.over_limit(p.stalled_seconds):
            await self._release(back_to_paused=True, outcome=Outcome.STALLED)
            return self._finish(Outcome.STALLED, detail=f"no progress for {p.stalled_seconds:g}s: {p.stall_reason}")
        plan = self._state.pacer.plan(backlog, workflow.now()) if seconds is None else WaitPlan.timer(seconds)
        p.throttles += 1
        p.throttles_in_a_row += 1
        described = self._state.pacer.describe(plan) if seconds is None else f"fixed {seconds:g}s wait"
        p.throttle_reason, p.wait_plan, p.wait_seconds = reason, described, plan.seconds
        self._metrics.throttles.add(1, {"policy": p.policy.value})
        self._metrics.wait.record(plan.seconds)
        workflow.logger.info(
            "throttled",
            extra={
                "experiment_id": inp.experiment_id,
                "token": self._state.token,
                "backlog": backlog,
                "threshold": inp.max_backlog_threshold,
                "reason": reason,
                "plan": p.wait_plan,
                "seconds": plan.seconds,
            },
        )
        timer = plan.kind is WaitKind.TIMER
        p.throttled_until = workflow.now() + timedelta(seconds=plan.seconds) if timer else None
        self._set_phase(phase or (Phase.STALLED if p.stalled else Phase.THROTTLED))
        if not timer:
            await self._poll(plan, reason)
        elif not self._state.wake:  # an Update accepted earlier in this turn: no wait at all
            # a durable timer an accepted Update ends early: a timer all the same, so histories
            # recorded with ``workflow.sleep`` replay unchanged
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._state.wake,
                    timeout=plan.seconds,
                    timeout_summary=f"throttled {plan.seconds:.3g}s: {reason}",
                )
        p.throttled_until = None
        self._state.pacer.woke(workflow.now())
        return None

    async def _poll(self, plan: WaitPlan, reason: str) -> None:
        """A short wait: poll the backlog inside one local activity until it reaches the plan's low
        watermark (or the plan's bound); its last reading feeds the drain-rate estimate."""
        inp = self._state.input
        drain = await call(
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
        self._state.pacer.burst_seen(drain.largest_drop)
        self._observe(drain.reading)

    async def _publish(self) -> ResumptionResult | None:
        """Step 4: publish the next batch through the atomic script. Returns the result when the
        resumption ends (completed, paused, fenced, or stalled during the wait that follows)."""
        inp, p = self._state.input, self._state.progress
        batch, cap = inp.batch_size, inp.max_tasks_per_second
        if cap is not None:
            allowed = self._state.bucket.allowance(cap, workflow.now())
            if allowed < 1:
                seconds = self._state.bucket.wait_seconds(cap, p.remaining or 1)
                await self._rate_wait(seconds, f"replay cap {cap:g} tasks/s (max_tasks_per_second)")
                return None
            batch = min(batch, allowed)
        self._set_phase(Phase.PUBLISHING)
        # the seq moves on only once a publish has answered: a publish that failed after its script
        # ran in Redis is asked again with the same seq, and returns its recorded result
        seq = self._state.seq + 1
        result = await call(
            ResumptionActivities.publish_batch,
            PublishRequest(
                ref=self._ref,
                token=self._state.token,
                seq=seq,
                batch_size=batch,
                threshold=inp.max_backlog_threshold,
                owner=self._state.owner,
                lease_ms=inp.lease_ms,
                missing_group=inp.missing_group,
                max_bytes=inp.max_bytes_per_call,
                max_memory_fraction=inp.max_memory_fraction,
                fair_share=inp.fair_share,
            ),
            summary=f"publish up to {min(batch, p.remaining or batch)} tasks",
        )
        self._state.seq = seq
        self._state.leased(workflow.now())
        if cap is not None:
            self._state.bucket.take(result.moved)
        p.stream_rate_limit = result.rate_limit or None
        self._state.count(result)  # Redis's count (the metric is the activity's: activities/metrics.py)
        if result.status in (
            PublishStatus.PUBLISHED,
            PublishStatus.COMPLETED,
            PublishStatus.THROTTLED,
            PublishStatus.MEMORY,
            PublishStatus.WAITING_FOR_GROUP,
            PublishStatus.RATE_LIMITED,
        ):
            # the script measured the backlog before its move
            self._observe(result.reading, result.moved)
        if result.moved:
            p.throttles_in_a_row = 0
            self._state.pacer.published(workflow.now())
        if result.poison_id:
            await self._set_aside(result.poison_id)
        return await self._after_publish(result, seq)

    async def _set_aside(self, entry_id: str) -> None:
        """A held task stopped the publish (more fields than a script can pass to XADD): move it to
        the experiment's dead-letter stream, so the tasks behind it go on in order."""
        p = self._state.progress
        aside = await call(
            ResumptionActivities.set_aside,
            SetAsideRequest(ref=self._ref, token=self._state.token, entry_id=entry_id),
            summary=f"set held task {entry_id} aside: too many fields to move by script",
        )
        p.set_aside, p.dead_letter_key = aside.dead, aside.key
        workflow.logger.warning(
            "held task set aside into the dead-letter stream",
            extra={"experiment_id": p.experiment_id, "entry_id": entry_id, "status": aside.status.value},
        )

    async def _after_publish(self, result: PublishResult, seq: int) -> ResumptionResult | None:
        """What a publish's status means for the loop: end, wait, publish again, or start over."""
        p = self._state.progress
        match result.status:
            case PublishStatus.COMPLETED:
                await self._release(back_to_paused=False, outcome=Outcome.COMPLETED)
                return self._finish(Outcome.COMPLETED)
            case PublishStatus.PAUSED:
                await self._release(back_to_paused=False, outcome=Outcome.PAUSED)
                return self._finish(Outcome.PAUSED)
            case PublishStatus.RELEASED:
                record = ReleaseRecord(outcome=result.outcome, replayed=result.replayed, remaining=result.remaining)
                return self._ended_before(record)
            case PublishStatus.FENCED:
                return self._finish(Outcome.FENCED, detail="a newer token took over before the publish")
            case PublishStatus.FENCE_LOST:
                return self._fence_lost(None)
            case PublishStatus.THROTTLED:
                # the backlog grew between the measurement and the publish
                return await self._wait(result.reading.backlog, wait_reason(result.reading, p.threshold))
            case PublishStatus.WAITING_FOR_GROUP if self._waits_for_group(result.reading.status):
                # the stream or a required group went missing: nothing moved or written
                return await self._wait_for_group(result.reading)
            case PublishStatus.MEMORY:
                # Redis's used memory reached max_memory_fraction of maxmemory: nothing moved. A
                # durable timer of throttle_seconds whatever the policy (the backlog may be low, so
                # an adaptive poll for the drain would return at once), then the check again
                reason = memory_reason(
                    result.used_memory, result.maxmemory, self._state.input.max_memory_fraction or 1.0
                )
                self._state.hold = reason
                ended = await self._wait(result.reading.backlog, reason, self._state.input.throttle_seconds)
                if not workflow.patched(STALL_COUNTS_EVERY_WAIT):
                    self._state.stall.restart(workflow.now())  # before it: memory waits never stalled
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
                self._state.seq = max(self._state.seq, result.last_seq)
            case PublishStatus.PUBLISHED if workflow.patched(CHAINED_PUBLISH):
                if result.headroom_left > 0:
                    self._state.publish_next = True
                elif self._state.pacer.adaptive:
                    # filled up to the threshold: the adaptive wait measures the drain itself
                    return await self._wait(
                        result.reading.backlog + result.moved, wait_reason(result.reading, p.threshold, result.moved)
                    )
                # else (fixed): the next turn measures again, as the seed's rule does
        return None

    def _stream_rate_reason(self, result: PublishResult) -> str:
        return f"stream cap {result.rate_limit:g} tasks/s ({{{self._state.input.stream}}}:rate)"

    async def _rate_wait(self, seconds: float, reason: str) -> None:
        """A rate cap holds the replay back: wait about ``seconds`` (clamped to
        ``MIN_RATE_WAIT_SECONDS`` .. half the claim's lease) for its bucket, then the caller
        starts the next turn over from the check. A short wait polls the backlog inside one local
        activity (its reading feeds the pacing and the ETA), a long one is a durable timer that an
        accepted Update ends. Neither is a throttle wait, and the consumers are not to blame: the
        stall window starts again after it."""
        workflow.patched(RATE_CAP)
        inp, p = self._state.input, self._state.progress
        seconds = min(max(seconds, MIN_RATE_WAIT_SECONDS), inp.claim_lease_seconds / 2)
        p.rate_waits += 1
        p.rate_reason = f"{reason}: {seconds:.3g}s for the bucket"
        poll = seconds <= POLL_LIMIT_SECONDS
        p.throttled_until = None if poll else workflow.now() + timedelta(seconds=seconds)
        self._set_phase(Phase.RATE_LIMITED)
        workflow.logger.info(
            "rate limited", extra={"experiment_id": inp.experiment_id, "reason": reason, "seconds": seconds}
        )
        if poll:
            drain = await call(
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
            self._observe(drain.reading)
        elif not self._state.wake:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._state.wake,
                    timeout=seconds,
                    timeout_summary=f"rate limited {seconds:.3g}s: {reason}",
                )
        p.throttled_until = None
        # the operator's rate cap holds the replay, not the consumers: no stall of theirs
        self._state.stall.restart(workflow.now())

    async def _wait_for_redis(self, err: BaseException) -> None:
        """A Redis fault outlasted the local activity's retries: wait ``redis_retry_seconds`` on a
        durable timer, then the caller starts over (from the pause and fencing check, for a turn)."""
        inp, p = self._state.input, self._state.progress
        p.redis_waits += 1
        p.last_error = str(err)[:300]
        self._set_phase(Phase.REDIS_UNAVAILABLE)
        workflow.logger.warning(
            "Redis unavailable; waiting %gs before the next try",
            inp.redis_retry_seconds,
            extra={"experiment_id": inp.experiment_id, "error": p.last_error},
        )
        # a durable timer the pause Update ends early: the run stops at once (the release then
        # tries Redis, bounded: workflows/release.py)
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: self._state.stopping,
                timeout=inp.redis_retry_seconds,
                timeout_summary=f"Redis unavailable: retrying in {inp.redis_retry_seconds:g}s",
            )
        self._state.stall.restart(workflow.now())  # the consumers could not drain while Redis was away

    async def _continue_as_new(self) -> None:
        """Hand the state (``RunState.carry``) to the next run once every handler has finished."""
        p = self._state.progress
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._state.stopping:
            return  # the pause Update was accepted while the handlers finished: stop, do not carry on
        workflow.logger.info("continuing as new", extra={"experiment_id": p.experiment_id, "turns": p.turns})
        workflow.continue_as_new(self._state.next_input())

    async def _release(self, *, back_to_paused: bool, outcome: str) -> None:
        """Release the claim, recording ``outcome`` with it; token 0 (a run cancelled before its
        acquire's reply was recorded) releases whatever claim this workflow owns. Bounded
        (``workflows/release.py``); the reply's counts (Redis's) go into the progress, and a release
        that could not be done is in the progress and the result (``release_error``)."""
        self._set_phase(Phase.RELEASING)
        self._state.progress.release_error = await release_claim(
            self._ref, self._state, back_to_paused=back_to_paused, outcome=outcome
        )

    def _ended_before(self, record: ReleaseRecord) -> ResumptionResult:
        """This run released its claim in a workflow task whose completion was lost, and runs the
        turn again (temporalio/temporal#5921): end as the release recorded it in Redis
        (``RunState.recorded_release``), not as fenced by its own release."""
        outcome = self._state.recorded_release(record)
        return self._finish(outcome, detail="released before, in a workflow task run again: its recorded release")

    def _count_outcome(self, outcome: str) -> None:
        """Count the run's end in the outcomes metric, unless the release activity counted it."""
        if not self._state.outcome_counted:
            self._metrics.outcomes.add(1, {"outcome": outcome})
            self._state.outcome_counted = True

    def _fence_lost(self, counter: int | None) -> ResumptionResult:
        """The fence counter went back below this run's token: Redis lost data (a restart without
        persistence or a failover to a replica that had not caught up), not a takeover. Nothing
        more is published; the claim is not released (its counter is no longer trustworthy)."""
        detail = f"the fence counter is {counter if counter is not None else 'below'} < token {self._state.token}"
        workflow.logger.error(
            "fence counter went back: Redis lost data; stopping without publishing",
            extra={"experiment_id": self._state.progress.experiment_id, "token": self._state.token, "counter": counter},
        )
        return self._finish(Outcome.FENCE_LOST, detail=detail)

    def _finish(self, outcome: Outcome, detail: str = "") -> ResumptionResult:
        p = self._state.progress
        p.outcome = outcome
        self._count_outcome(outcome.value)
        self._set_phase(Phase.DONE)
        workflow.logger.info(
            "resumption ended",
            extra={
                "experiment_id": p.experiment_id,
                "token": self._state.token,
                "outcome": outcome.value,
                "replayed": p.replayed,
                "remaining": p.remaining,
                "throttles": p.throttles,
                "detail": detail,
            },
        )
        return self._state.result()

    def _set_phase(self, phase: Phase) -> None:
        """Record the phase, refresh the UI's current details (served by a query) and the fleet
        view's search attributes."""
        self._state.progress.phase = phase
        self._state.estimate(workflow.now())
        workflow.set_current_details(self._state.progress.details_markdown())
        self._fleet.show(self._state.progress, failed=self._state.failed, stopping=self._state.stopping)
