"""Pydantic models of the workflow's external contract (DESIGN.md section 5) and its activities.

``ResumptionInput`` is what callers send (Temporal CLI ``--input``, ``start_workflow``, a parent's
``start_child_workflow``); ``ResumptionResult`` is what the run returns; ``Progress`` is what the
``progress`` query returns. All travel through ``temporalio.contrib.pydantic.pydantic_data_converter``.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM
from redisclient.results import MissingGroupPolicy

WORKFLOW_TYPE = "ResumptionWorkflow"
TASK_QUEUE = "xmc-resumption"


# Activity names: the workflow calls its local activities by name, so workflow code imports no
# Redis client into Temporal's sandbox; activities/resumption.py registers them under these names.
ACQUIRE_CLAIM = "acquire_claim"
CHECK_CLAIM = "check_claim"
MEASURE_BACKLOG = "measure_backlog"
PUBLISH_BATCH = "publish_batch"
RELEASE_CLAIM = "release_claim"

NON_RETRYABLE_ERROR_TYPES = ("InvalidArgument", "MissingConsumerGroup", "RedisWrongType", "RedisCommandError")
"""``ApplicationError`` types the activities raise for faults that retrying cannot mend."""


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
    """State carried across continue-as-new; callers never set it.

    Attributes:
        token: the fencing token taken by the first run; 0 while the claim is still to be taken
            (a long Redis outage at the start).
        request_id: the acquire's idempotency key, the same in every run of one resumption.
        owner: the claim's owner (the workflow ID).
        seq: the last publish sequence number used (the publish script's idempotency key).
        replayed: tasks replayed so far (entries).
        throttles: throttle waits so far.
        turns: turns of the loop so far.
        runs: runs before this one (continue-as-new count).
        started_at: when the first run started (workflow time, UTC).
    """

    model_config = ConfigDict(extra="forbid")

    token: int = Field(ge=0)
    request_id: str = Field(min_length=1)
    owner: str
    seq: int = Field(ge=0)
    replayed: int = Field(ge=0)
    throttles: int = Field(ge=0)
    turns: int = Field(ge=0)
    runs: int = Field(ge=0)
    started_at: datetime


class ResumptionInput(BaseModel):
    """Input of ``ResumptionWorkflow``; only ``experiment_id`` is required. Unknown fields are errors.

    Attributes:
        experiment_id: the experiment ``E`` to resume.
        stream: the task stream's key.
        consumer_group: the consumer group whose backlog throttles the replay.
        batch_size: the most tasks one publish moves (entries, 1..10,000).
        max_backlog_threshold: at or above this backlog (entries) the replay waits; at most
            100,000, since counting the lag reads up to this many entries inside a Lua script,
            which blocks Redis while it runs.
        throttle_seconds: how long one throttle wait lasts (seconds, a durable timer).
        claim_lease_seconds: the claim's lease (seconds), extended every turn; it must outlast a
            throttle wait so a healthy replay never lets it lapse.
        missing_group: a missing consumer group counts as backlog 0 with a warning (``zero``), or
            fails the run (``error``).
        turns_per_run: continue-as-new after this many turns (or earlier when Temporal suggests it)
            to keep each run's history small.
        carry: set by the workflow itself when it continues as new.
    """

    model_config = ConfigDict(extra="forbid")

    experiment_id: str = Field(min_length=1, max_length=200)
    stream: str = Field(default=DEFAULT_STREAM, min_length=1)
    consumer_group: str = Field(default=DEFAULT_GROUP, min_length=1)
    batch_size: int = Field(default=100, ge=1, le=10_000)
    max_backlog_threshold: int = Field(default=500, ge=1, le=100_000)
    throttle_seconds: float = Field(default=10.0, gt=0, le=86_400)
    claim_lease_seconds: float = Field(default=120.0, gt=0)
    missing_group: MissingGroupPolicy = MissingGroupPolicy.ZERO
    turns_per_run: int = Field(default=500, ge=1)
    carry: Carry | None = None

    @field_validator("stream")
    @classmethod
    def _no_braces(cls, value: str) -> str:
        if "{" in value or "}" in value:
            raise ValueError("must not contain braces: the stream's name is the hash tag of its companion keys")
        return value

    @model_validator(mode="after")
    def _lease_outlasts_throttle(self) -> ResumptionInput:
        if self.claim_lease_seconds <= self.throttle_seconds:
            raise ValueError(
                f"claim_lease_seconds ({self.claim_lease_seconds:g}) must be longer than "
                f"throttle_seconds ({self.throttle_seconds:g}): the lease is extended once per turn"
            )
        return self

    def ui_summary(self) -> str:
        """One line for the start's ``static_summary`` (Temporal UI, "User Metadata")."""
        return f"Resume experiment {self.experiment_id} into {self.stream} (group {self.consumer_group})"

    def ui_details(self) -> str:
        """Markdown for the start's ``static_details``: the settings this resumption runs with."""
        return (
            f"Replays the held tasks of **{self.experiment_id}** into `{self.stream}`, throttled by the "
            f"backlog of consumer group `{self.consumer_group}`.\n\n"
            f"- threshold: {self.max_backlog_threshold} entries (waits at or above it)\n"
            f"- batch: up to {self.batch_size} tasks per publish\n"
            f"- throttle wait: {self.throttle_seconds:g} s; claim lease: {self.claim_lease_seconds:g} s\n"
            f"- missing consumer group: {self.missing_group.value}; continue-as-new every {self.turns_per_run} turns"
        )

    def start_options(self, task_queue: str = TASK_QUEUE) -> StartOptions:
        """Keyword arguments for ``start_workflow`` / ``start_child_workflow``: the conventional
        workflow ID ``resumption-<E>``, the task queue and the UI's static summary and details."""
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
    """How a resumption ended: see DESIGN.md section 5."""

    COMPLETED = "completed"
    PAUSED = "paused"
    FENCED = "fenced"
    CANCELLED = "cancelled"


class ResumptionResult(BaseModel):
    """What ``ResumptionWorkflow`` returns.

    Attributes:
        experiment_id: the experiment.
        outcome: completed (held stream drained, experiment running), paused (paused during the
            replay), fenced (a newer claim took over).
        replayed: tasks this resumption moved into the task stream (entries, over all runs).
        remaining: held tasks left (entries).
        throttles: throttle waits taken.
        turns: turns of the loop.
        runs: runs of the workflow (1 + continue-as-new count).
        token: the fencing token this resumption held.
    """

    experiment_id: str
    outcome: Outcome
    replayed: int
    remaining: int
    throttles: int
    turns: int
    runs: int
    token: int


class Phase(StrEnum):
    """What the workflow is doing now, for the ``progress`` query and the UI."""

    CLAIMING = "claiming"
    CHECKING = "checking"
    MEASURING = "measuring"
    THROTTLED = "throttled"
    PUBLISHING = "publishing"
    RELEASING = "releasing"
    REDIS_UNAVAILABLE = "redis_unavailable"
    DONE = "done"


class Progress(BaseModel):
    """Answer of the ``progress`` query.

    Attributes:
        experiment_id, token: what is being resumed and under which fencing token (0 before the claim).
        phase: what the workflow is doing now.
        replayed: tasks moved so far (entries); remaining: held tasks left at the last check (entries).
        backlog, pending, lag: the last backlog reading (entries); threshold: the bound (entries).
        throttles: throttle waits so far; throttle_reason: why the last one was taken.
        throttles_in_a_row: throttle waits since tasks last moved; a long run of them means the
            consumers are not draining (stopped workers, or a PEL holding entries nobody acknowledges).
        throttled_until: when the current throttle wait ends (workflow time, UTC) or None.
        redis_waits: waits for an unavailable Redis (faults that outlasted the retries);
            last_error: the last such fault.
        turns, runs: loop turns and runs so far; outcome: set when done.
    """

    experiment_id: str
    token: int = 0
    phase: Phase = Phase.CLAIMING
    replayed: int = 0
    remaining: int | None = None
    backlog: int | None = None
    pending: int | None = None
    lag: int | None = None
    threshold: int
    throttles: int = 0
    throttle_reason: str | None = None
    throttles_in_a_row: int = 0
    throttled_until: datetime | None = None
    redis_waits: int = 0
    last_error: str | None = None
    turns: int = 0
    runs: int = 1
    outcome: Outcome | None = None


class ExperimentRef(BaseModel):
    """Which experiment on which stream and consumer group an activity works on."""

    model_config = ConfigDict(extra="forbid")

    experiment_id: str = Field(min_length=1)
    stream: str = Field(min_length=1)
    consumer_group: str = Field(min_length=1)


class AcquireRequest(BaseModel):
    """Take the claim for ``ref`` as ``owner`` with a lease of ``lease_ms`` milliseconds;
    ``request_id`` is the idempotency key (a repeat returns the same token)."""

    ref: ExperimentRef
    owner: str = Field(min_length=1)
    lease_ms: int = Field(ge=1)
    request_id: str = Field(min_length=1)


class CheckRequest(BaseModel):
    """Check pause state and fencing for ``token``, extending the lease to ``lease_ms`` milliseconds."""

    ref: ExperimentRef
    token: int = Field(ge=1)
    owner: str = Field(min_length=1)
    lease_ms: int = Field(ge=1)


class BacklogRequest(BaseModel):
    """Measure the backlog of ``ref``'s group, capped against ``threshold`` entries."""

    ref: ExperimentRef
    threshold: int = Field(ge=1)
    missing_group: MissingGroupPolicy = MissingGroupPolicy.ZERO


class PublishRequest(BaseModel):
    """Publish one batch under ``token``; ``seq`` is the idempotency key (see ``publish_batch``)."""

    ref: ExperimentRef
    token: int = Field(ge=1)
    seq: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    threshold: int = Field(ge=1)
    owner: str = Field(min_length=1)
    lease_ms: int = Field(ge=1)
    missing_group: MissingGroupPolicy = MissingGroupPolicy.ZERO


class ReleaseRequest(BaseModel):
    """Release the claim of ``token`` (0: whatever claim ``owner`` holds) and revoke the token;
    ``back_to_paused`` moves a resuming experiment back to paused."""

    ref: ExperimentRef
    token: int = Field(ge=0)
    owner: str = Field(min_length=1)
    back_to_paused: bool = False
