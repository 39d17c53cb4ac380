"""A parent workflow for the tests: starts a resumption as a child, the way the README shows."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.workflows.child import start_resumption_child
    from xmc_resumption.workflows.models import ResumptionInput, ResumptionResult


@workflow.defn
class ResumeExperimentParent:
    """Resumes an experiment through a child ``ResumptionWorkflow`` and returns its result."""

    @workflow.run
    async def run(self, inp: ResumptionInput, resumption_task_queue: str) -> ResumptionResult:
        child = await start_resumption_child(inp, task_queue=resumption_task_queue)
        return await child
