"""Replay every recorded history (tests/histories/*.json) against the current workflow code: a
change that would break running workflows raises NondeterminismError here."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.resumption import ResumptionWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_histories_are_recorded() -> None:
    assert {p.stem for p in HISTORIES} >= {
        "completed_after_throttles",
        "paused_during_wait",
        "fenced_during_wait",
        "cancelled_during_wait",
        "continued_as_new",
        "waited_for_redis",
        "adaptive_completed",
    }


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_recorded_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(
        f"resumption-{path.stem}", path.read_text()
    )  # v0_*, v1_*: recorded by older code
    replayer = Replayer(workflows=[ResumptionWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
