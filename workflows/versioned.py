"""``PinnedResumptionWorkflow``: ``ResumptionWorkflow`` pinned (docs/operating.md, "Rolling out a release")."""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.workflows.models import WORKFLOW_TYPE, ResumptionInput, ResumptionResult
    from xmc_resumption.workflows.resumption import FAILURE_EXCEPTION_TYPES, ResumptionWorkflow


@workflow.defn(
    name=WORKFLOW_TYPE, failure_exception_types=FAILURE_EXCEPTION_TYPES, versioning_behavior=VersioningBehavior.PINNED
)
class PinnedResumptionWorkflow(ResumptionWorkflow):
    """``ResumptionWorkflow`` pinned to its Worker Deployment Version: the same type, input, result and handlers."""

    @workflow.run
    async def run(self, inp: ResumptionInput) -> ResumptionResult:
        """Run the resumption loop (``ResumptionWorkflow.run``)."""
        return await super().run(inp)
