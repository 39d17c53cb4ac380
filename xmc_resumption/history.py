"""Workflow history sizes, following a continue-as-new chain (shared by the demo and the benchmarks)."""

from __future__ import annotations

from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle


async def history_events_per_run(client: Client, handle: WorkflowHandle[Any, Any]) -> list[int]:
    """History events of each run of the chain (events, oldest run first), from the first run on."""
    run_id: str | None = handle.first_execution_run_id or handle.result_run_id
    per_run: list[int] = []
    while run_id:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        per_run.append(len(history.events))
        last = history.events[-1]
        run_id = None
        if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return per_run
