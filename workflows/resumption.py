"""``ResumptionWorkflow``: replay an experiment's held tasks into the task stream.

Throttled by the consumer groups' backlog (docs/contract.md, "The loop"; docs/memory.md).

Each turn of the loop (with patch ``publish-rounds``; runs recorded before it replay on the old loop, which
measured the backlog between 1 and 2):
  1. check the pause state and the fencing token, extending the claim's lease;
  2. publish through the atomic script, in rounds: each script re-checks token, pause state and
     backlog itself (the largest pending + lag among the consumer groups) and moves at most
     ``min(batch_size, threshold - backlog)`` tasks, and one call runs scripts while headroom is
     left (``publish_rounds``); a missing stream or required group under ``missing_group: wait``
     is waited for (``waiting_for_group``);
  3. wait while the backlog is at or over ``max_backlog_threshold`` (how long and how is the
     throttle policy's choice, ``workflows/throttle.py``), then back to 1, so pause and fencing
     are re-checked before anything is replayed.
The claim is followed by a publish at once. A publish that left headroom is followed at once by the
next publish. Under the adaptive policy a publish that filled the headroom goes straight to the
wait, which measures the drain itself; under the fixed one the next turn's publish measures again.

The Redis calls are local activities (``workflows/calls.py``). The run's state is one ``RunState``
(``workflows/state.py``), handed on as its ``Carry`` when the run continues as new (``_loop`` says
when; the next run starts on the current Worker Deployment Version). Beside the loop: the Updates, signal and
query (``workflows/handlers.py``), the waits (``workflows/waits.py``), the hand-back
(``workflows/release.py``), the fleet view's upserts (``workflows/fleet.py``) and the metrics
(``workflows/metrics.py``).
"""

from __future__ import annotations

import asyncio

from pydantic import ValidationError
from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.activities.requests import (
        AcquireRequest,
        BacklogRequest,
        CheckRequest,
        ExperimentRef,
        PublishRequest,
        PublishRoundsRequest,
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
    from xmc_resumption.workflows.calls import FAILED_CALL, TaskBudget, call, permanent
    from xmc_resumption.workflows.handlers import ControlHandlers
    from xmc_resumption.workflows.metrics import Instruments
    from xmc_resumption.workflows.models import (
        WORKFLOW_TYPE,
        Outcome,
        Phase,
        ResumptionInput,
        ResumptionResult,
    )
    from xmc_resumption.workflows.release import release_claim
    from xmc_resumption.workflows.state import RunState
    from xmc_resumption.workflows.throttle import wait_reason
    from xmc_resumption.workflows.waits import Waits


CHAINED_PUBLISH = "chained-publish"
"""``workflow.patched`` ID of the cheap turn: a publish that left headroom is followed by the next
publish without a check and a measurement in between (and, adaptive, one that filled it goes
straight to the wait). Runs recorded before it (tests/histories/v0_*, v1_*) replay on the old path."""


WAIT_FOR_GROUP = "wait-for-group"
"""``workflow.patched`` ID of the ``waiting_for_group`` wait: under ``missing_group: wait`` a missing
stream or required group is waited for on a durable timer of ``throttle_seconds`` in its own phase
(runs recorded before it never met a missing group under that policy, which did not exist)."""


PACING_PROBE = "pacing-probe"
"""``workflow.patched`` ID of issue 17's pacing, asked once at the start of a run that is adaptive or
leaves ``throttle_policy`` out (``RunState.start_pacing``): the adaptive estimator that learns bursts
and probes upwards, and ``adaptive`` as the default. Runs recorded before it keep the old estimator,
and an input without the field keeps ``fixed``."""

PUBLISH_ROUNDS = "publish-rounds"
"""``workflow.patched`` ID of issue 17's loop, asked once as every run begins (``RunState.rounds``): a publish
is one call of several scripts while headroom is left (``publish_rounds``), the claim and every check are followed by
the publish with no measurement between (the script measures, atomically with its move), the batch is automatic when
the input leaves it out, and an adaptive wait while the consumers drain is polled in slices instead of slept.
Runs recorded before it replay on the old loop."""

ROUNDS_LOCAL_SECONDS = 0.1
"""How long one ``publish_rounds`` call run as a local activity may start scripts for (seconds)."""

ROUNDS_SECONDS = 0.5
"""How long one run as a regular activity may (seconds): it does not hold the workflow task open, so a query is
answered meanwhile; a pause Update is taken once it returns."""

MAX_SCRIPTS_PER_CALL = 1_000
"""The most publish scripts one ``publish_rounds`` call runs (its time bound usually ends it first)."""

STALL_COUNTS_EVERY_WAIT = "stall-counts-every-wait"
"""``workflow.patched`` ID of the stall rule that every wait the operator did not ask for (backlog,
missing group, Redis memory) counts against ``max_stall_seconds``: a memory wait no longer starts
the stall window again (runs recorded before it replay with the restart). A rate cap's wait is the
operator's own request (``max_tasks_per_second``, ``{S}:rate``) and still starts it again."""


FAILURE_EXCEPTION_TYPES = [ValidationError, TypeError]
"""What fails a run instead of retrying its workflow task: a bad input (see ``ResumptionWorkflow``)."""


@workflow.defn(name=WORKFLOW_TYPE, failure_exception_types=FAILURE_EXCEPTION_TYPES)
class ResumptionWorkflow(ControlHandlers, Waits):
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
        # here, not in ``run``: an Update delivered with the start is handled before ``run`` begins
        self._state.start_rounds(workflow.patched(PUBLISH_ROUNDS))

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
        """Hand the experiment back as paused and show a failing run as ``failed``.

        The run is failing: hand the experiment back as paused, and show ``failed`` in the fleet view (``XmcPhase`` and
        ``XmcOutcome``) and the outcome counter.
        """
        self._state.failed = True
        await self._release(back_to_paused=True, outcome=fleet.FAILED)
        self._count_outcome(fleet.FAILED)
        self._set_phase(Phase.DONE)

    async def _loop(self) -> ResumptionResult:
        """Take the claim, then turn until the resumption ends.

        A Redis fault that outlasts a call's retries waits on a durable timer and starts the step over; the run
        continues as new after ``turns_per_run`` turns, or as many tries of the claim, once it has lasted
        ``max_run_seconds``, when Temporal suggests it, or when the task queue's target Worker Deployment Version
        changed (before the claim too, carrying token 0).
        """
        inp, p = self._state.input, self._state.progress
        claim_tries = turns_this_run = 0
        run_started = workflow.now()
        while True:
            if self._state.stopping:
                return await self._stop()
            info = workflow.info()
            if (
                max(claim_tries, turns_this_run) >= inp.turns_per_run
                or (workflow.now() - run_started).total_seconds() >= inp.max_run_seconds
                or info.is_continue_as_new_suggested()
                or info.is_target_worker_deployment_version_changed()
            ):
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
        """Take the claim.

        The request ID makes a retry, or an attempt that reaches Redis late, return the same token instead of a second
        claim.
        """
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
        elif self._state.rounds:
            self._state.publish_next = True  # the claim checked the state; the publish checks it all again

    async def _stop(self) -> ResumptionResult:
        """The ``pause`` Update: release the claim, experiment back to paused, held tasks kept."""
        await self._release(back_to_paused=True, outcome=Outcome.PAUSED)
        return self._finish(Outcome.PAUSED, detail="stopped by the pause Update")

    async def _turn(self) -> ResumptionResult | None:
        """One turn: check, then publish or wait (right after the claim or a publish that left headroom: publish).

        Returns the result when the resumption ends, else None.
        """
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
        if self._state.rounds:
            return await self._publish()  # the script measures the backlog, in the same step as its move
        reading = await self._measure()
        if self._waits_for_group(reading.status):
            if self._state.progress.remaining == 0:
                return await self._publish()  # nothing held, nothing to wait for: the publish completes
            return await self._wait_for_group(reading)
        if reading.headroom == 0:
            return await self._wait(reading.backlog, wait_reason(reading, reading.threshold))
        return await self._publish()

    async def _check(self) -> ResumptionResult | None:
        """Step 1: pause state and fencing token (extends the lease).

        Returns the result when the run ends here (fenced, or paused: claim released), else None.
        """
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

        Wait in phase ``waiting_for_group`` on a durable timer of ``throttle_seconds``, then back to the check. Stall
        detection applies: a group that never comes ends the run ``stalled``.
        """
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
        """Record a backlog ``reading`` taken before a move of ``moved`` entries.

        Record a backlog ``reading`` (measured before a move of ``moved`` entries in the same step):
        ``RunState.observe``, the backlog gauge, and a warning when a stall begins.
        """
        p = self._state.progress
        if self._state.observe(reading, workflow.now(), moved):
            workflow.logger.warning(
                "replay stalled: the backlog has not gone down for %gs; are the consumers draining the group?",
                p.stalled_seconds,
                extra={"experiment_id": p.experiment_id, "backlog": reading.backlog, "pending": reading.pending},
            )
        self._metrics.backlog.set(reading.backlog + moved)

    async def _publish(self) -> ResumptionResult | None:
        """Step 4: publish the next batch through the atomic script (in rounds, with patch ``publish-rounds``).

        Returns the result when the resumption ends (completed, paused, fenced, or stalled during the wait that
        follows).
        """
        inp, p = self._state.input, self._state.progress
        batch, cap = self._state.batch_size, inp.max_tasks_per_second
        allowed: int | None = None
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
        request = PublishRequest(
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
        )
        if self._state.rounds:
            results, moved = await self._publish_rounds(request, allowed)
        else:
            result = await call(
                ResumptionActivities.publish_batch,
                request,
                summary=f"publish up to {min(batch, p.remaining or batch)} tasks",
            )
            self._state.seq = seq
            results, moved = [result], result.moved
        self._state.leased(workflow.now())
        replayed_before = p.replayed
        for result in results:
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
        if self._state.rounds:  # a call asked again after a lost reply moved what Redis counted then
            moved = max(moved, p.replayed - replayed_before)
        if cap is not None:
            self._state.bucket.take(moved)
        if moved:
            p.throttles_in_a_row = 0
            self._state.pacer.published(workflow.now())
        last = results[-1]
        if last.poison_id:
            await self._set_aside(last.poison_id)
        return await self._after_publish(last, self._state.seq)

    async def _publish_rounds(self, request: PublishRequest, allowed: int | None) -> tuple[list[PublishResult], int]:
        """Publish in rounds (``publish_rounds``) from the request's seq; returns the results to fold and tasks moved.

        At most ``allowed`` tasks in all (the replay's own rate cap; None: no bound but the headroom). The call is a
        local activity that starts scripts for ``ROUNDS_LOCAL_SECONDS`` while the workflow task's budget allows it,
        else a regular activity that may for ``ROUNDS_SECONDS``. The seq moves on past every script that answered.
        """
        remote = self.task_budget.passed_by(ROUNDS_LOCAL_SECONDS)
        left = self._state.progress.remaining
        most = min(x for x in (allowed, left, request.threshold) if x is not None)
        rounds = await call(
            ResumptionActivities.publish_rounds,
            PublishRoundsRequest(
                **request.model_dump(),
                max_tasks=allowed,
                max_scripts=MAX_SCRIPTS_PER_CALL,
                max_seconds=ROUNDS_SECONDS if remote else ROUNDS_LOCAL_SECONDS,
            ),
            summary=f"publish up to {most} tasks, {request.batch_size} a script",
        )
        self._state.seq = request.seq + rounds.scripts - 1
        return rounds.results(), rounds.moved

    async def _set_aside(self, entry_id: str) -> None:
        """Move a held task that stopped the publish into the experiment's dead-letter stream.

        A held task stopped the publish (more fields than a script can pass to XADD): move it to the experiment's
        dead-letter stream, so the tasks behind it go on in order.
        """
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

    async def _continue_as_new(self) -> None:
        """Hand the state (``RunState.carry``) to the next run once every handler has finished."""
        p = self._state.progress
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._state.stopping:
            return  # the pause Update was accepted while the handlers finished: stop, do not carry on
        workflow.logger.info("continuing as new", extra={"experiment_id": p.experiment_id, "turns": p.turns})
        # pinned to its Worker Deployment Version, the run hands over to the task queue's current one (a no-op on
        # unversioned workers): a release reaches the replay here, with no patch (docs/operating.md)
        workflow.continue_as_new(
            self._state.next_input(), initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE
        )

    async def _release(self, *, back_to_paused: bool, outcome: str) -> None:
        """Release the claim, recording ``outcome`` with it.

        Token 0 (a run cancelled before its acquire's reply was recorded) releases whatever claim this workflow owns.
        Bounded (``workflows/release.py``); the reply's counts (Redis's) go into the progress, and a release that could
        not be done is in the progress and the result (``release_error``).
        """
        self._set_phase(Phase.RELEASING)
        self._state.progress.release_error = await release_claim(
            self._ref, self._state, back_to_paused=back_to_paused, outcome=outcome
        )

    def _ended_before(self, record: ReleaseRecord) -> ResumptionResult:
        """End a turn run again after this run released its claim, as Redis recorded the release.

        This run released its claim in a workflow task whose completion was lost, and runs the turn again
        (temporalio/temporal#5921): end as the release recorded it in Redis (``RunState.recorded_release``), not as
        fenced by its own release.
        """
        outcome = self._state.recorded_release(record)
        return self._finish(outcome, detail="released before, in a workflow task run again: its recorded release")

    def _count_outcome(self, outcome: str) -> None:
        """Count the run's end in the outcomes metric, unless the release activity counted it."""
        if not self._state.outcome_counted:
            self._metrics.outcomes.add(1, {"outcome": outcome})
            self._state.outcome_counted = True

    def _fence_lost(self, counter: int | None) -> ResumptionResult:
        """End the run because the fence counter went back below this run's token.

        The fence counter went back below this run's token: Redis lost data (a restart without persistence or a failover
        to a replica that had not caught up), not a takeover. Nothing more is published; the claim is not released (its
        counter is no longer trustworthy).
        """
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
        """Record the phase and refresh the UI's details and the fleet view.

        Record the phase, refresh the UI's current details (served by a query) and the fleet view's search attributes.
        """
        self._state.progress.phase = phase
        self._state.estimate(workflow.now())
        workflow.set_current_details(self._state.progress.details_markdown())
        self._fleet.show(self._state.progress, failed=self._state.failed, stopping=self._state.stopping)
