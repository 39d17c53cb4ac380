"""One timed resumption, started through the project's start helper.

Build the input, start ``ResumptionWorkflow``, wait for its result, count its history.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from bench.env import BenchEnv
from xmc_resumption.history import history_events_per_run
from xmc_resumption.runs import start_resumption
from xmc_resumption.workflows.models import ResumptionInput, ResumptionResult


@dataclass
class WorkflowRun:
    """A finished resumption.

    Attributes:
        wall_s: workflow start -> result, seconds (the client's monotonic clock).
        result: what the workflow returned.
        events_per_run: history events of each run of its continue-as-new chain.
    """

    wall_s: float
    result: ResumptionResult
    events_per_run: list[int] = field(default_factory=list)

    @property
    def events(self) -> int:
        """History events over all runs."""
        return sum(self.events_per_run)

    @property
    def largest_run_events(self) -> int:
        """History events of the largest single run."""
        return max(self.events_per_run, default=0)


def build_input(fields: dict[str, Any]) -> ResumptionInput:
    """Validate a dict into the workflow's input (``pydantic.ValidationError`` on an unknown field)."""
    return ResumptionInput.model_validate(fields)


async def run_resumption(env: BenchEnv, inp: ResumptionInput) -> WorkflowRun:
    """Start the resumption, wait for its result and count its history events per run.

    Raises:
        RuntimeError: the resumption did not complete.
    """
    started = time.monotonic()
    handle = await start_resumption(env.client, inp, env.task_queue)
    result = await handle.result()
    wall = time.monotonic() - started
    if result.outcome.value != "completed":
        raise RuntimeError(f"resumption of {inp.experiment_id} ended {result.outcome.value}")
    return WorkflowRun(wall, result, await history_events_per_run(env.client, handle))
