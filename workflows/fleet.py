"""The fleet view: search attributes that show every replay in Temporal visibility.

``temporal workflow list --query 'XmcPhase="throttled"'`` (and ``xmc list``, and the web UI's list) show every replay
without asking a live worker.

Custom search attributes must be registered on the namespace before a workflow may set them (Temporal docs, "Custom
Search Attributes"): ``xmc_resumption.search_attributes`` registers and checks them. ``FleetView`` keeps a run's
attributes up to date.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributeUpdate

from xmc_resumption.workflows.models import Outcome, Phase, Progress

EXPERIMENT_ID = SearchAttributeKey.for_keyword("XmcExperimentId")
"""The experiment being resumed (Keyword)."""
STREAM = SearchAttributeKey.for_keyword("XmcStream")
"""The task stream it replays into (Keyword)."""
PHASE = SearchAttributeKey.for_keyword("XmcPhase")
"""``FleetPhase`` while running; the outcome once ended (Keyword)."""
OUTCOME = SearchAttributeKey.for_keyword("XmcOutcome")
"""The ``Outcome`` once ended; absent while running (Keyword)."""
REPLAYED = SearchAttributeKey.for_int("XmcReplayed")
"""Tasks replayed so far (Int, entries)."""
REMAINING = SearchAttributeKey.for_int("XmcRemaining")
"""Held tasks left at the last reading (Int, entries)."""

ALL: tuple[SearchAttributeKey[Any], ...] = (EXPERIMENT_ID, STREAM, PHASE, OUTCOME, REPLAYED, REMAINING)


class FleetPhase(StrEnum):
    """``XmcPhase`` while a resumption runs: a coarser ``Phase``.

    Coarser than ``Phase`` (checking and publishing, a short poll and a rate wait are all ``replaying``), so that it
    changes only when an operator would care. Once the run ends, ``XmcPhase`` holds the
    outcome (``completed``, ``paused``, ``fenced``, ...).
    """

    CLAIMING = "claiming"
    REPLAYING = "replaying"
    THROTTLED = "throttled"
    STALLED = "stalled"
    REDIS_UNAVAILABLE = "redis_unavailable"
    WAITING_FOR_GROUP = "waiting_for_group"
    """The stream or a required consumer group does not exist yet (``missing_group: wait``)."""
    STOPPING = "stopping"


FAILED = "failed"
"""``XmcPhase`` and ``XmcOutcome`` of a run that failed (a fault retrying cannot mend, or a fault of
the workflow code): the experiment was handed back as paused; the run has no ``Outcome``."""


def phase_values() -> list[str]:
    """Every value ``XmcPhase`` takes, each once, in order.

    Every value ``XmcPhase`` takes (``fleet_phase`` sets it): a ``FleetPhase`` while running, an ``Outcome`` once ended,
    ``FAILED`` for a failed run; each once, in that order. ``xmc list --phase`` takes its choices from here.
    """
    values = [p.value for p in FleetPhase] + [o.value for o in Outcome] + [FAILED]
    return list(dict.fromkeys(values))


FLEET_REFRESH = timedelta(seconds=30)
"""While the fleet phase stays the same, ``XmcReplayed`` and ``XmcRemaining`` are refreshed at most
this often (workflow time): each upsert is one history event."""


def fleet_phase(progress: Progress, *, failed: bool, stopping: bool) -> str:
    """``XmcPhase`` of a run at ``progress``.

    The outcome once ended (``FAILED`` when ``failed``), else the coarse ``FleetPhase`` of the phase. A short poll
    (adaptive, a second or two) counts as replaying: only a durable wait is ``throttled``.
    """
    if progress.outcome is not None:
        return progress.outcome.value
    if failed:
        return FAILED
    if stopping:
        return FleetPhase.STOPPING
    match progress.phase:
        case Phase.CLAIMING:
            return FleetPhase.CLAIMING
        case Phase.STALLED:
            return FleetPhase.STALLED
        case Phase.THROTTLED if progress.throttled_until is not None:
            return FleetPhase.THROTTLED
        case Phase.REDIS_UNAVAILABLE:
            return FleetPhase.REDIS_UNAVAILABLE
        case Phase.WAITING_FOR_GROUP:
            return FleetPhase.WAITING_FOR_GROUP
    return FleetPhase.REPLAYING


class FleetView:
    """A run's upserts of the fleet view's search attributes (workflow code only).

    Not carried across continue-as-new: each run upserts its first view afresh.
    """

    def __init__(self, stream: str) -> None:
        self._stream = stream
        self._shown: tuple[str, datetime] | None = None
        """The fleet phase last upserted and when (workflow time); None before the first upsert."""
        self._counts: tuple[int, int | None] = (0, None)
        """The (replayed, remaining) last upserted."""

    def show(self, progress: Progress, *, failed: bool, stopping: bool) -> None:
        """Upsert the fleet view's search attributes when they are due.

        When the fleet phase changes, or the counts changed and ``FLEET_REFRESH`` has passed: each upsert is a history
        event, so not every turn.
        """
        p, now = progress, workflow.now()
        phase, counts = fleet_phase(p, failed=failed, stopping=stopping), (p.replayed, p.remaining)
        shown = self._shown
        if shown is not None and shown[0] == phase and (counts == self._counts or now - shown[1] < FLEET_REFRESH):
            return
        updates: list[SearchAttributeUpdate[Any]] = [PHASE.value_set(phase), REPLAYED.value_set(p.replayed)]
        if p.remaining is not None:
            updates.append(REMAINING.value_set(p.remaining))
        if shown is None:
            updates += [EXPERIMENT_ID.value_set(p.experiment_id), STREAM.value_set(self._stream)]
        if p.outcome is not None or failed:
            updates.append(OUTCOME.value_set(p.outcome.value if p.outcome else FAILED))
        workflow.upsert_search_attributes(updates)
        self._shown, self._counts = (phase, now), counts
