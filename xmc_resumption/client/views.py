"""What the clients return and raise: status, held and fleet rows, a stopping run, the resume errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from temporalio.client import WorkflowHandle

from xmc_resumption.errors import OperatorError
from xmc_resumption.redisclient.readings import GroupBacklog, IdleConsumer, RedisMemory
from xmc_resumption.workflows.control import EffectiveSettings
from xmc_resumption.workflows.models import ResumptionResult
from xmc_resumption.workflows.resumption import ResumptionWorkflow

ResumptionHandle = WorkflowHandle[ResumptionWorkflow, ResumptionResult]
"""A started resumption's handle: ``await handle.result()`` waits for its ``ResumptionResult``."""


class BacklogSummary(BaseModel):
    """The consumer groups' backlog as ``status`` counts it (entries, up to ``threshold``).

    The largest, of ``limiting_group``; ``group`` is the one that must exist; ``missing_group`` the
    first required group not found (None when none); ``groups`` each group's part (docs/memory.md).
    """

    group: str
    limiting_group: str = ""
    pending: int
    lag: int
    capped: bool
    status: str
    missing_group: str | None = None
    threshold: int
    groups: list[GroupBacklog] = []


class ExperimentStatus(BaseModel):
    """One experiment in Redis (and its resumption in Temporal): ``XmcClient.status``.

    Attributes:
        exists: False when no key of the experiment exists on this stream (``state`` is then
            ``unknown``: never paused nor resumed here).
        state: ``running``, ``paused``, ``resuming`` or ``unknown``.
        orphaned: resuming with no live claim: the replayer is gone; resuming again goes on.
        held: held tasks (entries); set_aside: tasks in the dead-letter stream.
        claim: ``token``, ``owner``, ``lease_ms`` left; {} when none. fence: the last fencing token.
        backlog: the consumer groups' backlog (``BacklogSummary``); idle_consumers: the consumers
            of those groups holding pending entries while idle for ``idle_seconds``, the most
            pending first (``redisclient.consumers``).
        redis_memory: Redis's eviction policy and memory; ``problem`` says why a resumption refuses it.
        run: the resumption ``resumption-<E>`` in Temporal (``runs.live_run``: IDs, status, search
            attributes, ``progress`` while it runs), ``{"error": <one line>}`` when Temporal could not
            be asked, None when there never was one or it was not asked.
        unknown: the parts that could not be read (a key of the wrong type, a command the ACL user
            may not run) -> why; each such part is None above (``status.experiment_status``).
    """

    experiment_id: str
    stream: str
    exists: bool | None
    state: str
    orphaned: bool | None
    held: int | None
    claim: dict[str, str] | None
    fence: int | None
    set_aside: int | None
    backlog: BacklogSummary | None
    idle_consumers: list[IdleConsumer] | None = []
    redis_memory: RedisMemory | None
    run: dict[str, Any] | None = None
    unknown: dict[str, str] | None = None


class HeldRow(BaseModel):
    """One experiment Redis holds something for (``XmcClient.held``; see ``status.held_experiments``)."""

    experiment_id: str
    state: str | None
    held: int | None
    claim: dict[str, str]
    condition: str
    error: str | None = None


class FleetRow(BaseModel):
    """One resumption as Temporal visibility lists it (``XmcClient.list_resumptions``).

    ``redelivered``: tasks it moved again after Redis lost their move (None: none); ``last_moved_id``: the held entry
    ID of the last task Redis said it moved, set once it ended (``workflows/fleet.py``).
    """

    workflow_id: str
    run_id: str | None
    status: str | None
    experiment_id: str | None
    stream: str | None
    phase: str | None
    replayed: int | None
    remaining: int | None
    outcome: str | None
    redelivered: int | None = None
    last_moved_id: str | None = None
    start_time: str | None
    close_time: str | None


@dataclass(frozen=True)
class Stopping:
    """A resumption asked to stop (``XmcClient.stop``): its handle and the settings it runs with until then.

    ``await handle.result()`` waits for its end, outcome ``paused``.
    """

    handle: ResumptionHandle
    settings: EffectiveSettings


class NothingToResumeError(OperatorError):
    """An experiment is running and holds no tasks: a resumption would have nothing to replay.

    ``resume(..., force=True)`` starts it anyway.
    """


class ResumeError(OperatorError):
    """Some resumptions of a ``resume_many`` did not start; the others did.

    One already ran, or Temporal failed midway.

    Attributes:
        started: the handles of the runs that started, in the order given.
        failures: experiment ID -> the error its start raised.
    """

    def __init__(self, started: list[ResumptionHandle], failures: dict[str, BaseException], message: str) -> None:
        super().__init__(message)
        self.started = started
        self.failures = failures
