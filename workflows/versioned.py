"""The workflows declared for Worker Versioning (docs/operating.md, "Rolling out a release")."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import VersioningBehavior

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.workflows.models import (
        WORKFLOW_TYPE,
        Reconciled,
        ReconcileInput,
        ResumptionInput,
        ResumptionResult,
    )
    from xmc_resumption.workflows.reconcile import RECONCILE_WORKFLOW_TYPE, ReconcileWorkflow
    from xmc_resumption.workflows.resumption import FAILURE_EXCEPTION_TYPES, ResumptionWorkflow


@workflow.defn(
    name=WORKFLOW_TYPE, failure_exception_types=FAILURE_EXCEPTION_TYPES, versioning_behavior=VersioningBehavior.PINNED
)
class PinnedResumptionWorkflow(ResumptionWorkflow):
    """``ResumptionWorkflow`` pinned to its Worker Deployment Version: the same type, input, result and handlers."""

    @workflow.run
    async def run(self, inp: ResumptionInput | Any) -> ResumptionResult:
        """Run the resumption loop (``ResumptionWorkflow.run``)."""
        return await super().run(inp)


@workflow.defn(name=RECONCILE_WORKFLOW_TYPE, versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
class AutoUpgradeReconcileWorkflow(ReconcileWorkflow):
    """``ReconcileWorkflow`` on the current Worker Deployment Version: one short activity, nothing to pin."""

    @workflow.run
    async def run(self, inp: ReconcileInput) -> list[Reconciled]:
        """Resume the stream's undone completions (``ReconcileWorkflow.run``)."""
        return await super().run(inp)
