"""``RunView``: what a run shows outside itself (UI details, fleet view, metrics), in step with its ``RunState``."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.redisclient.readings import BacklogReading
    from xmc_resumption.workflows.calls import now as clock_now
    from xmc_resumption.workflows.fleet import FleetView
    from xmc_resumption.workflows.metrics import Instruments
    from xmc_resumption.workflows.models import Phase
    from xmc_resumption.workflows.state import RunState
    from xmc_resumption.workflows.text import details_markdown


class RunView:
    """Shows one run of ``state``: its phase and details, its fleet view, its metrics (each run afresh)."""

    def __init__(self, state: RunState) -> None:
        inp = state.input
        self._state = state
        self._fleet = FleetView(inp.stream)
        self.metrics = Instruments.create(inp.stream, inp.consumer_group)

    def phase(self, phase: Phase) -> None:
        """Enter ``phase``: the progress, its ETA, the UI's current details and the fleet view's search attributes."""
        state = self._state
        state.progress.phase = phase
        now = clock_now()
        state.estimate(now)
        shown = state.shown()
        workflow.set_current_details(details_markdown(shown))
        self._fleet.show(shown, now, failed=state.failed, stopping=state.stopping)

    def refresh(self) -> None:
        """Show the state again in the phase it is in (after a change of settings or a pause was accepted)."""
        self.phase(self._state.progress.phase)

    def observe(self, reading: BacklogReading, moved: int = 0) -> None:
        """Record a backlog ``reading`` taken before a move of ``moved`` entries: state, gauge, a stall's warning."""
        p = self._state.progress
        if self._state.observe(reading, clock_now(), moved):
            workflow.logger.warning(
                "replay stalled: the backlog has not gone down for %gs; are the consumers draining the group?",
                p.stalled_seconds,
                extra={"experiment_id": p.experiment_id, "backlog": reading.backlog, "pending": reading.pending},
            )
        self.metrics.backlog.set(reading.backlog + moved)

    def count_outcome(self, outcome: str) -> None:
        """Count the run's end in the outcomes metric, unless the release activity counted it."""
        if not self._state.outcome_counted:
            self.metrics.outcomes.add(1, {"outcome": outcome})
            self._state.outcome_counted = True
