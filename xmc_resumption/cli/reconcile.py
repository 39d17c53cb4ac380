"""``xmc reconcile``: resume the undone completions of a stream, now or from a Temporal Schedule.

An undone completion is a resumption Temporal shows completed whose tasks Redis holds again (a crash failover to a
replica that never got its last moves; ``xmc_resumption.reconcile``, docs/operating.md, "Reconciliation").
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import click

from xmc_resumption.cli.common import (
    STREAM_NAME,
    TASK_QUEUE_NAME,
    cli,
    client_of,
    emit,
    json_option,
    or_missing,
    run_sync,
    text_table,
)
from xmc_resumption.cli.params import DurationType, IntegerRange
from xmc_resumption.reconcile import (
    MAX_SCHEDULE_SECONDS,
    MIN_SCHEDULE_SECONDS,
    reconcile,
    schedule_id,
    schedule_reconcile,
)
from xmc_resumption.redisclient.keys import DEFAULT_STREAM
from xmc_resumption.workflows.models import Reconciled, ReconcileInput


def undone_table(rows: list[Reconciled]) -> str:
    """The undone completions as a table: experiment, completed run, tasks held again, state, resumption started."""
    return text_table(
        ["EXPERIMENT", "COMPLETED RUN", "HELD AGAIN", "HELD", "STATE", "RESUMED"],
        [
            [
                r.experiment_id,
                r.run_id or r.workflow_id,
                f"{r.held_again}{'+' if r.held_again_capped else ''}",
                r.held,
                r.state,
                r.started or or_missing(r.error, "-"),
            ]
            for r in rows
        ],
    )


@cli.command("reconcile", short_help="resume the completed resumptions whose tasks Redis holds again")
@click.option("--stream", type=STREAM_NAME, default=DEFAULT_STREAM, show_default=True, help="the task stream")
@click.option("--task-queue", type=TASK_QUEUE_NAME, help="the workers' task queue (default: XMC_TASK_QUEUE)")
@click.option("--limit", type=IntegerRange(1, 10_000), default=1_000, show_default=True, help="newest runs looked at")
@click.option("--dry-run", is_flag=True, help="find them, start nothing")
@click.option(
    "--schedule",
    "every",
    type=DurationType(MIN_SCHEDULE_SECONDS, MAX_SCHEDULE_SECONDS),
    help=f"instead, create or update a Temporal Schedule that reconciles every interval (e.g. 10m; "
    f"{MIN_SCHEDULE_SECONDS:g}s..{MAX_SCHEDULE_SECONDS / 86_400:g}d)",
)
@json_option
@click.pass_context
def reconcile_cmd(
    ctx: click.Context,
    stream: str,
    task_queue: str | None,
    limit: int,
    dry_run: bool,
    every: float | None,
    as_json: bool,
) -> None:
    """Resume every undone completion of the stream.

    An undone completion: an experiment whose newest resumption completed but which Redis shows holding the tasks
    that run moved (a crash failover undid the completion).

    Each with its completed run's input and its last moved entry ID (moved_through), so every task moved again is
    marked xmc-redelivery and counted. With --schedule, nothing is reconciled now: a Temporal Schedule
    (ID xmc-reconcile-<stream>) runs ReconcileWorkflow on the workers every interval, which does the same and sets
    the gauge xmc_resumption_undone_completions.
    """

    async def go() -> dict[str, Any]:
        async with client_of(ctx, stream) as client:
            inp = ReconcileInput(
                stream=stream, task_queue=task_queue or client.task_queue, limit=limit, resume=not dry_run
            )
            temporal = await client.temporal()
            if every is not None:
                done = await schedule_reconcile(temporal, inp, timedelta(seconds=every))
                return {"schedule_id": schedule_id(stream), "schedule": done, "every_seconds": every}
            return {"stream": stream, "undone": await reconcile(temporal, client.redis, inp)}

    doc = run_sync(go())
    if every is not None:
        text = f"schedule {doc['schedule_id']} {doc['schedule']}: reconciles {stream} every {every:g}s"
        emit(as_json, doc, text)
        return
    found: list[Reconciled] = doc["undone"]
    text = undone_table(found) if found else f"no undone completion on {stream}"
    emit(as_json, {"stream": stream, "undone": [r.model_dump(mode="json") for r in found]}, text)
