"""What the clients return and raise: status, held and fleet rows, a stopping run, the resume errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, model_validator
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


def cut_off(orphaned: object, run: object) -> dict[str, object]:
    """``orphaned`` and ``cut_off`` of ``xmc status``: orphaned only with no run alive in Temporal.

    An experiment resuming with no live claim is orphaned only when no run of its resumption is alive in Temporal
    (``run``: ``live_run``'s row).

    With one running, the claim lapsed because no worker that runs the replay has reached Redis for the lease: the
    run goes on by itself once one does (its calls go to the task queue, ``workflows/calls.py``), so the status says
    ``cut_off`` (running, its worker cannot reach Redis) instead of asking for a new resumption.
    """
    alive = bool(orphaned) and isinstance(run, dict) and run.get("status") == "running"
    return {"orphaned": False if alive else orphaned, "cut_off": alive}


class ExperimentStatus(BaseModel):
    """One experiment in Redis (and its resumption in Temporal): ``XmcClient.status``.

    Attributes:
        exists: False when no key of the experiment exists on this stream (``state`` is then
            ``unknown``: never paused nor resumed here).
        state: ``running``, ``paused``, ``resuming`` or ``unknown``.
        orphaned: resuming with no live claim and no run alive in Temporal: the replayer is gone; resuming again goes
            on. cut_off: resuming with no live claim while its run is alive in Temporal: its worker cannot reach
            Redis; the run goes on once a worker does (``cut_off``, applied when the status is built).
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
    cut_off: bool = False
    held: int | None
    claim: dict[str, str] | None
    fence: int | None
    set_aside: int | None
    backlog: BacklogSummary | None
    idle_consumers: list[IdleConsumer] | None = []
    redis_memory: RedisMemory | None
    run: dict[str, Any] | None = None
    unknown: dict[str, str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _cut_off(cls, data: Any) -> Any:
        if isinstance(data, dict) and "cut_off" not in data:
            return data | cut_off(data.get("orphaned"), data.get("run"))
        return data


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
