"""The waits of ``ResumptionWorkflow``: throttle, rate cap, Redis away, and naming idle consumers.

A base class of the workflow. A throttle wait is a poll inside one call or a durable timer that an
accepted Update ends (``workflows/throttle.py`` plans which); a rate cap's and a Redis fault's
waits likewise (docs/contract.md, "The loop").
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.activities.requests import DrainWaitRequest, ExperimentRef, IdleConsumersRequest
    from xmc_resumption.activities.resumption import ResumptionActivities
    from xmc_resumption.redisclient.results import BacklogReading
    from xmc_resumption.workflows.calls import FAILED_CALL, REDIS_CALL_TIMEOUT, call, failure_text
    from xmc_resumption.workflows.metrics import Instruments
    from xmc_resumption.workflows.models import Outcome, Phase, ResumptionResult
    from xmc_resumption.workflows.state import RunState
    from xmc_resumption.workflows.throttle import POLL_LIMIT_SECONDS, WaitKind, WaitPlan


RATE_CAP = "rate-cap"
"""``workflow.patched`` ID of the rate cap's waits (``_rate_wait``).

A run that waited for a rate cap's bucket records it once. Runs recorded before the caps existed
never reach a rate wait (their input has no ``max_tasks_per_second`` and their publish results no
``rate_limited``)."""

MIN_RATE_WAIT_SECONDS = 0.01
"""The shortest rate wait (seconds).

The longest is half the claim's lease, so the lease, extended once per turn, outlasts it (a longer
wait for a bucket is taken in several)."""

NAME_IDLE_CONSUMERS = "name-idle-consumers"
"""``workflow.patched`` ID of the read of idle consumers when a replay is stalled.

One local activity (``XINFO CONSUMERS``); runs recorded before it replay without."""

IDLE_CONSUMERS_SHOWN = 5
"""The most idle consumers a stall reason names."""


class Waits:
    """The workflow's waits, over its ``RunState``, experiment and metrics."""

    _state: RunState
    _ref: ExperimentRef
    _metrics: Instruments

    def _observe(self, reading: BacklogReading, moved: int = 0) -> None:
        """Record a backlog reading (``ResumptionWorkflow._observe``)."""
        raise NotImplementedError

    def _set_phase(self, phase: Phase) -> None:
        """Enter ``phase`` (``ResumptionWorkflow._set_phase``)."""
        raise NotImplementedError

    async def _release(self, *, back_to_paused: bool, outcome: str) -> None:
        """Release the claim (``ResumptionWorkflow._release``)."""
        raise NotImplementedError

    def _finish(self, outcome: Outcome, detail: str = "") -> ResumptionResult:
        """End the run with ``outcome`` (``ResumptionWorkflow._finish``)."""
        raise NotImplementedError

    async def _name_idle_consumers(self) -> None:
        """Name the idle consumers holding pending entries of the limiting group, for a stall's reason.

        A stall: read which consumers of the limiting group hold pending entries while idle for the stall window (one
        ``XINFO CONSUMERS``), for the stall reason. At the stall's start, then at most once per stall window; never
        while a group is missing. Best effort: a failed read (e.g. an ACL rule without ``xinfo|consumers``) is logged
        and the reason goes without.
        """
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
                "idle consumers not read", extra={"experiment_id": inp.experiment_id, "error": failure_text(err)}
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
        """Step 3: wait while the backlog is at or over the threshold.

        As the pacer plans it (or a durable timer of ``seconds`` when given), in ``phase`` (default: throttled, or
        stalled), then back to the top of the loop. A stalled replay first names the idle consumers holding pending
        entries. Returns the result when a stall outlasted ``max_stall_seconds`` (the run ends ``stalled``), else None.
        """
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
        """Take a short wait: poll the backlog inside one local activity.

        A short wait: poll the backlog inside one local activity until it reaches the plan's low watermark (or the
        plan's bound); its last reading feeds the drain-rate estimate.
        """
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
                # the poll's turn among the polls of its worker comes when the headroom feeds it
                take=self._state.progress.remaining if self._state.rounds else None,
            ),
            summary=f"throttled, up to {plan.seconds:g}s until backlog <= {plan.low_watermark}: {reason}",
            start_to_close=REDIS_CALL_TIMEOUT + timedelta(seconds=plan.seconds),
        )
        self._state.pacer.burst_seen(drain.largest_drop)
        self._observe(drain.reading)

    async def _rate_wait(self, seconds: float, reason: str) -> None:
        """A rate cap holds the replay back: wait about ``seconds`` (clamped to ``MIN_RATE_WAIT_SECONDS`` ..

        half the claim's lease) for its bucket, then the caller starts the next turn over from the check. A short wait
        polls the backlog inside one local activity (its reading feeds the pacing and the ETA), a long one is a durable
        timer that an accepted Update ends. Neither is a throttle wait, and the consumers are not to blame: the stall
        window starts again after it.
        """
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
                    take=0 if self._state.rounds else None,  # it waits for a bucket: no turn of the headroom
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
        """Wait out a Redis fault that outlasted the local activity's retries.

        A Redis fault outlasted the local activity's retries: wait ``redis_retry_seconds`` on a durable timer, then the
        caller starts over (from the pause and fencing check, for a turn).
        """
        inp, p = self._state.input, self._state.progress
        p.redis_waits += 1
        p.last_error = failure_text(err)[:300]
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
