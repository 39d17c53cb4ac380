"""Pydantic models of the workflow's external contract (docs/contract.md).

``ResumptionInput`` is what callers send (Temporal CLI ``--input``, ``start_workflow``, a parent's
``start_child_workflow``); ``ResumptionResult`` is what the run returns; ``Progress`` is what the
``progress`` query returns. All travel through ``temporalio.contrib.pydantic.pydantic_data_converter``.
The activities' request envelopes are internal and live in ``activities/requests.py``.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from xmc_resumption.redisclient.backlog import DEFAULT_BYTE_BUDGET, MAX_GROUPS
from xmc_resumption.redisclient.fencing import MAX_LEASE_MS
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, MAX_NAME_LENGTH, validate_name
from xmc_resumption.redisclient.memory import DEFAULT_MEMORY_FRACTION
from xmc_resumption.redisclient.ratecap import MAX_TASKS_PER_SECOND, MIN_TASKS_PER_SECOND
from xmc_resumption.redisclient.results import IdleConsumer, MissingGroupPolicy
from xmc_resumption.workflows.eta import NetRate
from xmc_resumption.workflows.ratecap import TaskBucket
from xmc_resumption.workflows.throttle import MAX_RATE

WORKFLOW_TYPE = "ResumptionWorkflow"
TASK_QUEUE = "xmc-resumption"


MAX_WAIT_SECONDS = 86_400.0
"""The longest single wait (seconds): one day; a longer durable timer is never what an operator means."""

MAX_RUN_SECONDS = 7 * 86_400.0
"""The longest ``max_run_seconds`` (seconds): a week."""

MAX_LEASE_SECONDS = MAX_LEASE_MS / 1000
"""The longest claim lease (seconds): a week (``redisclient.fencing.MAX_LEASE_MS``)."""


class ThrottlePolicy(StrEnum):
    """How long the replay waits once the backlog reaches the threshold (``workflows/throttle.py``).

    ``fixed``: the seed's rule: a durable timer of ``throttle_seconds``, then back to the check.
    ``adaptive``: estimate the consumers' drain rate and wait about as long as they need to bring
    the backlog down to a low watermark (within ``min_wait_seconds`` .. ``max_wait_seconds``), then
    top the stream up to the threshold. Short waits poll the backlog inside one local activity;
    long ones are durable timers.
    """

    FIXED = "fixed"
    ADAPTIVE = "adaptive"


def workflow_id_for(experiment_id: str) -> str:
    """The conventional workflow ID of an experiment's resumption: ``resumption-<E>``."""
    return f"resumption-{experiment_id}"


class StartOptions(TypedDict):
    """Keyword arguments of a start: see ``ResumptionInput.start_options``."""

    id: str
    task_queue: str
    static_summary: str
    static_details: str


class Carry(BaseModel):
    """State carried across continue-as-new (``workflows/state.py`` ``RunState.carry``); callers never set it.

    Attributes:
        token: the fencing token taken by the first run; 0 while the claim is still to be taken
            (a long Redis outage at the start).
        request_id: the acquire's idempotency key, the same in every run of one resumption.
        owner: the claim's owner (the workflow ID).
        seq: the last publish sequence number used (the publish script's idempotency key).
        replayed: tasks replayed so far (entries).
        remaining: held tasks left at the last reply from Redis (entries), so a run that ends
            before its first call (a pause just after continue-as-new) still tells it; None in
            carries written before it existed.
        throttles: throttle waits so far.
        turns: turns of the loop so far.
        runs: runs before this one (continue-as-new count).
        started_at: when the first run started (workflow time, UTC).
        drain_rate: the adaptive policy's drain-rate estimate (entries per second) or None.
        reaction_seconds: the measured time from the end of a wait to the next publish (seconds).
        burst: the adaptive policy's learned burst of the consumers (entries), None when none.
        progress_at: when the backlog last went down or tasks last moved (workflow time, UTC):
            the anchor of the stall window; stall_reading: the last (backlog, pending,
            last-delivered-id) it compared.
        net_rate: the ETA's net drain rate average (``workflows/eta.py``), None in carries
            written before it existed.
        rate_bucket: the ``max_tasks_per_second`` bucket (``workflows/ratecap.py``), None when
            the replay has no cap of its own yet.
    """

    model_config = ConfigDict(extra="forbid")

    token: int = Field(ge=0)
    request_id: str = Field(min_length=1)
    owner: str
    seq: int = Field(ge=0)
    replayed: int = Field(ge=0)
    remaining: int | None = Field(default=None, ge=0)
    throttles: int = Field(ge=0)
    turns: int = Field(ge=0)
    runs: int = Field(ge=0)
    started_at: datetime
    drain_rate: float | None = Field(default=None, ge=0, le=MAX_RATE, allow_inf_nan=False)
    reaction_seconds: float | None = Field(default=None, gt=0, le=60, allow_inf_nan=False)
    burst: int | None = Field(default=None, ge=1, le=100_000)
    progress_at: datetime | None = None
    stall_reading: tuple[int, int, str] | None = None
    net_rate: NetRate | None = None
    rate_bucket: TaskBucket | None = None


MAX_BATCH_SIZE = 10_000
"""The largest ``batch_size`` accepted (entries)."""

AUTO_BATCH_SIZE = 500
"""The largest automatic batch (entries; one script fills the default threshold's headroom): the batch of a replay
whose input leaves ``batch_size`` out is about ``AUTO_SCRIPT_BYTES`` of its tasks, at most this many."""

AUTO_SCRIPT_BYTES = 128 * 1024
"""What one script of an automatic batch moves, about (bytes, as the publish script counts them: ``moved_bytes``):
with tasks of 1 KiB about the old default batch of 100 (docs/pacing.md, "The loop's own cost")."""

LEGACY_BATCH_SIZE = 100
"""The batch of runs started before patch ``publish-rounds`` whose input left ``batch_size`` out (entries): the
default then."""


class ResumptionInput(BaseModel):
    """Input of ``ResumptionWorkflow``; only ``experiment_id`` is required. Unknown fields are errors.

    Attributes:
        experiment_id: the experiment ``E`` to resume; stream: the task stream's key. Both become
            parts of keys: 1 to 200 letters, digits and ``. _ : / @ + = -``
            (``redisclient.keys.validate_name``, the one rule every entry point applies).
        consumer_group: the consumer group that must exist before anything moves (see
            ``missing_group``), measured first, and the label of the metrics; a name by the same
            rule (it reaches XINFO, logs and the UI).
        consumer_groups: the groups whose backlog bounds the replay, each of which must exist,
            ``consumer_group`` among them (1..64 distinct names; ``[consumer_group]`` is the seed's
            one-group rule); None (the default): every group of the stream, at most 64, re-read at
            each measurement, so a group created during the replay bounds it from then on. The
            replay waits while the largest backlog among them is at the threshold; the progress
            names the group that holds it back (``limiting_group``; docs/memory.md).
        batch_size: the most tasks one publish script moves (entries, 1..10,000); None (the
            default): automatic, about ``AUTO_SCRIPT_BYTES`` of tasks as the last publish measured
            them, 1..``AUTO_BATCH_SIZE`` (``LEGACY_BATCH_SIZE`` before a publish moved any; runs
            started before patch ``publish-rounds`` without the field keep ``LEGACY_BATCH_SIZE``).
            Either way a publish moves at most the headroom, in as many scripts as the batch and
            the byte budget need (docs/pacing.md, "The loop's own cost").
        max_backlog_threshold: at or above this backlog (entries) the replay waits; at most
            100,000, since counting the lag reads up to this many entries inside a Lua script,
            which blocks Redis while it runs.
        throttle_seconds: how long one throttle wait of the ``fixed`` policy lasts (seconds, a
            durable timer), and the default longest wait of the ``adaptive`` one.
        throttle_policy: ``adaptive`` (the default since patch ``pacing-probe``; runs started before
            it without the field keep ``fixed``) or ``fixed``: see ``ThrottlePolicy`` and docs/pacing.md.
        min_wait_seconds, max_wait_seconds: bounds of one adaptive wait (seconds); the maximum
            defaults to ``throttle_seconds``.
        claim_lease_seconds: the claim's lease (seconds), extended every turn; it must outlast
            every wait (throttle, Redis outage) so a healthy replay never lets it lapse.
        redis_retry_seconds: the durable wait after a Redis fault outlasted a call's retries,
            before the turn starts over (seconds).
        stall_window_seconds: the replay is ``stalled`` when the backlog has not gone down, and no
            task moved, for this long (seconds); it shows in the progress and the UI.
        max_stall_seconds: when set, a stall this long ends the run with outcome ``stalled``
            (claim released, experiment back to paused, nothing lost); None waits for ever.
        max_bytes_per_call: the byte budget of one Redis script (bytes, 64 KiB..64 MiB): counting
            the lag reads about this many bytes of entries at most (more undelivered bytes than
            that count as a full backlog: the replay waits), and one publish moves about this many
            bytes at most, so large tasks never block Redis for long.
        missing_group: what a missing stream or required group means (``MissingGroupPolicy``):
            ``wait`` (the default) moves nothing and waits in phase ``waiting_for_group`` (a durable
            timer of ``throttle_seconds`` per check; stall detection and ``max_stall_seconds``
            apply); ``zero`` counts the stream's entries as its backlog, so at most the threshold
            goes in, and a group created later at ``$`` never sees those tasks; ``error`` fails
            the run.
        turns_per_run: continue-as-new after this many turns (or earlier when Temporal suggests it)
            to keep each run's history small.
        max_run_seconds: continue-as-new once a run has lasted this long (seconds of workflow time
            from the run's start, checked between turns, so a run lasts at most this plus one
            turn; 0 < s <= 7 days, default an hour). With Worker Versioning the next run starts on
            the current Worker Deployment Version, so no run stays on an older release for longer
            (docs/operating.md, "Rolling out a release").
        carry: set by the workflow itself when it continues as new.
        max_memory_fraction: with headroom left, the replay waits (a durable timer of
            ``throttle_seconds``, whatever the policy) while Redis's used memory is at or above this
            share of ``maxmemory`` (0 < f <= 1, default 0.9, read inside the publish script); None,
            or a Redis without ``maxmemory``, never (``redisclient.memory``).
        fair_share: take at most this experiment's weighted share of the headroom among the
            replays of the stream that set it too (weights in ``{S}:weights``, default 1; see
            ``redisclient.weights``), so one replay cannot take the shared threshold's headroom
            from the others (one publish call takes one share); off: a publish takes up to all of it,
            ``batch_size`` a script.
        max_tasks_per_second: when set, the replay moves at most this many tasks per second
            (0.001..1,000,000; a token bucket of one second's worth, at least one task, on
            workflow time: ``workflows/ratecap.py``); None, no cap of its own. A stream-wide cap
            shared by every replay of the stream is set in Redis (``{S}:rate``,
            ``redisclient.ratecap``) and enforced by the publish script; both apply. Changed live
            by the ``set_max_tasks_per_second`` Update.

    Every number is finite and bounded (the bounds are in the field definitions below), and of
    its own type: numbers and ``fair_share`` are strict (``true`` is no integer, ``"5"`` no
    number; an integer is a decimal). A bad value fails the run at once with a
    ``ValidationError`` naming the field.
    """

    model_config = ConfigDict(extra="forbid")

    experiment_id: str = Field(min_length=1, max_length=MAX_NAME_LENGTH)
    stream: str = Field(default=DEFAULT_STREAM, min_length=1, max_length=MAX_NAME_LENGTH)
    consumer_group: str = Field(default=DEFAULT_GROUP, min_length=1, max_length=MAX_NAME_LENGTH)
    consumer_groups: list[str] | None = Field(default=None, min_length=1, max_length=MAX_GROUPS)
    batch_size: int | None = Field(default=None, ge=1, le=MAX_BATCH_SIZE, strict=True)
    max_backlog_threshold: int = Field(default=500, ge=1, le=100_000, strict=True)
    throttle_seconds: float = Field(default=10.0, gt=0, le=MAX_WAIT_SECONDS, allow_inf_nan=False, strict=True)
    throttle_policy: ThrottlePolicy = ThrottlePolicy.ADAPTIVE
    min_wait_seconds: float = Field(default=0.0, ge=0, le=60, allow_inf_nan=False, strict=True)
    max_wait_seconds: float | None = Field(default=None, gt=0, le=MAX_WAIT_SECONDS, allow_inf_nan=False, strict=True)
    claim_lease_seconds: float = Field(default=120.0, gt=0, le=MAX_LEASE_SECONDS, allow_inf_nan=False, strict=True)
    redis_retry_seconds: float = Field(default=10.0, gt=0, le=3_600, allow_inf_nan=False, strict=True)
    stall_window_seconds: float = Field(default=300.0, gt=0, le=7 * MAX_WAIT_SECONDS, allow_inf_nan=False, strict=True)
    max_stall_seconds: float | None = Field(
        default=None, gt=0, le=30 * MAX_WAIT_SECONDS, allow_inf_nan=False, strict=True
    )
    max_bytes_per_call: int = Field(default=DEFAULT_BYTE_BUDGET, ge=64 * 1024, le=64 * 1024 * 1024, strict=True)
    missing_group: MissingGroupPolicy = MissingGroupPolicy.WAIT
    turns_per_run: int = Field(default=500, ge=1, le=10_000, strict=True)
    max_run_seconds: float = Field(default=3_600.0, gt=0, le=MAX_RUN_SECONDS, allow_inf_nan=False, strict=True)
    carry: Carry | None = None
    max_memory_fraction: float | None = Field(
        default=DEFAULT_MEMORY_FRACTION, gt=0, le=1, allow_inf_nan=False, strict=True
    )
    fair_share: bool = Field(default=False, strict=True)
    max_tasks_per_second: float | None = Field(
        default=None, ge=MIN_TASKS_PER_SECOND, le=MAX_TASKS_PER_SECOND, allow_inf_nan=False, strict=True
    )

    @field_validator("experiment_id", "stream", "consumer_group")
    @classmethod
    def _key_name(cls, value: str, info: ValidationInfo) -> str:
        return validate_name(str(info.field_name), value)

    @field_validator("consumer_groups")
    @classmethod
    def _group_names(cls, value: list[str] | None) -> list[str] | None:
        for name in value or ():
            validate_name("consumer_groups", name)
        if value is not None and len(set(value)) != len(value):
            raise ValueError("consumer_groups names a group twice")
        return value

    @model_validator(mode="after")
    def _waits_fit(self) -> ResumptionInput:
        if self.consumer_groups is not None and self.consumer_group not in self.consumer_groups:
            raise ValueError(
                f"consumer_groups must include consumer_group {self.consumer_group!r} (the group that must exist)"
            )
        # the longest adaptive wait defaults to throttle_seconds: the shortest may not pass it either
        longest = self.max_wait_seconds if self.max_wait_seconds is not None else self.throttle_seconds
        if longest < self.min_wait_seconds:
            named = "max_wait_seconds" if self.max_wait_seconds is not None else "max_wait_seconds (= throttle_seconds)"
            raise ValueError(f"{named} ({longest:g}) must not be below min_wait_seconds ({self.min_wait_seconds:g})")
        # the Redis-outage wait is not among them: a lease lapsed during an outage is taken again
        # for the current token at the next check (the fence counter, not the lease, decides)
        for name in ("throttle_seconds", "max_wait_seconds"):
            wait = getattr(self, name)
            if wait is not None and self.claim_lease_seconds <= wait:
                raise ValueError(
                    f"claim_lease_seconds ({self.claim_lease_seconds:g}) must be longer than "
                    f"{name} ({wait:g}): the lease is extended once per turn"
                )
        return self

    @property
    def longest_wait_seconds(self) -> float:
        """The longest single throttle wait (seconds).

        ``throttle_seconds`` under ``fixed``, ``max_wait_seconds`` (default ``throttle_seconds``) under ``adaptive``.
        """
        if self.throttle_policy is ThrottlePolicy.ADAPTIVE and self.max_wait_seconds is not None:
            return self.max_wait_seconds
        return self.throttle_seconds

    def groups_text(self) -> str:
        """The groups that bound the replay, for the UI: ``every group of the stream`` or their names."""
        if self.consumer_groups is None:
            return "every group of the stream"
        return ", ".join(f"`{g}`" for g in self.consumer_groups)

    def ui_summary(self) -> str:
        """One line for the start's ``static_summary`` (Temporal UI, "User Metadata")."""
        return f"Resume experiment {self.experiment_id} into {self.stream} (group {self.consumer_group})"

    def ui_details(self) -> str:
        """Markdown for the start's ``static_details``: the settings this resumption runs with."""
        return (
            f"Replays the held tasks of **{self.experiment_id}** into `{self.stream}`, throttled by the "
            f"largest backlog of {self.groups_text()} (group `{self.consumer_group}` must exist).\n\n"
            f"- threshold: {self.max_backlog_threshold} entries (waits at or above it)\n"
            f"- batch: {self._batch_text()}\n"
            f"- pacing: {self._pacing_text()}; claim lease: {self.claim_lease_seconds:g} s\n"
            f"- stalled after {self.stall_window_seconds:g} s without the backlog going down"
            + (f"; ends the run after {self.max_stall_seconds:g} s" if self.max_stall_seconds else "")
            + "\n"
            f"- missing consumer group: {self.missing_group.value}; continue-as-new every {self.turns_per_run} turns "
            f"or {self.max_run_seconds:g} s"
            + (f"\n- rate cap: {self.max_tasks_per_second:g} tasks/s" if self.max_tasks_per_second else "")
        )

    def _batch_text(self) -> str:
        if self.batch_size is None:
            return f"automatic, about {AUTO_SCRIPT_BYTES // 1024} KiB of tasks (at most {AUTO_BATCH_SIZE}) per script"
        return f"up to {self.batch_size} tasks per script"

    def _pacing_text(self) -> str:
        if self.throttle_policy is ThrottlePolicy.FIXED:
            return f"fixed, {self.throttle_seconds:g} s waits"
        return f"adaptive, waits of {self.min_wait_seconds:g}..{self.longest_wait_seconds:g} s"

    def start_options(self, task_queue: str = TASK_QUEUE) -> StartOptions:
        """Keyword arguments for ``start_workflow`` / ``start_child_workflow``.

        The conventional workflow ID ``resumption-<E>``, the task queue and the UI's static summary and details.
        """
        return {
            "id": workflow_id_for(self.experiment_id),
            "task_queue": task_queue,
            "static_summary": self.ui_summary(),
            "static_details": self.ui_details(),
        }

    @property
    def lease_ms(self) -> int:
        """The claim's lease in milliseconds."""
        return max(1, round(self.claim_lease_seconds * 1000))


class Outcome(StrEnum):
    """How a resumption ended: see docs/contract.md, "Result and outcomes"."""

    COMPLETED = "completed"
    PAUSED = "paused"
    FENCED = "fenced"
    FENCE_LOST = "fence_lost"
    STALLED = "stalled"
    NOTHING_HELD = "nothing_held"
    CANCELLED = "cancelled"


class ResumptionResult(BaseModel):
    """What ``ResumptionWorkflow`` returns.

    Attributes:
        experiment_id: the experiment.
        outcome: completed (held stream drained, experiment running), paused (paused during the
            replay), fenced (a newer claim took over), fence_lost (the fence counter went back below
            this run's token: Redis lost data, e.g. a restart without persistence; nothing more is
            published), stalled (the backlog did not go down for ``max_stall_seconds``; the
            experiment was handed back as paused), nothing_held (the experiment was neither paused
            nor holding tasks: a mistyped experiment ID or stream; nothing changed).
        replayed: tasks this resumption moved into the task stream (entries, over all runs); exact:
            counted by the publish script in Redis, whatever crashed meanwhile.
        remaining: held tasks left (entries).
        throttles: throttle waits taken.
        turns: turns of the loop.
        runs: runs of the workflow (1 + continue-as-new count).
        token: the fencing token this resumption held.
        set_aside: tasks in the experiment's dead-letter stream (too many fields to move).
        release_error: None when the claim was released at the end (or none was held); else, on
            one line, why the release failed after its bounded tries and what happens next (the
            lease lapses, the experiment shows as orphaned): ``workflows/release.py``.
    """

    experiment_id: str
    outcome: Outcome
    replayed: int
    remaining: int
    throttles: int
    turns: int
    runs: int
    token: int
    set_aside: int = 0
    release_error: str | None = None


class Phase(StrEnum):
    """What the workflow is doing now, for the ``progress`` query and the UI."""

    CLAIMING = "claiming"
    CHECKING = "checking"
    MEASURING = "measuring"
    THROTTLED = "throttled"
    STALLED = "stalled"
    PUBLISHING = "publishing"
    RELEASING = "releasing"
    REDIS_UNAVAILABLE = "redis_unavailable"
    WAITING_FOR_GROUP = "waiting_for_group"
    """The stream or a required consumer group does not exist (``missing_group: wait``): nothing
    moves; ``throttle_reason`` names the stream and the group."""
    RATE_LIMITED = "rate_limited"
    """A rate cap holds the replay back (``max_tasks_per_second``, or the stream's ``{S}:rate``):
    it waits about as long as the bucket needs; not a throttle wait, not a stall."""
    DONE = "done"


class Progress(BaseModel):
    """Answer of the ``progress`` query, and what the UI's current details render.

    Attributes:
        experiment_id, token: what is being resumed and under which fencing token (0 before the claim).
        phase: what the workflow is doing now.
        replayed: tasks moved so far (entries); remaining: held tasks left at the last check (entries).
        backlog, pending, lag: the last backlog reading (entries) of ``limiting_group``, the group
            with the largest backlog, which holds the replay back (None before a reading);
            threshold: the bound (entries).
        policy: the throttle policy.
        throttles: throttle waits so far; throttle_reason: why the last one was taken.
        throttles_in_a_row: throttle waits since tasks last moved.
        throttled_until: when the current durable throttle wait ends (workflow time, UTC) or None.
        wait_plan: how the current or last wait was chosen (e.g. ``drain ~2,000/s: poll up to 2s
            for the backlog to fall to 40``); wait_seconds: its length, or a poll's bound (seconds).
        drain_rate: the adaptive policy's estimate of the consumers' drain rate (entries per
            second), None before it has one or under ``fixed``.
        low_watermark: the backlog the adaptive policy waits for (entries), None under ``fixed``.
        stalled: True when the backlog has not gone down, and no task moved, for
            ``stall_window_seconds``: the consumers are not draining (stopped workers, or a PEL
            holding entries nobody acknowledges); stall_reason says what was seen, naming the
            missing group while one is waited for, and the consumers that hold pending entries
            while idle for the stall window (``idle_consumers``, read when the stall is found and
            once per stall window after).
        stalled_seconds: how long the backlog has not gone down (seconds, at the last reading).
        redis_waits: waits for an unavailable Redis (faults that outlasted the retries);
            last_error: the last such fault.
        set_aside: held tasks the publish script could not move (too many fields), now in the
            experiment's dead-letter stream ``dead_letter_key`` (its length: entries).
        turns, runs: loop turns and runs so far; outcome: set when done.
        settings_changes: control Updates accepted (``configure``, ``set_*``); stopping: the
            ``pause`` Update was accepted and the run ends ``paused`` at its next turn.
        net_rate: the net drain rate (tasks per second: replayed minus backlog, per second of
            workflow time, averaged; ``workflows/eta.py``), None until a second was measured.
        eta_seconds: the time left until the last held task moves (seconds, as of the last
            reading: ``max(0, remaining - headroom) / net_rate``, and at least the adaptive
            policy's last refill, ``remaining / cap`` under a rate cap and what is left of a
            durable wait: ``workflows/eta.py``); 0 once nothing is held; None before a rate is
            known, with a rate of 0, or once the run ended otherwise than ``completed``. eta_at:
            when that is (workflow time, UTC): clients show ``eta_at - now``, which stays right
            during a long wait.
        max_tasks_per_second: the replay's own rate cap in force (tasks/s) or None;
            stream_rate_limit: the stream-wide cap (``{S}:rate``) the last publish saw (tasks/s),
            None without one.
        rate_waits: waits for a rate cap's bucket so far; rate_reason: why the last one was taken.
        release_error: the release at the end failed: why, and what happens next (as in the result).
    """

    experiment_id: str
    token: int = 0
    phase: Phase = Phase.CLAIMING
    replayed: int = 0
    remaining: int | None = None
    backlog: int | None = None
    pending: int | None = None
    lag: int | None = None
    limiting_group: str | None = None
    threshold: int
    policy: ThrottlePolicy = ThrottlePolicy.FIXED
    throttles: int = 0
    throttle_reason: str | None = None
    throttles_in_a_row: int = 0
    throttled_until: datetime | None = None
    wait_plan: str | None = None
    wait_seconds: float | None = None
    drain_rate: float | None = None
    low_watermark: int | None = None
    stalled: bool = False
    stalled_seconds: float = 0.0
    stall_reason: str | None = None
    idle_consumers: list[IdleConsumer] = []
    redis_waits: int = 0
    last_error: str | None = None
    set_aside: int = 0
    dead_letter_key: str | None = None
    turns: int = 0
    runs: int = 1
    outcome: Outcome | None = None
    settings_changes: int = 0
    stopping: bool = False
    net_rate: float | None = None
    eta_seconds: float | None = None
    eta_at: datetime | None = None
    max_tasks_per_second: float | None = None
    stream_rate_limit: float | None = None
    rate_waits: int = 0
    rate_reason: str | None = None
    release_error: str | None = None

    def details_markdown(self) -> str:
        """The UI's current details as markdown.

        The UI's current details (markdown; ``workflow.set_current_details``): phase, counters, the last backlog
        reading, the pacing and why the replay waits, stall and Redis faults.
        """
        unknown = "?"
        lines = [
            f"**{self.experiment_id}**: {self.phase.value}" + (f" ({self.outcome.value})" if self.outcome else ""),
            "",  # a blank line, so that markdown renders the list below as a list
            f"- replayed: {self.replayed}, remaining: {unknown if self.remaining is None else self.remaining}",
            f"- backlog: {unknown if self.backlog is None else self.backlog} / threshold {self.threshold}"
            + (f" (group `{self.limiting_group}`)" if self.limiting_group else ""),
            f"- pacing: {self.policy.value}"
            + (f", drain ~{self.drain_rate:,.0f}/s" if self.drain_rate is not None else "")
            + (f", low watermark {self.low_watermark}" if self.low_watermark is not None else ""),
            f"- throttle waits: {self.throttles}" + (f", last: {self.throttle_reason}" if self.throttle_reason else ""),
        ]
        if self.wait_plan:
            lines.append(f"- wait: {self.wait_plan}")
        if self.phase is Phase.WAITING_FOR_GROUP:
            lines.append(f"- **waiting for a consumer group**: {self.throttle_reason}")
        lines.append(f"- ETA: {self.eta_text()}")
        if self.rate_waits or self.max_tasks_per_second or self.stream_rate_limit:
            lines.append(
                f"- rate cap: {self.rate_caps_text()}; waits: {self.rate_waits}"
                + (f", last: {self.rate_reason}" if self.rate_reason else "")
            )
        if self.stalled:
            lines.append(f"- **stalled** for {self.stalled_seconds:,.0f} s: {self.stall_reason}")
        if self.redis_waits:
            lines.append(f"- Redis unavailable: {self.redis_waits} waits, last: {self.last_error}")
        if self.set_aside:
            lines.append(
                f"- **set aside**: {self.set_aside} tasks too large to move (`{self.dead_letter_key}`; "
                f"`xmc dead {self.experiment_id}` to retry or drop)"
            )
        if self.stopping:
            lines.append("- **stopping**: paused by the pause Update at the next turn")
        if self.release_error:
            lines.append(f"- **{self.release_error}**")
        lines.append(f"- turns: {self.turns}, run {self.runs}, fencing token {self.token}")
        if (
            self.phase in (Phase.THROTTLED, Phase.STALLED, Phase.RATE_LIMITED, Phase.WAITING_FOR_GROUP)
            and self.throttled_until
        ):
            lines.append(f"- waiting until {self.throttled_until.isoformat(timespec='seconds')}")
        return "\n".join(lines)

    def eta_text(self) -> str:
        """The ETA for people.

        For example ``~1m 05s (at 12:34:56Z), net ~412/s``, ``0s (nothing left to move)``, or ``-`` and why.
        """
        if self.eta_seconds is None or self.eta_at is None:
            why = "no net drain rate measured yet" if self.net_rate is None else f"net ~{self.net_rate:,.0f}/s"
            return f"- ({why})"
        if self.eta_seconds == 0:
            return "0s (nothing left to move)"
        rate = f", net ~{self.net_rate:,.0f}/s" if self.net_rate is not None else ""
        return f"~{duration_text(self.eta_seconds)} (at {self.eta_at.strftime('%H:%M:%SZ')}){rate}"

    def rate_caps_text(self) -> str:
        """The rate caps in force: ``replay 50/s, stream 200/s`` or ``none``."""
        caps = [f"replay {self.max_tasks_per_second:g}/s"] if self.max_tasks_per_second else []
        caps += [f"stream {self.stream_rate_limit:g}/s"] if self.stream_rate_limit else []
        return ", ".join(caps) or "none"


def duration_text(seconds: float) -> str:
    """``seconds`` for people: ``42s``, ``3m 07s``, ``2h 05m``, ``3d 04h``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3_600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86_400:
        return f"{s // 3_600}h {s % 3_600 // 60:02d}m"
    return f"{s // 86_400}d {s % 86_400 // 3_600:02d}h"
