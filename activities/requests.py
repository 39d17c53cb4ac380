"""The request envelopes of the resumption's activities (workflow -> activity).

Internal to the project: the workflow builds them, the activities in ``activities/resumption.py``
take them. They travel through Temporal's pydantic data converter; a regular activity's request is recorded in its
scheduled event, so a field added here needs a default (the histories of released versions must still decode).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from xmc_resumption.redisclient.backlog import DEFAULT_BYTE_BUDGET, MAX_BYTE_BUDGET, MAX_GROUPS
from xmc_resumption.redisclient.consumers import MAX_IDLE_LISTED, MAX_IDLE_MS
from xmc_resumption.redisclient.publish import PublishParams
from xmc_resumption.redisclient.readings import MissingGroupPolicy
from xmc_resumption.redisclient.watch import MAX_POLL_SECONDS, MAX_QUEUE_SECONDS

TURN_SIGNAL = "xmc-turn"
"""The signal by which a worker gives a queued replay its turn; its one argument is the wait's ``wait_id``."""


class ExperimentRef(BaseModel):
    """Which experiment, stream and consumer groups an activity works on.

    ``consumer_group`` must exist; ``consumer_groups`` bound the replay by their backlog (None: ``consumer_group`` and
    every group of the stream that has a consumer; see ``redisclient.backlog.measure_backlog``).
    """

    model_config = ConfigDict(extra="forbid")

    experiment_id: str = Field(min_length=1)
    stream: str = Field(min_length=1)
    consumer_group: str = Field(min_length=1)
    consumer_groups: list[str] | None = Field(default=None, min_length=1, max_length=MAX_GROUPS)


class AcquireRequest(BaseModel):
    """Take the claim for ``ref`` as ``owner``.

    With a lease of ``lease_ms`` milliseconds; ``request_id`` is the idempotency key (a repeat returns the same token);
    ``moved_through``: the last held entry ID the run was told a resumption moved ('' for none), so the claim counts
    the tasks held again (``fencing.acquire_claim``).
    """

    ref: ExperimentRef
    owner: str = Field(min_length=1)
    lease_ms: int = Field(ge=1)
    request_id: str = Field(min_length=1)
    moved_through: str = Field(default="", max_length=41)


class CheckRequest(BaseModel):
    """Check pause state and fencing for ``token``, extending the lease to ``lease_ms`` milliseconds."""

    ref: ExperimentRef
    token: int = Field(ge=1)
    owner: str = Field(min_length=1)
    lease_ms: int = Field(ge=1)


class DrainWaitRequest(BaseModel):
    """Poll the backlog of ``ref``'s group until it is at or below ``low_watermark`` entries.

    The poll lasts at least ``min_seconds`` and at most ``max_seconds``, measuring every
    ``poll_seconds`` (all seconds, finite); ``take``: the entries the caller means to publish once woken (None: as
    many as the headroom; see ``redisclient.watch.BacklogWatches.wait_for_drain``). ``queue_seconds``: how long the
    poll may stay queued past its bound; its turn comes as signal ``TURN_SIGNAL`` with ``wait_id`` (docs/pacing.md).
    """

    ref: ExperimentRef
    threshold: int = Field(ge=1)
    low_watermark: int = Field(ge=0)
    min_seconds: float = Field(ge=0, le=MAX_POLL_SECONDS, allow_inf_nan=False)
    max_seconds: float = Field(gt=0, le=MAX_POLL_SECONDS, allow_inf_nan=False)
    poll_seconds: float = Field(gt=0, le=1, allow_inf_nan=False)
    missing_group: MissingGroupPolicy = MissingGroupPolicy.WAIT
    max_bytes: int = Field(default=DEFAULT_BYTE_BUDGET, ge=1, le=MAX_BYTE_BUDGET)
    take: int | None = Field(default=None, ge=0)
    queue_seconds: float = Field(default=0.0, ge=0, le=MAX_QUEUE_SECONDS, allow_inf_nan=False)
    wait_id: int = Field(default=0, ge=0)


class PublishRequest(BaseModel):
    """Publish held tasks of ``ref``'s experiment in rounds, as ``params`` say (``publish.publish_rounds``)."""

    ref: ExperimentRef
    params: PublishParams


class IdleConsumersRequest(BaseModel):
    """Name the idle consumers of ``ref``'s groups ``groups`` that hold pending entries.

    Idle for at least ``min_idle_ms`` milliseconds, at most ``limit`` of them (``consumers.idle_consumers``).
    """

    ref: ExperimentRef
    groups: list[str] = Field(min_length=1, max_length=MAX_GROUPS)
    min_idle_ms: int = Field(ge=0, le=MAX_IDLE_MS)
    limit: int = Field(default=5, ge=1, le=MAX_IDLE_LISTED)


class ReleaseRequest(BaseModel):
    """Release the claim of ``token`` and revoke the token.

    Token 0: whatever claim ``owner`` holds. ``back_to_paused`` moves a resuming experiment back to paused; ``outcome``
    is what the run ends with, recorded with the release ('': none).
    """

    ref: ExperimentRef
    token: int = Field(ge=0)
    owner: str = Field(min_length=1)
    back_to_paused: bool = False
    outcome: str = Field(default="", max_length=32, pattern=r"^[a-z_]*$")


class SetAsideRequest(BaseModel):
    """Set held entry ``entry_id`` aside into the dead-letter stream under ``token`` (``deadletter.set_aside``)."""

    ref: ExperimentRef
    token: int = Field(ge=1)
    entry_id: str = Field(min_length=3, max_length=41, pattern=r"^\d+-\d+$")
