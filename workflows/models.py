"""Pydantic models of the workflow's external contract: input, result, progress (docs/contract.md, "The workflow")."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from xmc_resumption.redisclient.backlog import DEFAULT_BYTE_BUDGET, MAX_GROUPS
from xmc_resumption.redisclient.failover import validate_entry_id
from xmc_resumption.redisclient.fencing import MAX_LEASE_MS
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, MAX_NAME_LENGTH, validate_name
from xmc_resumption.redisclient.memory import DEFAULT_MEMORY_FRACTION
from xmc_resumption.redisclient.ratecap import MAX_TASKS_PER_SECOND, MIN_TASKS_PER_SECOND
from xmc_resumption.redisclient.readings import IdleConsumer, MissingGroupPolicy, UnattendedGroup
from xmc_resumption.workflows import text
from xmc_resumption.workflows.eta import NetRate
from xmc_resumption.workflows.ratecap import TaskBucket
from xmc_resumption.workflows.throttle import MAX_RATE, Pacing

WORKFLOW_TYPE = "ResumptionWorkflow"
TASK_QUEUE = "xmc-resumption"


MAX_WAIT_SECONDS = 86_400.0
"""The longest single wait (seconds): one day; a longer durable timer is never what an operator means."""

MAX_RUN_SECONDS = 7 * 86_400.0
"""The longest ``max_run_seconds`` (seconds): a week."""

MAX_LEASE_SECONDS = MAX_LEASE_MS / 1000
"""The longest claim lease (seconds): a week (``redisclient.fencing.MAX_LEASE_MS``)."""


class ThrottlePolicy(StrEnum):
    """How long the replay waits once the backlog reaches the threshold: docs/pacing.md, "The two policies"."""

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
    """State carried across continue-as-new (``RunState.carry``): each field as its ``Progress``/``RunState`` one."""

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
    redelivered: int = Field(default=0, ge=0)
    last_moved_id: str = ""

    @field_validator("last_moved_id")
    @classmethod
    def _entry_id(cls, value: str) -> str:
        return validate_entry_id("last_moved_id", value)


MAX_BATCH_SIZE = 10_000
"""The largest ``batch_size`` accepted (entries)."""

AUTO_BATCH_SIZE = 500
"""The largest automatic batch (entries; docs/contract.md, "Input", ``batch_size``)."""

AUTO_SCRIPT_BYTES = 128 * 1024
"""What one script of an automatic batch moves, about (bytes, as ``moved_bytes`` counts them)."""

START_BATCH_SIZE = 100
"""The automatic batch before a publish of the run has measured its tasks' size (entries)."""


class ResumptionInput(BaseModel):
    """Input of ``ResumptionWorkflow``: each field's default, bounds and meaning: docs/contract.md, "Input"."""

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
    moved_through: str = Field(default="", max_length=41)

    @field_validator("moved_through")
    @classmethod
    def _moved_through(cls, value: str) -> str:
        return validate_entry_id("moved_through", value)

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
        # not the Redis-outage wait: a lease lapsed during an outage is taken again (docs/contract.md, "Input")
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
        """The longest single throttle wait (seconds): ``max_wait_seconds`` if adaptive, else ``throttle_seconds``."""
        if self.throttle_policy is ThrottlePolicy.ADAPTIVE and self.max_wait_seconds is not None:
            return self.max_wait_seconds
        return self.throttle_seconds

    @property
    def pacing(self) -> Pacing:
        """The throttle policy's settings in this input (``workflows/throttle.py``)."""
        return Pacing(
            adaptive=self.throttle_policy is ThrottlePolicy.ADAPTIVE,
            threshold=self.max_backlog_threshold,
            throttle_seconds=self.throttle_seconds,
            min_wait=self.min_wait_seconds,
            max_wait=self.longest_wait_seconds,
        )

    def start_options(self, task_queue: str = TASK_QUEUE) -> StartOptions:
        """Keyword arguments for ``start_workflow`` / ``start_child_workflow``: ID, task queue, the UI's summary."""
        return {
            "id": workflow_id_for(self.experiment_id),
            "task_queue": task_queue,
            "static_summary": text.ui_summary(self),
            "static_details": text.ui_details(self),
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
    """What ``ResumptionWorkflow`` returns (a cancelled run returns none): docs/contract.md, "Result and outcomes"."""

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
    redelivered: int = 0
    last_moved_id: str = ""


class Phase(StrEnum):
    """What the workflow is doing now, for the ``progress`` query and the UI."""

    CLAIMING = "claiming"
    CHECKING = "checking"
    THROTTLED = "throttled"
    STALLED = "stalled"
    PUBLISHING = "publishing"
    RELEASING = "releasing"
    REDIS_UNAVAILABLE = "redis_unavailable"
    WAITING_FOR_GROUP = "waiting_for_group"
    RATE_LIMITED = "rate_limited"
    DONE = "done"


class Progress(BaseModel):
    """Answer of the ``progress`` query, and what the UI's current details render: docs/contract.md, "Progress"."""

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
    unattended_groups: list[UnattendedGroup] = []
    limiting_idle_ms: int | None = None
    redelivered: int = 0
    last_moved_id: str = ""
    held_again: int = 0
    redis_handoffs: int = 0


class ReconcileInput(BaseModel):
    """Input of ``ReconcileWorkflow`` and of ``xmc reconcile``: docs/operating.md, "Reconciliation"."""

    model_config = ConfigDict(extra="forbid")

    stream: str = Field(default=DEFAULT_STREAM, min_length=1, max_length=MAX_NAME_LENGTH)
    task_queue: str = Field(default=TASK_QUEUE, min_length=1, max_length=1_000)
    limit: int = Field(default=1_000, ge=1, le=10_000, strict=True)
    resume: bool = Field(default=True, strict=True)

    @field_validator("stream")
    @classmethod
    def _stream(cls, value: str) -> str:
        return validate_name("stream", value)


class Reconciled(BaseModel):
    """An undone completion, and the resumption started for it: docs/operating.md, "Reconciliation"."""

    experiment_id: str
    workflow_id: str
    run_id: str | None = None
    moved_through: str
    held_again: int
    held_again_capped: bool = False
    held: int
    state: str
    started: str | None = None
    error: str | None = None
