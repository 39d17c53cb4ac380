"""``RunState``: all of a resumption run's state in one object.

Built from the input's ``Carry`` and packed back into one for continue-as-new (the samples' ``safe_message_handlers``
pattern).

Workflow code only (deterministic: no I/O, no clock). ``Carry`` (``workflows/models.py``) stays the
wire form: it is part of the input contract, and recorded histories' continue-as-new inputs hold it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from temporalio.exceptions import ApplicationError

from xmc_resumption.activities.requests import ExperimentRef
from xmc_resumption.redisclient.publish import PublishParams
from xmc_resumption.redisclient.readings import BacklogReading, GroupStatus, MissingGroupPolicy
from xmc_resumption.redisclient.results import ClaimCheck, ClaimGrant, PublishResult, Release, ReleaseRecord
from xmc_resumption.redisclient.text import show_name
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

COUNTS = {"token", "replayed", "remaining", "throttles", "turns", "runs"}
"""The progress's counters a run hands the next one (``Carry``)."""


@dataclass
class RunState:
    """What one run of ``ResumptionWorkflow`` knows and changes.

    Attributes:
        input: the input, as changed by accepted control Updates (carried: it is the next run's).
        progress: the ``progress`` query's answer; holds the token and the counters.
        pacer: the throttle policy's state (drain rate, reaction time).
        stall: the stall watch's state.
        seq: the last publish sequence number used (the publish script's idempotency key).
        owner: the claim's owner (the workflow ID of the first run); request_id: the acquire's
            idempotency key; started_at: when the first run started (workflow time, UTC). All
            three are set by ``begin`` ('' and None until then).
        publish_next: the claim was just taken, or the last publish left headroom: the next turn
            publishes without a check.
        nothing_held: the claim found the experiment running and holding nothing: the run ends
            ``nothing_held``.
        stopping: the ``pause`` Update was accepted: the run ends ``paused`` at its next turn.
        failed: the run is failing (a fault retrying cannot mend, or a fault of the workflow code).
        wake: an accepted Update ends the durable throttle wait in progress, if any.
        net: the net drain rate behind the ETA (``workflows/eta.py``).
        bucket: the ``max_tasks_per_second`` bucket (``workflows/ratecap.py``).
        hold: what holds the replay back besides the consumers (Redis's memory), for the stall
            reason; cleared when a task moves.
        stall_base: the stall reason without the idle consumers (``observe``), None when not stalled.
        idle_read_at: when the idle consumers were last read during this stall (workflow time).
        outcome_counted: the outcomes metric has this run's end already: counted by the release
            activity (a release done now, or one returned again from its record), so the workflow does not
            count it.
        lease_until: when the claim's lease lapses at the latest, as of the last call that
            extended it (``leased``; workflow time, UTC); None before one in this run.
        task_bytes: the mean bytes of a task the last publish moved (its ``moved_bytes`` over
            ``moved``), for the automatic batch; None before one moved any in this run.
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

    @classmethod
    def of(cls, inp: ResumptionInput) -> RunState:
        """The state a run starts from: ``inp.carry``'s when it continues a resumption, else fresh.

        The owner, request ID and start time are ``begin``'s.
        """
        carry = inp.carry
        counts = carry.model_dump(include=COUNTS | {"drain_rate"}) | {"runs": carry.runs + 1} if carry else {}
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
        """Set the owner, the start time and the request ID.

        The carry's in a continued run (one with a ``continued_run_id``), else ``workflow_id``, ``now`` and one
        ``draw_request_id()`` (drawn once per resumption and carried: every try of the acquire, in any run, is one
        request).

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
        """The most tasks one publish script moves (entries): the input's, else the automatic batch.

        The automatic batch is about ``AUTO_SCRIPT_BYTES`` of tasks of the size the last publish moved
        (``task_bytes``), 1..``AUTO_BATCH_SIZE``; ``START_BATCH_SIZE`` before a publish of this run moved any.
        """
        if self.input.batch_size is not None:
            return self.input.batch_size
        if self.task_bytes is None:
            return START_BATCH_SIZE
        return max(1, min(AUTO_BATCH_SIZE, int(AUTO_SCRIPT_BYTES // max(1.0, self.task_bytes))))

    def leased(self, now: datetime) -> None:
        """Note that a call which extends the claim's lease (acquire, check, publish) answered at workflow time ``now``.

        The lease lapses by ``now + claim_lease_seconds``.
        """
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

    def publish_params(
        self, batch_size: int, max_tasks: int | None, max_scripts: int, max_seconds: float
    ) -> PublishParams:
        """The next publish's parameters, from the input in force, the claim and the seq.

        Its first seq is the last used plus one: the seq moves on only once a publish answered (``seq``), so a publish
        that failed after its scripts ran in Redis is asked again with the same seq and returns its recorded result.
        ``batch_size`` (entries) and the rounds' bounds are the caller's (``redisclient.publish.PublishParams``).
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
            max_scripts=max_scripts,
            max_seconds=max_seconds,
        )

    @property
    def token(self) -> int:
        """The fencing token this resumption holds; 0 until the claim is taken."""
        return self.progress.token

    def observe(self, reading: BacklogReading, now: datetime, moved: int = 0) -> bool:
        """Fold a backlog ``reading`` taken at workflow time ``now`` into the run's state; True when a stall starts.

        ``moved``: entries the same step moved after the reading. The reading goes into the progress, the pacer and the
        stall watch; the stall reason names the limiting group, or the missing stream or group (``missing_text``).
        """
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
        """Take the claim's reply into the progress.

        The token, the held tasks and the resume's count so far (kept when unknown).
        """
        p = self.progress
        p.token, p.remaining = grant.token, grant.held
        if grant.replayed is not None:
            p.replayed = grant.replayed

    def checked(self, check: ClaimCheck) -> None:
        """Take a check's counts into the progress.

        The held tasks, and the resume's count (kept when unknown): a reset run of a continued one starts from an older
        carry.
        """
        p = self.progress
        p.remaining = check.held
        if check.replayed is not None:
            p.replayed = check.replayed

    def count(self, result: PublishResult) -> None:
        """Take a publish's counts into the progress.

        Redis's count is the authority: the resume's (``replayed``: every claim's moves, a reset workflow's too), else
        the claim's (``total_moved``), else (Redis keeps neither count) the run's own sum. Publishes whose history was
        lost are in it too (a stale reply after a lost history adds what this run never saw). The size of the tasks it
        moved sets ``task_bytes``.
        """
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

    def released(self, release: Release) -> None:
        """Take a release's reply into the progress.

        The resume's count and the held tasks left, as Redis recorded them (None: unknown, kept). A release with an
        outcome, done now or returned again from its record, had its outcome counted by the release activity.
        """
        p = self.progress
        if release.replayed is not None:
            p.replayed = release.replayed
        if release.remaining is not None:
            p.remaining = release.remaining
        self.outcome_counted = self.outcome_counted or (release.token > 0 and release.outcome != "")

    def recorded_release(self, record: ReleaseRecord) -> Outcome:
        """Take a recorded release into the progress and return its outcome.

        A turn run again after this run released its claim (a workflow task whose completion was lost): take the
        release's record (outcome, the resume's count, held tasks left) into the progress; returns its outcome.

        Raises:
            ApplicationError: non-retryable, type ``EndedBefore``: the recorded outcome is none of
                ``Outcome`` (the run failed before).
        """
        p = self.progress
        if record.replayed is not None:
            p.replayed = record.replayed
        p.remaining = record.remaining
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

        It cannot once it is ending, nor one that breaks a bound or a rule of ``ResumptionInput``.

        Raises:
            ApplicationError: non-retryable, type ``ResumptionEnding``, or ``InvalidControl`` with
                one line naming the field.
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
        """Set the progress's ETA at workflow time ``now``.

        Computed by ``workflows/eta.py`` from the net drain rate, the last reading, the adaptive policy's refill, the
        rate caps and a durable wait in progress; 0 once completed, None once ended otherwise.
        """
        p = self.progress
        if p.outcome is not None or self.failed:
            p.eta_seconds = 0.0 if p.outcome is Outcome.COMPLETED else None
        elif p.limiting_idle_ms is not None and p.limiting_idle_ms >= self.input.stall_window_seconds * 1000:
            p.eta_seconds = None  # the group that holds the replay does not drain: no time can be told
        else:
            threshold = self.input.max_backlog_threshold
            headroom = threshold - p.backlog if p.backlog is not None else 0
            caps = [c for c in (self.input.max_tasks_per_second, p.stream_rate_limit) if c]
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
