"""One timed resumption, started through the project's start helper.

Build the input, start ``ResumptionWorkflow``, wait for its result, count its history.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import Client, WorkflowHandle

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


HISTORY_CALLS_AT_ONCE = 50
"""How many history reads ``chain_lengths`` has in flight at a time."""


async def _chain_length(client: Client, workflow_id: str, run_id: str | None) -> list[int]:
    """History events of each run of one continue-as-new chain, oldest first, from ``run_id`` on.

    One reverse history read of one event a run: the last event's ID is the run's length, and a
    ``ContinuedAsNew`` last event names the next run.
    """
    per_run: list[int] = []
    while run_id:
        response = await client.workflow_service.get_workflow_execution_history_reverse(
            GetWorkflowExecutionHistoryReverseRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
                maximum_page_size=1,
            )
        )
        last = response.history.events[0]
        per_run.append(last.event_id)
        run_id = None
        if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return per_run


async def chain_lengths(client: Client, handles: Sequence[WorkflowHandle[Any, Any]]) -> list[list[int]]:
    """History events of each run of each handle's chain (closed runs), ``HISTORY_CALLS_AT_ONCE`` reads at a time."""
    gate = asyncio.Semaphore(HISTORY_CALLS_AT_ONCE)

    async def one(handle: WorkflowHandle[Any, Any]) -> list[int]:
        async with gate:
            return await _chain_length(client, handle.id, handle.first_execution_run_id or handle.result_run_id)

    return list(await asyncio.gather(*(one(h) for h in handles)))
