"""Starting a resumption from another workflow, as a child workflow."""

from __future__ import annotations

from temporalio import workflow
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.workflows.models import TASK_QUEUE, ResumptionInput, ResumptionResult
    from xmc_resumption.workflows.resumption import ResumptionWorkflow


async def start_resumption_child(
    inp: ResumptionInput, *, task_queue: str = TASK_QUEUE
) -> ChildWorkflowHandle[ResumptionWorkflow, ResumptionResult]:
    """Start ``ResumptionWorkflow`` as a child of the calling workflow; call only from workflow code.

    Its ID and parent close policy: docs/embedding.md, "As a child of another workflow".

    Raises:
        temporalio.exceptions.WorkflowAlreadyStartedError: a resumption of this experiment runs.
    """
    return await workflow.start_child_workflow(
        ResumptionWorkflow.run, inp, parent_close_policy=ParentClosePolicy.ABANDON, **inp.start_options(task_queue)
    )
