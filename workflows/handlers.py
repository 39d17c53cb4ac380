"""The Updates, the signal handler and the ``progress`` query of ``ResumptionWorkflow``: docs/contract.md, "Updates"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.activities.requests import TURN_SIGNAL
    from xmc_resumption.workflows.calls import TaskClock, clock
    from xmc_resumption.workflows.control import (
        INVALID_CONTROL,
        Control,
        ControlChange,
        EffectiveSettings,
        InvalidControlError,
    )
    from xmc_resumption.workflows.models import Progress, ResumptionInput
    from xmc_resumption.workflows.state import RunState
    from xmc_resumption.workflows.view import RunView


def _change(update: Control, args: Sequence[Any]) -> ControlChange:
    """The change Update ``update`` asks for, from its arguments (``ControlChange.of_update``).

    Raises:
        ApplicationError: non-retryable, type ``InvalidControl``: one line naming the field.
    """
    try:
        return ControlChange.of_update(update, args)
    except InvalidControlError as err:
        raise ApplicationError(str(err), type=INVALID_CONTROL, non_retryable=True) from None


def _refuse(handlers: Any, update: Control, args: Sequence[Any]) -> None:
    """An Update's validator: the run's bad input if any (``ControlHandlers._bad_input``), else ``RunState.refuse``."""
    if handlers._bad_input is not None:
        raise handlers._bad_input
    handlers._state.refuse(_change(update, args))


def _apply(state: RunState, view: RunView, change: ControlChange) -> EffectiveSettings:
    """Apply a validated change (``RunState.apply``), which wakes a durable wait; the settings now."""
    inp = state.apply(change)
    workflow.logger.info(
        "settings changed",
        extra={"experiment_id": inp.experiment_id, **change.model_dump(mode="json", exclude_none=True)},
    )
    with clock().handling():
        view.refresh()
    return EffectiveSettings.of(inp, batch_size=state.batch_size, stopping=state.stopping)


def _change_update(update: Control) -> workflow.UpdateMethodMultiParam[..., EffectiveSettings]:
    """The handler of ``update``, a change of settings, and its validator; it returns the settings now."""

    def change(self: Any, *args: Any) -> EffectiveSettings:  # a ControlHandlers, not yet defined when called
        return _apply(self._state, self._view, _change(update, args))

    def check(self: Any, *args: Any) -> None:
        _refuse(self, update, args)

    handler = workflow.update(name=update)(change)
    handler.validator(check)
    return handler


class ControlHandlers:
    """The workflow's base class: its Updates, signal handler and query, over the run's ``RunState`` and ``RunView``."""

    _bad_input: ApplicationError | None = None
    """The run's invalid input (``InvalidInput``), raised by every Update's validator and by the run."""

    def __init__(self, inp: ResumptionInput) -> None:
        self._state = RunState.of(inp)
        self._view = RunView(self._state)
        self.clock = TaskClock()

    # Each Update takes its arguments as JSON decoded them (any type) and reads them strictly in its validator: a typed
    # parameter would have the data converter coerce ``true`` to 1 before the validator could name the field.

    configure = _change_update(Control.CONFIGURE)
    set_threshold = _change_update(Control.SET_THRESHOLD)
    set_batch_size = _change_update(Control.SET_BATCH_SIZE)
    set_throttle_seconds = _change_update(Control.SET_THROTTLE_SECONDS)
    set_throttle_policy = _change_update(Control.SET_THROTTLE_POLICY)
    set_max_tasks_per_second = _change_update(Control.SET_MAX_TASKS_PER_SECOND)

    @workflow.update(name=Control.PAUSE)
    def pause(self, *args: Any) -> EffectiveSettings:
        """Stop gracefully: the run ends ``paused`` at its next turn (a durable wait ends at once)."""
        self._state.stopping = self._state.wake = self._state.progress.stopping = True
        workflow.logger.info("pause requested", extra={"experiment_id": self._state.input.experiment_id})
        with self.clock.handling():
            self._view.refresh()
        return EffectiveSettings.of(self._state.input, batch_size=self._state.batch_size, stopping=True)

    @pause.validator
    def _check_pause(self, *args: Any) -> None:
        _refuse(self, Control.PAUSE, args)

    @workflow.signal(name=TURN_SIGNAL)
    def turn(self, wait_id: Any) -> None:
        """A worker gives the queued wait ``wait_id`` its turn (docs/pacing.md); another wait's is ignored."""
        if type(wait_id) is int and wait_id == self._state.wait_id:
            self._state.turn = True

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """Any other signal: this workflow takes only its workers' ``TURN_SIGNAL``. Logged, so none is silently lost."""
        workflow.logger.warning(
            "signal %r ignored: this workflow is controlled by Updates (%s)",
            name,
            ", ".join(c.value for c in Control),
            extra={"experiment_id": self._state.input.experiment_id},
        )

    @workflow.query
    def progress(self) -> Progress:
        """Where the replay stands: counters, last backlog reading, pacing, stall, outcome."""
        return self._state.shown()
