"""``ReconcileWorkflow``: resume the undone completions of one task stream, once (docs/operating.md, "Reconciliation").

Workflow code only: the activity (``xmc_resumption.reconcile``) is called by its registered name.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from xmc_resumption.workflows.models import Reconciled, ReconcileInput

RECONCILE_WORKFLOW_TYPE = "ReconcileWorkflow"
RECONCILE_ACTIVITY = "reconcile_completions"

RECONCILE_TIMEOUT = timedelta(minutes=5)
"""start-to-close of the one activity: a visibility listing, a script per completed experiment, a start each."""


@workflow.defn(name=RECONCILE_WORKFLOW_TYPE)
class ReconcileWorkflow:
    """Runs ``reconcile_completions`` once for its input's stream; returns what it found and started."""

    @workflow.run
    async def run(self, inp: ReconcileInput) -> list[Reconciled]:
        """Find the stream's undone completions and resume each."""
        found = await workflow.execute_activity(
            RECONCILE_ACTIVITY,
            inp,
            result_type=list[Reconciled],
            start_to_close_timeout=RECONCILE_TIMEOUT,
            retry_policy=RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=30)),
            summary=f"resume the undone completions of {inp.stream}",
        )
        return list(found)
