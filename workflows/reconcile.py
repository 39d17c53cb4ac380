"""``ReconcileWorkflow``: resume the undone completions of one task stream, once (docs/operating.md, "Reconciliation").

A completed resumption whose tasks Redis holds again (a crash failover to a replica that never got its last moves)
is an undone completion; the activity ``reconcile_completions`` (``xmc_resumption.reconcile``) finds them, from
Temporal visibility and Redis, and starts a resumption of each that passes the completion's last moved ID on, so
every task it moves again is marked and counted. ``xmc reconcile --schedule`` runs this workflow from a Temporal
Schedule. Workflow code only: the activity is called by its registered name.
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
        """Find the stream's undone completions and resume each (see the module docstring)."""
        found = await workflow.execute_activity(
            RECONCILE_ACTIVITY,
            inp,
            result_type=list[Reconciled],
            start_to_close_timeout=RECONCILE_TIMEOUT,
            retry_policy=RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=30)),
            summary=f"resume the undone completions of {inp.stream}",
        )
        return list(found)
