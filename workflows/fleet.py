"""The fleet view: search attributes that show every replay in visibility (docs/contract.md, "Search attributes")."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributeUpdate

from xmc_resumption.workflows.models import Outcome, Phase, Progress

EXPERIMENT_ID = SearchAttributeKey.for_keyword("XmcExperimentId")
STREAM = SearchAttributeKey.for_keyword("XmcStream")
PHASE = SearchAttributeKey.for_keyword("XmcPhase")
OUTCOME = SearchAttributeKey.for_keyword("XmcOutcome")
REPLAYED = SearchAttributeKey.for_int("XmcReplayed")
REMAINING = SearchAttributeKey.for_int("XmcRemaining")
REDELIVERED = SearchAttributeKey.for_int("XmcRedelivered")
LAST_MOVED_ID = SearchAttributeKey.for_keyword("XmcLastMovedId")

ALL: tuple[SearchAttributeKey[Any], ...] = (
    EXPERIMENT_ID, STREAM, PHASE, OUTCOME, REPLAYED, REMAINING, REDELIVERED, LAST_MOVED_ID
)  # fmt: skip


class FleetPhase(StrEnum):
    """``XmcPhase`` while a resumption runs: a coarser ``Phase``, that changes only when an operator would care."""

    CLAIMING = "claiming"
    REPLAYING = "replaying"
    THROTTLED = "throttled"
    STALLED = "stalled"
    REDIS_UNAVAILABLE = "redis_unavailable"
    WAITING_FOR_GROUP = "waiting_for_group"
    STOPPING = "stopping"


FAILED = "failed"
"""``XmcPhase`` and ``XmcOutcome`` of a run that failed: handed back as paused, with no ``Outcome``."""


def phase_values() -> list[str]:
    """Every value ``XmcPhase`` takes, each once: ``FleetPhase``, then ``Outcome``, then ``FAILED`` (``xmc list``)."""
    values = [p.value for p in FleetPhase] + [o.value for o in Outcome] + [FAILED]
    return list(dict.fromkeys(values))


FLEET_REFRESH = timedelta(seconds=30)
"""How often the counts are upserted at most while the fleet phase stays the same (workflow time)."""


def fleet_phase(progress: Progress, *, failed: bool, stopping: bool) -> str:
    """``XmcPhase`` of a run at ``progress``: its outcome once ended (or ``FAILED``), else a ``FleetPhase``."""
    if progress.outcome is not None:
        return progress.outcome.value
    if failed:
        return FAILED
    if stopping:
        return FleetPhase.STOPPING
    if progress.phase in (Phase.CLAIMING, Phase.STALLED, Phase.REDIS_UNAVAILABLE, Phase.WAITING_FOR_GROUP):
        return FleetPhase(progress.phase.value)  # the same value in both
    if progress.phase is Phase.THROTTLED and progress.throttled_until is not None:
        return FleetPhase.THROTTLED
    return FleetPhase.REPLAYING


class FleetView:
    """A run's upserts of the fleet view's search attributes (workflow code only; each run starts afresh)."""

    def __init__(self, stream: str) -> None:
        self._stream = stream
        self._shown: tuple[str, datetime] | None = None
        """The fleet phase last upserted and when (workflow time); None before the first upsert."""
        self._counts: tuple[int, int | None] = (0, None)
        """The (replayed, remaining) last upserted."""
        self._redelivered = 0

    def show(self, progress: Progress, now: datetime, *, failed: bool, stopping: bool) -> None:
        """Upsert the search attributes when due at workflow time ``now``: docs/contract.md, "Search attributes"."""
        p = progress
        phase, counts = fleet_phase(p, failed=failed, stopping=stopping), (p.replayed, p.remaining)
        shown = self._shown
        if (
            shown is not None
            and shown[0] == phase
            and p.redelivered == self._redelivered
            and (counts == self._counts or now - shown[1] < FLEET_REFRESH)
        ):
            return
        updates: list[SearchAttributeUpdate[Any]] = [PHASE.value_set(phase), REPLAYED.value_set(p.replayed)]
        if p.remaining is not None:
            updates.append(REMAINING.value_set(p.remaining))
        if p.redelivered:
            updates.append(REDELIVERED.value_set(p.redelivered))
        if shown is None:
            updates += [EXPERIMENT_ID.value_set(p.experiment_id), STREAM.value_set(self._stream)]
        if p.outcome is not None or failed:
            updates.append(OUTCOME.value_set(p.outcome.value if p.outcome else FAILED))
            if p.last_moved_id:
                updates.append(LAST_MOVED_ID.value_set(p.last_moved_id))
        workflow.upsert_search_attributes(updates)
        self._shown, self._counts, self._redelivered = (phase, now), counts, p.redelivered
