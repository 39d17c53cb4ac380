"""Undone completions: resumptions Temporal shows completed whose tasks Redis holds again (issue 23).

A crash failover to a replica that never got a resumption's last moves undoes its completion: Redis shows the
experiment paused (or resuming) and holding the tasks, Temporal shows the run completed. Temporal keeps what the run
was told it moved (``XmcLastMovedId``, its result's ``last_moved_id``), Redis what it holds
(``redisclient.failover.undone_completions``). Found here for ``xmc held --undone`` and the gauge
``UNDONE_COMPLETIONS``, and resumed by ``xmc reconcile``: once, or every interval from a Temporal Schedule that
runs ``ReconcileWorkflow`` (docs/operating.md, "Reconciliation"). A resumption started for one passes the
completion's last moved ID on (input ``moved_through``), so every task it moves again is marked and counted.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.common import MetricMeter
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.redisclient import failover
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.text import one_line
from xmc_resumption.runs import fleet_query, list_resumptions, start_resumption
from xmc_resumption.workflows.models import Reconciled, ReconcileInput, ResumptionInput
from xmc_resumption.workflows.reconcile import RECONCILE_WORKFLOW_TYPE

UNDONE_COMPLETIONS = "xmc_resumption_undone_completions"
"""Gauge (the reconciling worker's, label ``stream``): undone completions found by the last reconciliation."""

MIN_SCHEDULE_SECONDS = 10.0
"""The shortest interval of the reconciliation's Schedule (seconds): each run lists visibility and reads Redis."""

MAX_SCHEDULE_SECONDS = 7 * 86_400.0
"""The longest (seconds): a week."""

MAX_RUN_SECONDS = 1_800.0
"""A scheduled run's longest execution timeout (seconds): past its activity's tries (``RECONCILE_TIMEOUT``, 5 of)."""


def schedule_id(stream: str) -> str:
    """The reconciliation Schedule's ID for ``stream``: ``xmc-reconcile-<S>`` (also its workflows' ID prefix)."""
    return f"xmc-reconcile-{stream}"


async def last_completions(client: Client, stream: str, limit: int) -> dict[str, tuple[str, str | None, str]]:
    """The experiments of ``stream`` whose newest resumption completed having moved tasks.

    From visibility (``XmcOutcome``, ``XmcLastMovedId``), the newest ``limit`` resumptions of the stream.

    Returns:
        experiment ID -> (workflow ID, run ID, last moved ID), newest first.

    Raises:
        ValueError: a bad stream name. temporalio.service.RPCError: visibility refused the query or failed.
    """
    newest: dict[str, tuple[str, str | None, str]] = {}
    seen: set[str] = set()
    for row in await list_resumptions(client, fleet_query(stream=stream), limit):
        experiment = row["experiment_id"]
        if not isinstance(experiment, str) or experiment in seen:
            continue
        seen.add(experiment)
        moved = row["last_moved_id"]
        if row["outcome"] == "completed" and isinstance(moved, str) and moved:
            run_id = row["run_id"]
            newest[experiment] = (str(row["workflow_id"]), str(run_id) if run_id else None, moved)
    return newest


async def undone_completions(client: Client, redis: RedisClient, stream: str, limit: int = 1_000) -> list[Reconciled]:
    """The undone completions of ``stream``.

    Each experiment whose newest resumption completed and that Redis shows holding tasks at or below what that run
    was told it moved.

    Raises:
        ValueError: a bad stream name. temporalio.service.RPCError: Temporal failed.
        redis.exceptions.RedisError: on any Redis fault.
    """
    completed = await last_completions(client, stream, limit)
    found = await failover.undone_completions(redis, stream, {e: moved for e, (_, _, moved) in completed.items()})
    return [
        Reconciled(
            experiment_id=again.experiment_id,
            workflow_id=completed[again.experiment_id][0],
            run_id=completed[again.experiment_id][1],
            moved_through=completed[again.experiment_id][2],
            held_again=again.held_again,
            held_again_capped=again.held_again_capped,
            held=again.held,
            state=again.state.value,
        )
        for again in found
    ]


async def completed_input(client: Client, undone: Reconciled) -> ResumptionInput:
    """The input to resume ``undone`` with: its completed run's (with the Updates it took), passing its last moved ID.

    Raises:
        temporalio.service.RPCError: Temporal failed to give the run's history.
    """
    handle = client.get_workflow_handle(undone.workflow_id, run_id=undone.run_id)
    first = await anext(aiter(handle.fetch_history_events(page_size=1)))  # the started event: no more is read
    started = first.workflow_execution_started_event_attributes
    [inp] = await client.data_converter.decode(started.input.payloads, [ResumptionInput])
    return ResumptionInput.model_validate(inp).model_copy(update={"carry": None, "moved_through": undone.moved_through})


async def gone_since(redis: RedisClient, stream: str, undone: Reconciled) -> str | None:
    """Why ``undone`` is no undone completion any more, read again from Redis (resumed or paused since); None if it is.

    Raises:
        redis.exceptions.RedisError: on any Redis fault.
    """
    keys = ExperimentKeys(stream, undone.experiment_id)
    now = await failover.held_again(redis, keys, undone.moved_through)
    if not now.held_again:
        return f"skipped: it holds no task at or below {undone.moved_through} any more (resumed since)"
    if now.state.value != undone.state:
        return f"skipped: it is {now.state.value} now, not {undone.state} (resumed or paused since)"
    return None


async def reconcile(client: Client, redis: RedisClient, inp: ReconcileInput) -> list[Reconciled]:
    """Find the undone completions of ``inp.stream`` and, with ``inp.resume``, start a resumption of each.

    Each on ``inp.task_queue``, with its completed run's input and ``moved_through``, if Redis still shows it undone
    right before (``gone_since``); one skipped, or that cannot start (a resumption of it runs already), says why in
    ``error``.

    Raises:
        as ``undone_completions``.
    """
    found = await undone_completions(client, redis, inp.stream, inp.limit)
    if not inp.resume:
        return found
    for undone in found:
        undone.error = await gone_since(redis, inp.stream, undone)
        if undone.error is not None:
            continue
        try:
            handle = await start_resumption(client, await completed_input(client, undone), inp.task_queue)
            undone.started = handle.id
        except (WorkflowAlreadyStartedError, RPCError) as err:
            undone.error = one_line(str(err))
    return found


async def schedule_reconcile(client: Client, inp: ReconcileInput, every: timedelta) -> str:
    """Create, or update, the Temporal Schedule that runs ``ReconcileWorkflow`` with ``inp`` every ``every``.

    ID ``schedule_id(inp.stream)``; a run still going when the next is due is not overlapped (skipped), and times out
    after ``every`` (at most ``MAX_RUN_SECONDS``), so one that never runs (no worker) skips no tick after. An update
    keeps the Schedule's state (paused, note).

    Returns:
        "created" or "updated".

    Raises:
        ValueError: ``every`` outside ``MIN_SCHEDULE_SECONDS``..``MAX_SCHEDULE_SECONDS``.
        temporalio.service.RPCError: Temporal refused or failed.
    """
    seconds = every.total_seconds()
    if not MIN_SCHEDULE_SECONDS <= seconds <= MAX_SCHEDULE_SECONDS:
        raise ValueError(f"the interval must be {MIN_SCHEDULE_SECONDS:g}s..{MAX_SCHEDULE_SECONDS:g}s, got {seconds:g}s")
    sid = schedule_id(inp.stream)
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            RECONCILE_WORKFLOW_TYPE,
            inp,
            id=sid,
            task_queue=inp.task_queue,
            execution_timeout=timedelta(seconds=min(seconds, MAX_RUN_SECONDS)),
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )
    try:
        await client.create_schedule(sid, schedule)
        return "created"
    except ScheduleAlreadyRunningError:

        def replace(current: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=dataclasses.replace(schedule, state=current.description.schedule.state))

        await client.get_schedule_handle(sid).update(replace)
        return "updated"


class ReconcileActivities:
    """The activity of ``ReconcileWorkflow``, on the resumption's worker.

    With the replay's Redis client and the worker's Temporal client (``activity.client()``).

    Args:
        resumption: the worker's ``ResumptionActivities``, whose Redis client it uses (set when the worker starts).
        meter: the worker runtime's metric meter for ``UNDONE_COMPLETIONS``; None: the activity's own.
    """

    def __init__(self, resumption: ResumptionActivities, meter: MetricMeter | None = None) -> None:
        self._resumption = resumption
        self._meter = meter

    @activity.defn(name="reconcile_completions")
    async def reconcile_completions(self, inp: ReconcileInput) -> list[Reconciled]:
        """``reconcile`` for the workflow's input; sets ``UNDONE_COMPLETIONS`` and logs each one found."""
        found = await reconcile(activity.client(), self._resumption.redis, inp)
        meter = self._meter or activity.metric_meter()
        meter.create_gauge(UNDONE_COMPLETIONS, "undone completions found by the last reconciliation").set(
            len(found), {"stream": inp.stream}
        )
        for undone in found:
            extra: dict[str, Any] = undone.model_dump()
            activity.logger.error(
                "completed resumption undone by Redis: its tasks are held again; resuming it" if undone.started
                else "completed resumption undone by Redis: its tasks are held again",
                extra=extra,
            )  # fmt: skip
        return found
