"""The Updates, the signal handler and the ``progress`` query of ``ResumptionWorkflow`` (docs/contract.md, "Updates").

``ControlHandlers`` is the workflow's base class (the SDK finds handlers on base classes too); it calls nothing back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
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


class ControlHandlers:
    """The workflow's Updates, signal handler and query, over the run's ``RunState`` and ``RunView``.

    Args:
        inp: the run's input; the state starts from it (``RunState.of``).
    """

    def __init__(self, inp: ResumptionInput) -> None:
        self._state = RunState.of(inp)
        """All of the run's state; ``Carry`` of it is what continue-as-new hands the next run."""
        self._view = RunView(self._state)
        """What the run shows: phase and details, the fleet view, the metrics."""

    # Each Update takes its arguments as JSON decoded them (any type) and reads them strictly in its validator: a typed
    # parameter would have the data converter coerce ``true`` to 1 before the validator could name the field.

    @workflow.update(name=Control.CONFIGURE)
    def configure(self, *args: Any) -> EffectiveSettings:
        """Change settings of the running replay (a ``ControlChange``, a JSON object); returns the settings now."""
        return self._apply(self._change(Control.CONFIGURE, args))

    @configure.validator
    def _check_configure(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.CONFIGURE, args))

    @workflow.update(name=Control.SET_THRESHOLD)
    def set_threshold(self, *args: Any) -> EffectiveSettings:
        """``configure`` with ``max_backlog_threshold`` only (an integer, entries)."""
        return self._apply(self._change(Control.SET_THRESHOLD, args))

    @set_threshold.validator
    def _check_threshold(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.SET_THRESHOLD, args))

    @workflow.update(name=Control.SET_BATCH_SIZE)
    def set_batch_size(self, *args: Any) -> EffectiveSettings:
        """``configure`` with ``batch_size`` only (an integer, entries)."""
        return self._apply(self._change(Control.SET_BATCH_SIZE, args))

    @set_batch_size.validator
    def _check_batch_size(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.SET_BATCH_SIZE, args))

    @workflow.update(name=Control.SET_THROTTLE_SECONDS)
    def set_throttle_seconds(self, *args: Any) -> EffectiveSettings:
        """``configure`` with ``throttle_seconds`` only (a number, seconds)."""
        return self._apply(self._change(Control.SET_THROTTLE_SECONDS, args))

    @set_throttle_seconds.validator
    def _check_throttle_seconds(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.SET_THROTTLE_SECONDS, args))

    @workflow.update(name=Control.SET_THROTTLE_POLICY)
    def set_throttle_policy(self, *args: Any) -> EffectiveSettings:
        """``configure`` with ``throttle_policy`` only (``fixed`` or ``adaptive``)."""
        return self._apply(self._change(Control.SET_THROTTLE_POLICY, args))

    @set_throttle_policy.validator
    def _check_throttle_policy(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.SET_THROTTLE_POLICY, args))

    @workflow.update(name=Control.SET_MAX_TASKS_PER_SECOND)
    def set_max_tasks_per_second(self, *args: Any) -> EffectiveSettings:
        """``configure`` with ``max_tasks_per_second`` only (a number, tasks per second; 0 removes the cap)."""
        return self._apply(self._change(Control.SET_MAX_TASKS_PER_SECOND, args))

    @set_max_tasks_per_second.validator
    def _check_max_tasks_per_second(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.SET_MAX_TASKS_PER_SECOND, args))

    @workflow.update(name=Control.PAUSE)
    def pause(self, *args: Any) -> EffectiveSettings:
        """Stop gracefully: the run ends ``paused`` at its next turn (a durable wait ends at once)."""
        self._state.stopping = self._state.wake = self._state.progress.stopping = True
        workflow.logger.info("pause requested", extra={"experiment_id": self._state.input.experiment_id})
        self._view.refresh()
        return EffectiveSettings.of(self._state.input, batch_size=self._state.batch_size, stopping=True)

    @pause.validator
    def _check_pause(self, *args: Any) -> None:
        self._state.refuse(self._change(Control.PAUSE, args))

    @workflow.signal(dynamic=True)
    def unknown_signal(self, name: str, args: Sequence[RawValue]) -> None:
        """Any signal: this workflow takes none. Logged, so a misdirected one is not silently lost."""
        workflow.logger.warning(
            "signal %r ignored: this workflow is controlled by Updates (%s)",
            name,
            ", ".join(c.value for c in Control),
            extra={"experiment_id": self._state.input.experiment_id},
        )

    @staticmethod
    def _change(update: Control, args: Sequence[Any]) -> ControlChange:
        """The change Update ``update`` asks for, from its arguments (``ControlChange.of_update``).

        Raises:
            ApplicationError: non-retryable, type ``InvalidControl``: one line naming the field.
        """
        try:
            return ControlChange.of_update(update, args)
        except InvalidControlError as err:
            raise ApplicationError(str(err), type=INVALID_CONTROL, non_retryable=True) from None

    def _apply(self, change: ControlChange) -> EffectiveSettings:
        """Apply a validated change (``RunState.apply``), which wakes a durable wait."""
        inp = self._state.apply(change)
        workflow.logger.info(
            "settings changed",
            extra={"experiment_id": inp.experiment_id, **change.model_dump(mode="json", exclude_none=True)},
        )
        self._view.refresh()
        return EffectiveSettings.of(inp, batch_size=self._state.batch_size, stopping=self._state.stopping)

    @workflow.query
    def progress(self) -> Progress:
        """Where the replay stands: counters, last backlog reading, pacing, stall, outcome."""
        return self._state.shown()
