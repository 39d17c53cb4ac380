"""Resumptions in Temporal, for operators: the start, the fleet in visibility, the live run, its Updates and ETAs.

``xmc resume``, ``xmc list``, ``xmc set``, ``xmc stop`` and the Temporal side of ``xmc status`` (through
``xmc_resumption.client.XmcClient``), and the demo's and the benches' start.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from xmc_resumption.errors import OperatorError, update_failure_message
from xmc_resumption.redisclient.keys import validate_name
from xmc_resumption.redisclient.text import one_line
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.control import Control, EffectiveSettings
from xmc_resumption.workflows.models import WORKFLOW_TYPE, Progress, ResumptionInput, ResumptionResult, workflow_id_for
from xmc_resumption.workflows.resumption import ResumptionWorkflow


async def start_resumption(
    client: Client, inp: ResumptionInput, task_queue: str
) -> WorkflowHandle[ResumptionWorkflow, ResumptionResult]:
    """Start ``ResumptionWorkflow`` with the conventional ID ``resumption-<E>``, without any check.

    ``xmc_resumption.client.XmcClient.resume`` makes ``xmc resume``'s checks first, then calls this.

    Raises:
        temporalio.exceptions.WorkflowAlreadyStartedError: a resumption of this experiment runs.
    """
    return await client.start_workflow(ResumptionWorkflow.run, inp, **inp.start_options(task_queue))


FLEET_COLUMNS: dict[str, Any] = {
    "experiment_id": fleet.EXPERIMENT_ID,
    "stream": fleet.STREAM,
    "phase": fleet.PHASE,
    "replayed": fleet.REPLAYED,
    "remaining": fleet.REMAINING,
    "outcome": fleet.OUTCOME,
    "redelivered": fleet.REDELIVERED,
    "last_moved_id": fleet.LAST_MOVED_ID,
}
"""The fleet view's columns and the search attributes they come from (``workflows/fleet.py``)."""


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat(timespec="seconds") if moment else None


def fleet_row(
    workflow_id: str,
    run_id: str | None,
    status: WorkflowExecutionStatus | None,
    attributes: TypedSearchAttributes,
    start_time: datetime | None,
    close_time: datetime | None,
) -> dict[str, object]:
    """One resumption as visibility shows it.

    IDs, the run's status (``running``, ``completed``, ``failed``, ``terminated``, ...) and the fleet
    search attributes (None where not set yet).
    """
    row: dict[str, object] = {"workflow_id": workflow_id, "run_id": run_id}
    row["status"] = status.name.lower() if status else None
    row.update({column: attributes.get(key) for column, key in FLEET_COLUMNS.items()})
    row["start_time"], row["close_time"] = _iso(start_time), _iso(close_time)
    return row


def fleet_query(
    *,
    running: bool = False,
    phase: str | None = None,
    experiment_id: str | None = None,
    stream: str | None = None,
    redelivered: bool = False,
) -> str:
    """The visibility query of ``list_resumptions``, narrowed by the filters.

    Every ``ResumptionWorkflow`` run but those that continued as new (a chain shows once, by its newest
    run); ``redelivered``: only those that moved tasks again after Redis lost their move (``XmcRedelivered > 0``).

    Raises:
        ValueError: an experiment ID or stream that breaks ``validate_name`` (its characters hold
            no quote, so a checked value cannot change the query); a phase that is not
            among ``fleet.phase_values``.
    """
    clauses = [f"WorkflowType = '{WORKFLOW_TYPE}'", "ExecutionStatus != 'ContinuedAsNew'"]
    if running:
        clauses.append("ExecutionStatus = 'Running'")
    if phase is not None:
        if phase not in fleet.phase_values():
            raise ValueError(f"phase must be one of {', '.join(fleet.phase_values())}, got {phase[:40]!r}")
        clauses.append(f"{fleet.PHASE.name} = '{phase}'")
    if experiment_id is not None:
        name = validate_name("experiment_id", experiment_id)
        # by ID too: a run no worker has started yet has no search attribute set
        clauses.append(f"({fleet.EXPERIMENT_ID.name} = '{name}' OR WorkflowId = '{workflow_id_for(name)}')")
    if stream is not None:
        clauses.append(f"{fleet.STREAM.name} = '{validate_name('stream', stream)}'")
    if redelivered:
        clauses.append(f"{fleet.REDELIVERED.name} > 0")
    return " AND ".join(clauses)


async def list_resumptions(client: Client, query: str, limit: int) -> list[dict[str, object]]:
    """The resumptions visibility lists for ``query`` (``fleet_query``), newest first.

    Rows as ``fleet_row``. Needs no worker: search attributes live on the server.

    Raises:
        temporalio.service.RPCError: the query is refused (e.g. the search attributes are not
            registered on the namespace) or Temporal fails.
    """
    rows: list[dict[str, object]] = []
    execution: WorkflowExecution
    async for execution in client.list_workflows(query, limit=limit, page_size=min(limit, 1_000)):
        rows.append(
            fleet_row(
                execution.id,
                execution.run_id,
                execution.status,
                execution.typed_search_attributes,
                execution.start_time,
                execution.close_time,
            )
        )
    return rows


async def live_run(client: Client, experiment_id: str, query_timeout: float) -> dict[str, object] | None:
    """The resumption ``resumption-<E>`` as Temporal knows it, None when there never was one.

    Its ``fleet_row`` and, while it runs, ``progress`` (the ``progress`` query, or None when no worker
    answered within ``query_timeout`` seconds, with ``progress_error`` saying so); once it completed,
    its result's ``release_error`` when the claim could not be released at its end.

    Raises:
        temporalio.service.RPCError: Temporal fails otherwise.
    """
    handle = client.get_workflow_handle(workflow_id_for(experiment_id))
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            return None
        raise
    row = fleet_row(desc.id, desc.run_id, desc.status, desc.typed_search_attributes, desc.start_time, desc.close_time)
    if desc.status is WorkflowExecutionStatus.RUNNING:
        try:
            progress: Progress = await asyncio.wait_for(handle.query(ResumptionWorkflow.progress), query_timeout)
            row["progress"] = progress.model_dump(mode="json")
        except (TimeoutError, RPCError) as err:
            row["progress"] = None
            row["progress_error"] = (
                f"no worker answered the progress query within {query_timeout:g}s"
                if isinstance(err, TimeoutError)
                else one_line(err.message)
            )
    elif desc.status is WorkflowExecutionStatus.COMPLETED:
        # the result is in the closed run's history: no worker needed
        closed = client.get_workflow_handle(desc.id, run_id=desc.run_id, result_type=ResumptionResult)
        try:
            result = await asyncio.wait_for(closed.result(), query_timeout)
        except (TimeoutError, RPCError) as err:
            row["result_error"] = (
                f"the result was not read within {query_timeout:g}s"
                if isinstance(err, TimeoutError)
                else one_line(err.message)
            )
        else:
            if result.release_error:
                row["release_error"] = result.release_error
    return row


async def running_handle(client: Client, experiment_id: str) -> WorkflowHandle[Any, Any]:
    """A handle on the running resumption ``resumption-<E>``.

    Bound to no run: its calls reach the newest run, after a continue-as-new too.

    Raises:
        OperatorError: no resumption of the experiment runs (none ever did, or it ended).
    """
    workflow_id = workflow_id_for(experiment_id)
    handle = client.get_workflow_handle(workflow_id, result_type=ResumptionResult)
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status is not RPCStatusCode.NOT_FOUND:
            raise
        raise OperatorError(f"no resumption of {experiment_id} runs: {workflow_id} not found") from err
    if desc.status is not WorkflowExecutionStatus.RUNNING:
        ended = desc.status.name.lower() if desc.status else "unknown"
        raise OperatorError(f"no resumption of {experiment_id} runs: {workflow_id} ended ({ended}, run {desc.run_id})")
    return handle  # no run ID: Updates reach the newest run of the chain


async def run_update(handle: WorkflowHandle[Any, Any], name: Control, arg: Any, seconds: float) -> EffectiveSettings:
    """Run Update ``name`` on the running resumption; returns the settings the run goes on with.

    With ``arg``, or none; at most ``seconds``.

    Raises:
        OperatorError: the validator rejected it, the run ended meanwhile, or no worker answered.
    """
    args = [] if arg is None else [arg]
    try:
        return await asyncio.wait_for(
            handle.execute_update(
                name.value, args=args, result_type=EffectiveSettings, rpc_timeout=timedelta(seconds=seconds)
            ),
            seconds,
        )
    except WorkflowUpdateFailedError as err:
        raise OperatorError(update_failure_message(err, handle.id)) from err
    except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError) as err:
        raise OperatorError(
            f"no worker answered the {name.value} Update of {handle.id} within {seconds:g}s: is a worker running?"
        ) from err
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            raise OperatorError(f"{handle.id} ended before the {name.value} Update: {one_line(err.message)}") from err
        raise


async def add_etas(client: Client, rows: list[dict[str, object]], most: int, within_seconds: float) -> None:
    """Add ``eta_seconds`` and ``eta_at`` (the ``progress`` query's) to each running row of ``list_resumptions``.

    At most ``most`` runs, the first in ``rows``, asked together and all within ``within_seconds``; a
    run not asked, or not answering in time, gets None. Visibility holds no ETA: it changes with every
    reading, and a search attribute per change would cost a history event each (``workflows/fleet.py``
    refreshes the counts at most every 30 s); a query costs none.

    Raises:
        ValueError: ``most`` < 0 or ``within_seconds`` not > 0.
    """
    if most < 0 or not within_seconds > 0:
        raise ValueError(f"need most >= 0 and within_seconds > 0, got {most} and {within_seconds}")
    for row in rows:
        row["eta_seconds"] = row["eta_at"] = None
    running = [row for row in rows if row["status"] == "running"][:most]

    async def ask(row: dict[str, object]) -> None:
        handle = client.get_workflow_handle(str(row["workflow_id"]))
        try:
            progress: Progress = await handle.query(ResumptionWorkflow.progress)
        except RPCError:
            return  # no worker, or the run ended meanwhile: no ETA
        row["eta_seconds"] = progress.eta_seconds
        row["eta_at"] = _iso(progress.eta_at)

    tasks = [asyncio.ensure_future(ask(row)) for row in running]
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=within_seconds)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
