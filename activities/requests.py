"""The request envelopes of the resumption's activities (workflow -> activity).

Internal to the project: the workflow builds them, the activities in ``activities/resumption.py``
take them. They travel through Temporal's pydantic data converter and are recorded in the local
activities' markers, so a field added here needs a default (recorded histories must still decode).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from xmc_resumption.redisclient.backlog import DEFAULT_BYTE_BUDGET, MAX_BYTE_BUDGET, MAX_GROUPS
from xmc_resumption.redisclient.consumers import MAX_IDLE_LISTED, MAX_IDLE_MS
from xmc_resumption.redisclient.publish import MAX_ROUNDS, MAX_ROUNDS_SECONDS
from xmc_resumption.redisclient.results import MissingGroupPolicy
from xmc_resumption.redisclient.watch import MAX_POLL_SECONDS


class ExperimentRef(BaseModel):
    """Which experiment, stream and consumer groups an activity works on.

    Which experiment on which stream and consumer groups an activity works on: the consumer group that must exist, and
    the groups whose backlog bounds the replay (None: every group of the stream; see
    ``redisclient.backlog.measure_backlog``).
    """

    model_config = ConfigDict(extra="forbid")

    experiment_id: str = Field(min_length=1)
    stream: str = Field(min_length=1)
    consumer_group: str = Field(min_length=1)
    consumer_groups: list[str] | None = Field(default=None, min_length=1, max_length=MAX_GROUPS)


class AcquireRequest(BaseModel):
    """Take the claim for ``ref`` as ``owner``.

    With a lease of ``lease_ms`` milliseconds; ``request_id`` is the idempotency key (a repeat returns the same token).
    """

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
    """Measure the backlog of ``ref``'s group.

    The reading is capped against ``threshold`` entries and ``max_bytes`` bytes read.
    """

    ref: ExperimentRef
    threshold: int = Field(ge=1)
    missing_group: MissingGroupPolicy = MissingGroupPolicy.WAIT
    max_bytes: int = Field(default=DEFAULT_BYTE_BUDGET, ge=1, le=MAX_BYTE_BUDGET)


class DrainWaitRequest(BaseModel):
    """Poll the backlog of ``ref``'s group until it is at or below ``low_watermark`` entries.

    The poll lasts at least ``min_seconds`` and at most ``max_seconds``, measuring every
    ``poll_seconds`` (all seconds, finite); ``take``: the entries the caller means to publish once woken (None: as
    many as the headroom; see ``redisclient.watch.BacklogWatches.wait_for_drain``).
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


class PublishRequest(BaseModel):
    """Publish one batch under ``token``.

    ``seq`` is the idempotency key, ``max_bytes`` the byte budget of its reads, ``max_memory_fraction`` the share of
    ``maxmemory`` at which nothing moves (None: off; see ``redisclient.publish.publish_batch``).
    """

    ref: ExperimentRef
    token: int = Field(ge=1)
    seq: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    threshold: int = Field(ge=1)
    owner: str = Field(min_length=1)
    lease_ms: int = Field(ge=1)
    missing_group: MissingGroupPolicy = MissingGroupPolicy.WAIT
    max_bytes: int = Field(default=DEFAULT_BYTE_BUDGET, ge=1, le=MAX_BYTE_BUDGET)
    max_memory_fraction: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    fair_share: bool = False


class PublishRoundsRequest(PublishRequest):
    """Publish in rounds under ``token`` from ``seq`` on (``redisclient.publish.publish_rounds``).

    Each script moves at most ``batch_size``; all together at most ``max_tasks`` (None: no bound
    but the headroom), in at most ``max_scripts`` scripts, none started once ``max_seconds`` have
    passed (seconds, finite: also how long the call may run past one script, for the workflow's
    task budget).
    """

    max_tasks: int | None = Field(default=None, ge=1)
    max_scripts: int = Field(default=1, ge=1, le=MAX_ROUNDS)
    max_seconds: float = Field(default=0.0, ge=0, le=MAX_ROUNDS_SECONDS, allow_inf_nan=False)


class IdleConsumersRequest(BaseModel):
    """Name the idle consumers of ``ref``'s groups that hold pending entries.

    Name the consumers of ``ref``'s groups ``groups`` that hold pending entries and have been idle for at least
    ``min_idle_ms`` milliseconds, at most ``limit`` of them (see ``redisclient.consumers.idle_consumers``).
    """

    ref: ExperimentRef
    groups: list[str] = Field(min_length=1, max_length=MAX_GROUPS)
    min_idle_ms: int = Field(ge=0, le=MAX_IDLE_MS)
    limit: int = Field(default=5, ge=1, le=MAX_IDLE_LISTED)


class ReleaseRequest(BaseModel):
    """Release the claim of ``token`` and revoke the token.

    Release the claim of ``token`` (0: whatever claim ``owner`` holds) and revoke the token; ``back_to_paused`` moves a
    resuming experiment back to paused; ``outcome`` is what the run ends with, recorded with the release ('' in requests
    recorded before it existed).
    """

    ref: ExperimentRef
    token: int = Field(ge=0)
    owner: str = Field(min_length=1)
    back_to_paused: bool = False
    outcome: str = Field(default="", max_length=32, pattern=r"^[a-z_]*$")


class SetAsideRequest(BaseModel):
    """Set a held entry aside into the dead-letter stream.

    Set held entry ``entry_id`` aside into the dead-letter stream under ``token`` (see
    ``redisclient.deadletter.set_aside``).
    """

    ref: ExperimentRef
    token: int = Field(ge=1)
    entry_id: str = Field(min_length=3, max_length=41, pattern=r"^\d+-\d+$")
