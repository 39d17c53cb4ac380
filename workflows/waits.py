"""``Waits``: waits for the consumers, a rate cap, Redis or a group (docs/pacing.md, "How a wait is done")."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.activities.requests import DrainWaitRequest, IdleConsumersRequest
    from xmc_resumption.activities.resumption import ResumptionActivities
    from xmc_resumption.redisclient.readings import BacklogReading, DrainWait
    from xmc_resumption.redisclient.text import show_name
    from xmc_resumption.workflows.calls import FAILED_CALL, REDIS_CALL_TIMEOUT, call, failure_text, waited
    from xmc_resumption.workflows.calls import now as clock_now
    from xmc_resumption.workflows.models import Phase
    from xmc_resumption.workflows.state import RunState
    from xmc_resumption.workflows.throttle import POLL_LIMIT_SECONDS, WaitKind, WaitPlan
    from xmc_resumption.workflows.view import RunView


MIN_RATE_WAIT_SECONDS = 0.01
"""The shortest rate wait (seconds); the longest is half the claim's lease (docs/pacing.md, "Rate caps")."""

IDLE_CONSUMERS_SHOWN = 5
"""The most idle consumers a stall reason names."""


class Waits:
    """The waits of one run of ``state``, shown through ``view``."""

    def __init__(self, state: RunState, view: RunView) -> None:
        self._state = state
        self._view = view

    async def throttle(
        self, backlog: int, reason: str, seconds: float | None = None, phase: Phase | None = None
    ) -> bool:
        """Wait at ``backlog`` entries as the pacer plans it, or ``seconds`` when given; True: end ``stalled`` now."""
        state = self._state
        inp, p = state.input, state.progress
        if p.stalled and phase is not Phase.WAITING_FOR_GROUP:
            await self._name_idle_consumers()
        if state.stall_over_limit():
            return True
        plan = state.pacer.plan(inp.pacing, backlog, clock_now()) if seconds is None else WaitPlan.timer(seconds)
        p.throttles += 1
        p.throttles_in_a_row += 1
        described = state.pacer.describe(inp.pacing, plan) if seconds is None else f"fixed {seconds:g}s wait"
        p.throttle_reason, p.wait_plan, p.wait_seconds = reason, described, plan.seconds
        self._view.metrics.throttles.add(1, {"policy": inp.throttle_policy.value})
        self._view.metrics.wait.record(plan.seconds)
        workflow.logger.info(
            "throttled",
            extra={
                "experiment_id": inp.experiment_id,
                "token": state.token,
                "backlog": backlog,
                "threshold": inp.max_backlog_threshold,
                "reason": reason,
                "plan": p.wait_plan,
                "seconds": plan.seconds,
            },
        )
        timer = plan.kind is WaitKind.TIMER
        p.throttled_until = clock_now() + timedelta(seconds=plan.seconds) if timer else None
        self._view.phase(phase or (Phase.STALLED if p.stalled else Phase.THROTTLED))
        if not timer:
            await self._poll(plan, reason)
        else:
            await self._timer(plan.seconds, f"throttled {plan.seconds:.3g}s: {reason}")
        p.throttled_until = None
        state.pacer.woke(clock_now())
        return False

    async def for_group(self, reading: BacklogReading) -> bool:
        """Wait ``throttle_seconds`` for a missing stream or group ``reading`` found; True: end ``stalled`` now."""
        reason = self._state.missing_text(reading) or "waiting for the consumer group"
        return await self.throttle(0, reason, self._state.input.throttle_seconds, Phase.WAITING_FOR_GROUP)

    async def rate(self, seconds: float, reason: str) -> None:
        """Wait about ``seconds`` for a rate cap's bucket, for ``reason`` (docs/pacing.md, "Rate caps")."""
        state = self._state
        inp, p = state.input, state.progress
        seconds = min(max(seconds, MIN_RATE_WAIT_SECONDS), inp.claim_lease_seconds / 2)
        p.rate_waits += 1
        p.rate_reason = f"{reason}: {seconds:.3g}s for the bucket"
        poll = seconds <= POLL_LIMIT_SECONDS
        p.throttled_until = None if poll else clock_now() + timedelta(seconds=seconds)
        self._view.phase(Phase.RATE_LIMITED)
        workflow.logger.info(
            "rate limited", extra={"experiment_id": inp.experiment_id, "reason": reason, "seconds": seconds}
        )
        if poll:
            # it waits for a bucket, not for the consumers: no low watermark, and no turn of the headroom (take 0)
            drain = await self._drain(
                0, seconds, seconds, min(1.0, seconds), 0, f"rate limited {seconds:.3g}s: {reason}"
            )
            self._view.observe(drain.reading)
        else:
            await self._timer(seconds, f"rate limited {seconds:.3g}s: {reason}")
        p.throttled_until = None
        state.stall.restart(clock_now())

    async def redis(self, err: BaseException) -> None:
        """Wait ``redis_retry_seconds`` after a Redis fault ``err`` outlasted a call's retries; ``pause`` ends it."""
        state = self._state
        inp, p = state.input, state.progress
        p.redis_waits += 1
        p.last_error = failure_text(err)[:300]
        self._view.phase(Phase.REDIS_UNAVAILABLE)
        workflow.logger.warning(
            "Redis unavailable; waiting %gs before the next try",
            inp.redis_retry_seconds,
            extra={"experiment_id": inp.experiment_id, "error": p.last_error},
        )
        summary = f"Redis unavailable: retrying in {inp.redis_retry_seconds:g}s"
        await self._until(lambda: state.stopping, inp.redis_retry_seconds, summary)
        state.stall.restart(clock_now())

    async def _timer(self, seconds: float, summary: str) -> None:
        """A durable timer of ``seconds`` that an accepted Update ends early (none at all after one this turn)."""
        await self._until(lambda: self._state.wake, seconds, summary)

    @staticmethod
    async def _until(done: Callable[[], bool], seconds: float, summary: str) -> None:
        """A durable wait of ``seconds`` that ``done`` ends early, then the ``TaskClock`` syncs.

        None when ``done`` already: nothing waited on the server, so the clock is not synced right after a local call.
        """
        if done():
            return
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(done, timeout=seconds, timeout_summary=summary)
        waited()

    async def _poll(self, plan: WaitPlan, reason: str) -> None:
        """Poll the backlog inside one call until it reaches ``plan``'s low watermark (or the plan's bound).

        A poll that reaches its bound while other replays of its worker wait on the same stream stays queued: the run
        waits, up to the rest of its longest wait, for the worker's signal that its turn came (docs/pacing.md).
        """
        state = self._state
        summary = f"throttled, up to {plan.seconds:g}s until backlog <= {plan.low_watermark}: {reason}"
        queue = max(0.0, state.input.pacing.max_wait - plan.seconds)
        state.wait_id, state.turn = state.wait_id + 1, False
        take = state.progress.remaining
        drain = await self._drain(
            plan.low_watermark, plan.min_seconds, plan.seconds, plan.poll_seconds, take, summary, queue
        )
        state.pacer.burst_seen(drain.largest_drop, state.input.max_backlog_threshold)
        self._view.observe(drain.reading)
        if drain.queued and not state.wake and not state.turn:
            p = state.progress
            p.wait_plan = f"{p.wait_plan}; then queued up to {queue:g}s for its turn of the headroom"
            p.throttled_until = clock_now() + timedelta(seconds=queue)
            summary = f"queued up to {queue:g}s for a turn of the headroom: {reason}"
            await self._until(lambda: state.turn or state.wake, queue, summary)
            p.throttled_until = None

    async def _drain(
        self, low: int, least: float, most: float, every: float, take: int | None, summary: str, queue: float = 0.0
    ) -> DrainWait:
        """Poll the backlog down to ``low``; ``take`` and ``queue``: docs/pacing.md, "Many replays on one worker"."""
        state = self._state
        inp = state.input
        return await call(
            ResumptionActivities.wait_for_drain,
            DrainWaitRequest(
                ref=state.ref,
                threshold=inp.max_backlog_threshold,
                low_watermark=low,
                min_seconds=least,
                max_seconds=most,
                poll_seconds=every,
                missing_group=inp.missing_group,
                max_bytes=inp.max_bytes_per_call,
                take=take,
                queue_seconds=queue,
                wait_id=state.wait_id,
            ),
            summary=summary,
            start_to_close=REDIS_CALL_TIMEOUT + timedelta(seconds=most),
            longest=most,
            took=lambda drain: drain.seconds,
        )

    async def _name_idle_consumers(self) -> None:
        """Name the idle consumers holding pending entries: docs/memory.md, "A stall names who holds the entries"."""
        state, now = self._state, clock_now()
        inp, p = state.input, state.progress
        window = timedelta(seconds=inp.stall_window_seconds)
        if state.idle_read_at is not None and now - state.idle_read_at < window:
            return
        state.idle_read_at = now
        group = p.limiting_group or inp.consumer_group
        try:
            p.idle_consumers = await call(
                ResumptionActivities.idle_consumers,
                IdleConsumersRequest(
                    ref=state.ref,
                    groups=[group],
                    min_idle_ms=round(inp.stall_window_seconds * 1000),
                    limit=IDLE_CONSUMERS_SHOWN,
                ),
                summary=f"stalled: which consumers of {show_name(group)} hold pending entries while idle",
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
