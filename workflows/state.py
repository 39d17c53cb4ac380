"""``RunState``: all of a resumption run's state in one object, built from the input's ``Carry`` and packed back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from temporalio.exceptions import ApplicationError

from xmc_resumption.activities.requests import ExperimentRef
from xmc_resumption.redisclient.failover import later_id
from xmc_resumption.redisclient.publish import PublishParams
from xmc_resumption.redisclient.readings import BacklogReading, GroupStatus, MissingGroupPolicy
from xmc_resumption.redisclient.results import (
    ClaimCheck,
    ClaimGrant,
    PublishResult,
    PublishRounds,
    Release,
    ReleaseRecord,
)
from xmc_resumption.redisclient.text import show_name
from xmc_resumption.workflows.calls import MAX_SCRIPTS_PER_CALL
from xmc_resumption.workflows.control import INVALID_CONTROL, RESUMPTION_ENDING, ControlChange, InvalidControlError
from xmc_resumption.workflows.eta import NetRate, eta_seconds
from xmc_resumption.workflows.models import (
    AUTO_BATCH_SIZE,
    AUTO_SCRIPT_BYTES,
    START_BATCH_SIZE,
    Carry,
    Outcome,
    Progress,
    ResumptionInput,
    ResumptionResult,
)
from xmc_resumption.workflows.ratecap import TaskBucket
from xmc_resumption.workflows.throttle import Pacer, StallWatch

COUNTS = {"token", "replayed", "remaining", "throttles", "turns", "runs", "redelivered", "last_moved_id"}
"""The progress's counters a run hands the next one (``Carry``), and the last held entry ID Redis said it moved."""


@dataclass
class RunState:
    """What one run of ``ResumptionWorkflow`` knows and changes.

    Attributes:
        input: the input, as changed by accepted control Updates (it is the next run's).
        seq: the last publish sequence number used (the publish script's idempotency key).
        owner, request_id, started_at: the claim's owner, the acquire's idempotency key, the first run's start
            (workflow time, UTC): set by ``begin``.
        publish_next: the next turn publishes without a check (right after the claim, or a publish that left headroom).
        wake: an accepted Update ends the durable wait in progress, if any.
        hold: what holds the replay back besides the consumers (Redis's memory), until a task moves.
        stall_base: the stall reason without the idle consumers, None when not stalled.
        outcome_counted: the outcomes metric has this run's end already (the release activity counted it).
        lease_until: when the claim's lease lapses at the latest (workflow time, UTC); None before a call extended it.
        task_bytes: the mean bytes of a task the last publish moved, for the automatic batch; None before one moved.
        stream_capped: the stream's cap cut the last publish short (docs/operating.md, "ETA").
        wait_id, turn: the last poll's number in this run, and whether the worker gave that poll's queued wait its
            turn (signal ``TURN_SIGNAL``; docs/pacing.md, "Many replays on one worker").
    """

    input: ResumptionInput
    progress: Progress
    pacer: Pacer
    stall: StallWatch
    seq: int = 0
    owner: str = ""
    request_id: str = ""
    started_at: datetime | None = None
    publish_next: bool = False
    nothing_held: bool = False
    stopping: bool = False
    failed: bool = False
    wake: bool = False
    net: NetRate = field(default_factory=NetRate)
    bucket: TaskBucket = field(default_factory=TaskBucket)
    hold: str | None = None
    stall_base: str | None = None
    idle_read_at: datetime | None = None
    outcome_counted: bool = False
    lease_until: datetime | None = None
    task_bytes: float | None = None
    stream_capped: bool = False
    wait_id: int = 0
    turn: bool = False

    @classmethod
    def of(cls, inp: ResumptionInput) -> RunState:
        """The state a run starts from: ``inp.carry``'s when it continues a resumption, else fresh."""
        carry = inp.carry
        counts = carry.model_dump(include=COUNTS | {"drain_rate"}) | {"runs": carry.runs + 1} if carry else {}
        counts = counts or {"last_moved_id": inp.moved_through}
        return cls(
            input=inp,
            progress=Progress(experiment_id=inp.experiment_id, threshold=inp.max_backlog_threshold, **counts),
            pacer=Pacer(
                rate=carry.drain_rate if carry else None,
                reaction=carry.reaction_seconds if carry else None,
                burst=carry.burst if carry and carry.burst else 0,
            ),
            stall=StallWatch(
                progress_at=carry.progress_at if carry else None,
                last=carry.stall_reading if carry else None,
            ),
            seq=carry.seq if carry else 0,
            net=carry.net_rate.model_copy() if carry and carry.net_rate else NetRate(),
            bucket=carry.rate_bucket.model_copy() if carry and carry.rate_bucket else TaskBucket(),
        )

    def begin(
        self, workflow_id: str, continued_run_id: str | None, now: datetime, draw_request_id: Callable[[], str]
    ) -> None:
        """Set the owner, the start time and the request ID: the carry's in a continued run, else fresh ones.

        Raises:
            ApplicationError: non-retryable, type ``InvalidInput``: a caller set ``carry``.
        """
        carry = self.input.carry
        if carry is not None and continued_run_id is None:
            raise ApplicationError(
                "carry: set by the workflow itself when it continues as new; leave it out of the input",
                type="InvalidInput",
                non_retryable=True,
            )
        self.owner = carry.owner if carry else workflow_id
        self.started_at = carry.started_at if carry else now
        self.request_id = carry.request_id if carry else draw_request_id()

    @property
    def batch_size(self) -> int:
        """The most tasks one publish script moves (entries): the input's, else the automatic batch (``task_bytes``)."""
        if self.input.batch_size is not None:
            return self.input.batch_size
        if self.task_bytes is None:
            return START_BATCH_SIZE
        return max(1, min(AUTO_BATCH_SIZE, int(AUTO_SCRIPT_BYTES // max(1.0, self.task_bytes))))

    def leased(self, now: datetime) -> None:
        """Note that a call which extends the claim's lease answered at workflow time ``now``."""
        self.lease_until = now + timedelta(seconds=self.input.claim_lease_seconds)

    @property
    def ref(self) -> ExperimentRef:
        """The experiment, stream and consumer groups every call of the run works on (from the input)."""
        inp = self.input
        return ExperimentRef(
            experiment_id=inp.experiment_id,
            stream=inp.stream,
            consumer_group=inp.consumer_group,
            consumer_groups=inp.consumer_groups,
        )

    def publish_params(self, batch_size: int, max_tasks: int | None, max_seconds: float) -> PublishParams:
        """The next publish's parameters, from the input in force, the claim and the seq (``PublishParams``).

        Its first seq is the last used plus one: a publish that failed after its scripts ran is asked again the same.
        ``moved_through`` and ``replayed``: docs/contract.md, "Redelivered tasks".
        """
        inp = self.input
        return PublishParams(
            token=self.token,
            seq=self.seq + 1,
            batch_size=batch_size,
            threshold=inp.max_backlog_threshold,
            owner=self.owner,
            lease_ms=inp.lease_ms,
            missing_group=inp.missing_group,
            max_bytes=inp.max_bytes_per_call,
            max_memory_fraction=inp.max_memory_fraction,
            fair_share=inp.fair_share,
            max_tasks=max_tasks,
            max_scripts=MAX_SCRIPTS_PER_CALL,
            max_seconds=max_seconds,
            moved_through=self.progress.last_moved_id,
            replayed=self.progress.replayed,
        )

    @property
    def token(self) -> int:
        """The fencing token this resumption holds; 0 until the claim is taken."""
        return self.progress.token

    def observe(self, reading: BacklogReading, now: datetime, moved: int = 0) -> bool:
        """Fold in a backlog ``reading`` taken at workflow time ``now``, before ``moved`` entries; True at a stall."""
        p = self.progress
        pending, lag, last_delivered_id = reading.pending, reading.lag, reading.last_delivered_id
        backlog = pending + lag
        p.backlog, p.pending, p.lag = backlog + moved, pending, lag + moved
        p.limiting_group = reading.limiting_group or None
        p.unattended_groups, p.limiting_idle_ms = list(reading.unattended), reading.limiting_idle_ms
        self.pacer.observe(backlog, backlog + moved, reading.capped, now)
        p.drain_rate, p.low_watermark = self.pacer.rate, self.pacer.low_watermark(self.input.pacing)
        self.net.observe(p.replayed, backlog + moved, reading.capped, now)
        p.net_rate = self.net.rate
        p.stalled_seconds = self.stall.observe(now, backlog, pending, last_delivered_id, moved)
        stalled = p.stalled_seconds >= self.input.stall_window_seconds
        started = stalled and not p.stalled
        p.stalled = stalled
        group = f" of group {show_name(reading.limiting_group)}" if reading.limiting_group else ""
        if moved:
            self.hold = None
        self.stall_base = (
            (self.missing_text(reading) or f"backlog {backlog}{group} (pending {pending}) not going down, "
             f"last-delivered-id {last_delivered_id or 'none'}") + (f"; {self.hold}" if self.hold else "")
            if stalled
            else None
        )  # fmt: skip
        if not stalled:
            p.idle_consumers, self.idle_read_at = [], None
        self.show_stall()
        return started

    def stall_over_limit(self) -> bool:
        """True when the stall has lasted ``max_stall_seconds`` (the run ends ``stalled``)."""
        limit = self.input.max_stall_seconds
        return limit is not None and self.progress.stalled_seconds >= limit

    def show_stall(self) -> None:
        """Set the stall reason: what was seen, then the idle consumers holding pending entries, if read."""
        p = self.progress
        idle = "; ".join(c.describe() for c in p.idle_consumers)
        p.stall_reason = self.stall_base and (
            self.stall_base + (f"; pending entries held by idle consumers: {idle}" if idle else "")
        )

    def missing_text(self, reading: BacklogReading) -> str | None:
        """Why no group can be measured, naming the stream and the group; None when both exist."""
        inp = self.input
        group = reading.missing_group or inp.consumer_group
        if reading.status is GroupStatus.NO_STREAM:
            text = f"stream {inp.stream} does not exist, so neither does consumer group {group}"
        elif reading.status is GroupStatus.NO_GROUP:
            text = f"consumer group {group} does not exist on stream {inp.stream}"
        else:
            return None
        if inp.missing_group is MissingGroupPolicy.ZERO:
            return text + " (missing_group zero: the stream's entries count as its backlog)"
        return text + f" (missing_group {inp.missing_group.value}: nothing moves until it exists)"

    def claimed(self, grant: ClaimGrant) -> None:
        """Take the claim's reply into the progress: the token, the counts, and the tasks held again."""
        p = self.progress
        p.token, p.held_again = grant.token, grant.held_again
        self._counts(grant.replayed, grant.held)
        if grant.redelivered is not None:
            p.redelivered = max(p.redelivered, grant.redelivered)

    def checked(self, check: ClaimCheck) -> None:
        """Take a check's counts into the progress (a reset run of a continued one starts from an older carry)."""
        self._counts(check.replayed, check.held)

    def _counts(self, replayed: int | None, remaining: int | None) -> None:
        """Take Redis's count of the resume's moves and of the held tasks left into the progress (None: kept)."""
        p = self.progress
        if replayed is not None:
            p.replayed = replayed
        if remaining is not None:
            p.remaining = remaining

    def count(self, result: PublishResult) -> None:
        """Take a publish's counts into the progress: Redis's count of the resume's, else the claim's, else a sum."""
        p = self.progress
        if result.moved > 0 and result.moved_bytes > 0:
            self.task_bytes = result.moved_bytes / result.moved
        if result.replayed is not None:
            p.replayed = result.replayed
        elif result.total_moved is not None:
            p.replayed = result.total_moved
        elif not result.repeated:  # (a recorded result returned again moved nothing now)
            p.replayed += result.moved
        p.remaining = result.remaining

    def moved_again(self, rounds: PublishRounds) -> None:
        """Take a publish call's last moved ID and redeliveries (Redis's count, else a sum) into the progress."""
        p = self.progress
        p.last_moved_id = later_id(p.last_moved_id, rounds.last_moved_id)
        total = rounds.final.redelivered_total
        p.redelivered = max(p.redelivered, total) if total is not None else p.redelivered + rounds.fresh_redelivered

    def released(self, release: Release) -> None:
        """Take a release's reply into the progress; a release with an outcome had it counted by its activity."""
        self._counts(release.replayed, release.remaining)
        self.outcome_counted = self.outcome_counted or (release.token > 0 and release.outcome != "")

    def recorded_release(self, record: ReleaseRecord) -> Outcome:
        """Take the release this run recorded before (a turn run again) into the progress and return its outcome.

        Raises:
            ApplicationError: non-retryable, type ``EndedBefore``: the run failed before (no ``Outcome`` recorded).
        """
        self._counts(record.replayed, record.remaining)
        self.outcome_counted = True
        if record.outcome not in {o.value for o in Outcome}:
            raise ApplicationError(
                f"this run ended {record.outcome} before; its release is recorded in Redis",
                type="EndedBefore",
                non_retryable=True,
            )
        return Outcome(record.outcome)

    def refuse(self, change: ControlChange) -> None:
        """Refuse a control change that the run cannot take (an Update's validator).

        Raises:
            ApplicationError: non-retryable, type ``ResumptionEnding``, or ``InvalidControl`` naming the field.
        """
        if self.progress.outcome is not None or self.stopping:
            raise ApplicationError(
                "the resumption is ending; nothing to change", type=RESUMPTION_ENDING, non_retryable=True
            )
        try:
            change.checked_against(self.input)
        except InvalidControlError as err:
            raise ApplicationError(str(err), type=INVALID_CONTROL, non_retryable=True) from None

    def apply(self, change: ControlChange) -> ResumptionInput:
        """Apply a change ``refuse`` let through and return the new input; it wakes a durable wait in progress."""
        inp = self.input = change.applied_to(self.input)
        self.progress.settings_changes += 1
        self.wake = True
        return inp

    def shown(self) -> Progress:
        """The ``progress`` query's answer: the progress, with the settings in force read from the input."""
        inp = self.input
        return self.progress.model_copy(
            update={
                "threshold": inp.max_backlog_threshold,
                "policy": inp.throttle_policy,
                "max_tasks_per_second": inp.max_tasks_per_second,
            }
        )

    def result(self) -> ResumptionResult:
        """The run's result, once ``progress.outcome`` is set."""
        p = self.progress
        assert p.outcome is not None, "set the outcome first"
        fields = p.model_dump(include=set(ResumptionResult.model_fields))
        return ResumptionResult.model_validate(fields | {"remaining": p.remaining or 0})

    def carry(self) -> Carry:
        """What the next run needs, for continue-as-new."""
        p = self.progress
        assert self.started_at is not None, "begin() sets it before the first turn"
        return Carry(
            **p.model_dump(include=COUNTS),
            request_id=self.request_id,
            owner=self.owner,
            seq=self.seq,
            started_at=self.started_at,
            drain_rate=self.pacer.rate,
            reaction_seconds=self.pacer.reaction,
            burst=self.pacer.burst or None,
            progress_at=self.stall.progress_at,
            stall_reading=self.stall.last,
            net_rate=self.net,
            rate_bucket=self.bucket if self.bucket.at is not None else None,
        )

    def estimate(self, now: datetime) -> None:
        """Set the progress's ETA at workflow time ``now`` (docs/operating.md, "ETA")."""
        p = self.progress
        if p.outcome is not None or self.failed:
            p.eta_seconds = 0.0 if p.outcome is Outcome.COMPLETED else None
        elif p.limiting_idle_ms is not None and p.limiting_idle_ms >= self.input.stall_window_seconds * 1000:
            p.eta_seconds = None  # the group that holds the replay does not drain: no time can be told
        else:
            threshold = self.input.max_backlog_threshold
            headroom = threshold - p.backlog if p.backlog is not None else 0
            stream = p.stream_rate_limit
            if stream and self.stream_capped and self.net.rate:
                stream = min(stream, self.net.rate)  # its share: other replays take from the same bucket
            caps = [c for c in (self.input.max_tasks_per_second, stream) if c]
            low = self.pacer.low_watermark(self.input.pacing)
            wait_left = (p.throttled_until - now).total_seconds() if p.throttled_until else 0.0
            p.eta_seconds = eta_seconds(
                p.remaining,
                headroom,
                self.net.rate,
                min(caps) if caps else None,
                refill=threshold - low if low is not None else 0,
                wait_left=max(0.0, wait_left),
            )
        p.eta_at = None if p.eta_seconds is None else now + timedelta(seconds=p.eta_seconds)

    def next_input(self) -> ResumptionInput:
        """The input of the next run: the current input (with accepted changes) and ``carry()``."""
        return self.input.model_copy(update={"carry": self.carry()})
