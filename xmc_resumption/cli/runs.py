"""The Temporal-side commands on resumptions: ``list``, ``resume``, ``set`` and ``stop``."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import click
from temporalio.client import (
    WorkflowFailureError,
)

from xmc_resumption.cli.common import (
    EXPERIMENT_ID,
    QUERY_TIMEOUT_SECONDS,
    STREAM_NAME,
    TASK_QUEUE_NAME,
    UPDATE_TIMEOUT,
    ManyArgument,
    app_state,
    cli,
    client_of,
    emit,
    eta_text,
    experiment_command,
    field_option,
    input_options,
    json_option,
    or_missing,
    run_sync,
    settings_of,
    text_table,
)
from xmc_resumption.cli.params import FiniteFloat, IntegerRange, field_type
from xmc_resumption.cli.planning import plan_text, run_plan, sample_option
from xmc_resumption.cli.watch import Watcher
from xmc_resumption.client import NothingToResumeError, ResumeError
from xmc_resumption.errors import (
    EXIT_OPERATOR_ERROR,
    EXIT_RUN_FAILED,
    OperatorError,
    RunFailedError,
    workflow_failure_message,
)
from xmc_resumption.redisclient.keys import DEFAULT_STREAM
from xmc_resumption.redisclient.ratecap import MAX_TASKS_PER_SECOND
from xmc_resumption.redisclient.text import one_line
from xmc_resumption.runs import add_etas, fleet_query
from xmc_resumption.status import MAX_LISTED
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.control import ControlChange, EffectiveSettings
from xmc_resumption.workflows.models import TASK_QUEUE, ResumptionInput, workflow_id_for

ETA_QUERIES = 50
"""``xmc list``: the most running resumptions whose progress query is asked for the ETA (the
newest first); the others show '-'. The queries run together, all within ``QUERY_TIMEOUT_SECONDS``."""


@cli.command("list", short_help="every resumption in Temporal visibility, with its phase and progress")
@click.option("--running", is_flag=True, help="only running resumptions")
@click.option("--phase", type=click.Choice(fleet.phase_values()), help="only this XmcPhase (an outcome once ended)")
@click.option("--experiment", "experiment_id", type=EXPERIMENT_ID, help="only this experiment")
@click.option("--stream", type=STREAM_NAME, help="only resumptions into this stream")
@click.option("--redelivered", is_flag=True, help="only resumptions that moved tasks again after Redis lost their move")
@click.option("--limit", type=IntegerRange(1, MAX_LISTED), default=200, show_default=True, help="most runs listed")
@click.option(
    "--eta/--no-eta",
    default=True,
    show_default=True,
    help=f"ask each running resumption's progress for its ETA (at most {ETA_QUERIES} runs, {QUERY_TIMEOUT_SECONDS:g}s)",
)
@json_option
@click.pass_context
def list_cmd(
    ctx: click.Context,
    running: bool,
    phase: str | None,
    experiment_id: str | None,
    stream: str | None,
    redelivered: bool,
    limit: int,
    eta: bool,
    as_json: bool,
) -> None:
    """Every ResumptionWorkflow run visibility knows, newest first; no worker needed.

    A continue-as-new chain shows once, by its newest run; from the search attributes XmcExperimentId,
    XmcPhase, XmcReplayed, XmcRemaining, XmcRedelivered and XmcOutcome. The same query works from the Temporal CLI:
    temporal workflow list --query "XmcPhase = 'throttled'". The ETA column is no search attribute (it
    changes with every reading): it comes from the progress query of each running run, asked together
    within a few seconds, '-' where no worker answered in time or no rate is known yet.
    """
    query = fleet_query(
        running=running, phase=phase, experiment_id=experiment_id, stream=stream, redelivered=redelivered
    )

    async def go() -> list[dict[str, object]]:
        async with client_of(ctx, stream or DEFAULT_STREAM) as client:
            found = await client.list_resumptions(
                running=running,
                phase=phase,
                experiment_id=experiment_id,
                stream=stream,
                limit=limit,
                redelivered=redelivered,
            )
            rows = [row.model_dump(mode="json") for row in found]
            if eta:
                await add_etas(await client.temporal(), rows, ETA_QUERIES, QUERY_TIMEOUT_SECONDS)
        return rows

    rows = run_sync(go())
    table = text_table(
        [
            "WORKFLOW ID",
            "STATUS",
            "EXPERIMENT",
            "PHASE",
            "REPLAYED",
            "REDELIVERED",
            "REMAINING",
            "ETA",
            "OUTCOME",
            "STARTED",
        ],
        [
            [
                r["workflow_id"],
                r["status"],
                or_missing(r["experiment_id"], "-"),
                or_missing(r["phase"], "-"),
                or_missing(r["replayed"], "-"),
                or_missing(r["redelivered"], "-"),
                or_missing(r["remaining"], "-"),
                eta_text(r.get("eta_seconds"), r.get("eta_at")).split(" (at")[0],  # type: ignore[arg-type]
                or_missing(r["outcome"], "-"),
                or_missing(r["start_time"], "-"),
            ]
            for r in rows
        ],
    )
    emit(as_json, {"query": query, "resumptions": rows}, table if rows else f"no resumption matches {query}")


@cli.command(
    "resume", short_help="start ResumptionWorkflow for each experiment (ID resumption-<E>); --wait shows progress"
)
@click.argument("experiment_id", cls=ManyArgument, nargs=-1, required=True, type=EXPERIMENT_ID)
@click.option("--stream", type=STREAM_NAME, default=DEFAULT_STREAM, show_default=True, help="the task stream")
@json_option
@input_options
@click.option(
    "--task-queue",
    type=TASK_QUEUE_NAME,
    default=None,
    show_default="XMC_TASK_QUEUE, else " + TASK_QUEUE,
    help="the task queue the workers poll",
)
@click.option("--wait", is_flag=True, help="show progress until the runs end, then print their results")
@click.option("--quiet", "-q", is_flag=True, help="with --wait: no progress display (warnings still shown)")
@click.option("--force", is_flag=True, help="start even if an experiment is running and holds nothing")
@click.option("--dry-run", is_flag=True, help="start nothing: print what xmc plan prints for each input")
@sample_option
@click.pass_context
def resume(
    ctx: click.Context,
    /,
    experiment_id: tuple[str, ...],
    stream: str,
    as_json: bool,
    task_queue: str | None,
    wait: bool,
    quiet: bool,
    force: bool,
    dry_run: bool,
    sample_seconds: float,
    **fields: Any,
) -> None:
    """Start a resumption of each experiment (XmcClient.resume_many).

    Options left out take ResumptionInput's defaults; every input is validated by the model, and every
    experiment checked, before anything starts: a refusal (exit 2) starts none. Refused: an experiment
    that is running and holds nothing, a Redis that may evict keys. A run already going is reported
    (exit 2) after the others have started. One line per started run. With --wait: progress every
    second on stderr for each run in turn (a bar on a terminal, a line every few seconds otherwise), a
    warning when no consumer drains the stream or no worker answers; exit 1 when a run ends without a
    result (failed, terminated, cancelled). --json: one document, and with several experiments
    {"resumptions": [...]}. With --dry-run: nothing is written or started; each experiment's plan is
    printed (as xmc plan; --json: one document, with several {"plans": [...]}), exit 2 with one line
    when a start would be refused.
    """
    given = {name: value for name, value in fields.items() if value is not None}
    inputs = [
        ResumptionInput.model_validate({"experiment_id": e, "stream": stream, **given})
        for e in dict.fromkeys(experiment_id)
    ]
    if dry_run:
        plans = [run_sync(run_plan(ctx, inp, sample_seconds)) for inp in inputs]
        docs = [p.model_dump(mode="json") for p in plans]
        emit(as_json, docs[0] if len(plans) == 1 else {"plans": docs}, "\n".join(plan_text(p) for p in plans))
        refusing = [f"{p.experiment_id}: {p.refusals[0]}" for p in plans if not p.startable]
        if refusing:
            print(f"{ctx.command_path}: the start would be refused: {one_line('; '.join(refusing))}", file=sys.stderr)
            ctx.exit(EXIT_OPERATOR_ERROR)
        return
    docs, failed, refused = run_sync(
        _resume(ctx, inputs, task_queue, wait=wait, quiet=quiet or as_json, force=force, as_json=as_json)
    )
    if as_json:
        emit(True, docs[0] if len(inputs) == 1 and docs else {"resumptions": docs}, "")
    else:
        for doc in docs:
            if doc.get("result"):
                prefix = "" if len(inputs) == 1 else f"{doc['workflow_id']}: "
                print(prefix + _result_text(doc["result"]))
    for message in failed:
        print(f"{ctx.command_path}: {message}", file=sys.stderr, flush=True)
    if refused is not None:
        raise refused
    if failed:
        ctx.exit(EXIT_RUN_FAILED)


async def _resume(
    ctx: click.Context,
    inputs: list[ResumptionInput],
    task_queue: str | None,
    *,
    wait: bool,
    quiet: bool,
    force: bool,
    as_json: bool,
) -> tuple[list[dict[str, Any]], list[str], ResumeError | None]:
    """Start the runs; with ``wait`` follow each to its end.

    Returns (one document per started run, the one-line messages of runs that ended without a result,
    the error of runs that did not start).
    """
    settings = settings_of(ctx)
    queue = task_queue or settings.task_queue
    refused: ResumeError | None = None
    async with client_of(ctx, inputs[0].stream) as client:
        try:
            handles = await client.resume_many(inputs, force=force, task_queue=queue)
        except NothingToResumeError as err:
            raise OperatorError(f"{err} (--force starts the workflow anyway)") from err
        except ResumeError as err:
            handles, refused = err.started, err
        by_id = {workflow_id_for(inp.experiment_id): inp for inp in inputs}
        docs: list[dict[str, Any]] = []
        for handle in handles:
            inp = by_id[handle.id]
            docs.append(
                {"workflow_id": handle.id, "run_id": handle.result_run_id, "input": inp.model_dump(mode="json")}
            )
            if not as_json:
                print(f"started {handle.id} (run {handle.result_run_id})", flush=True)
        failed: list[str] = []
        if wait and handles:
            stops = "; ".join(f"xmc stop {by_id[h.id].experiment_id}" for h in handles)
            running = ", ".join(h.id for h in handles)
            app_state(ctx).interrupted_note = (
                f"{running} keeps running ({stops} stops it)"
                if len(handles) == 1
                else f"{running} keep running ({stops} stop them)"
            )
            temporal = await client.temporal()
            for doc in docs:
                watcher = Watcher(ctx, temporal, settings, by_id[doc["workflow_id"]], queue, quiet=quiet)
                try:
                    doc["result"] = (await watcher.run(doc["workflow_id"])).model_dump(mode="json")
                except RunFailedError as err:
                    failed.append(str(err))
    return docs, failed, refused


def _result_text(result: Mapping[str, Any]) -> str:
    return (
        f"outcome: {result['outcome']}; {result['replayed']} replayed, {result['remaining']} remaining, "
        f"{result['throttles']} throttle waits, {result['turns']} turns, {result['runs']} run(s), "
        f"fencing token {result['token']}"
        + (f", {result['set_aside']} set aside" if result.get("set_aside") else "")
        + (f"\nCLAIM NOT RELEASED: {result['release_error']}" if result.get("release_error") else "")
    )


class RateCapChange(FiniteFloat):
    """``xmc set --max-tasks-per-second``: 0 (remove the cap) or a value within the field's bounds.

    The bounds are ``ResumptionInput.max_tasks_per_second``'s.
    """

    def __init__(self) -> None:
        super().__init__(0, MAX_TASKS_PER_SECOND)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The cap ``value`` stands for (0: none); ``fail`` when it is out of bounds."""
        number = super().convert(value, param, ctx)
        return 0.0 if number == 0 else field_type(ResumptionInput, "max_tasks_per_second").convert(number, param, ctx)


@experiment_command(
    cli,
    "set",
    "change a running resumption's threshold, batch, throttle wait, policy or rate cap (the configure Update)",
)
@field_option("--threshold", "max_backlog_threshold")
@field_option("--batch", "batch_size")
@field_option("--throttle-seconds", "throttle_seconds")
@field_option("--policy", "throttle_policy")
@click.option(
    "--max-tasks-per-second",
    "max_tasks_per_second",
    type=RateCapChange(),
    help="max_tasks_per_second: the replay's rate cap, tasks per second; 0 removes it",
)
@click.option(
    "--timeout", type=UPDATE_TIMEOUT, default=30.0, show_default=True, help="seconds to wait for a worker to answer"
)
def set_cmd(ctx: click.Context, experiment_id: str, stream: str, as_json: bool, timeout: float, **fields: Any) -> None:
    """Change the settings of a running resumption with one configure Update.

    Prints the settings it runs with from now on. Each value is checked against ResumptionInput's bounds
    here, and the whole input again by the workflow's validator (claim_lease_seconds must stay longer
    than every wait), which refuses a bad change without a trace in the history.
    """
    given = {name: value for name, value in fields.items() if value is not None}
    if not given:
        raise click.UsageError(
            "nothing to change: give --threshold, --batch, --throttle-seconds, --policy or --max-tasks-per-second", ctx
        )
    change = ControlChange.model_validate(given)

    async def go() -> EffectiveSettings:
        async with client_of(ctx, stream) as client:
            return await client.configure(experiment_id, change, update_timeout=timeout)

    effective = run_sync(go())
    emit(as_json, effective.model_dump(mode="json"), _effective_text(workflow_id_for(experiment_id), effective))


@experiment_command(
    cli, "stop", "stop a running resumption gracefully (the pause Update): it ends 'paused' at its next turn"
)
@click.option("--wait", is_flag=True, help="wait for the run to end and print its outcome")
@click.option(
    "--timeout", type=UPDATE_TIMEOUT, default=30.0, show_default=True, help="seconds to wait for a worker to answer"
)
def stop(ctx: click.Context, experiment_id: str, stream: str, as_json: bool, wait: bool, timeout: float) -> None:
    """Ask the running resumption to stop; held tasks stay.

    At its next turn it releases the claim, leaves the experiment paused and ends with outcome 'paused'.
    A throttle wait is cut short. xmc resume goes on from where it stopped.
    """

    async def go() -> dict[str, Any]:
        async with client_of(ctx, stream) as client:
            stopping = await client.stop(experiment_id, update_timeout=timeout)
        handle = stopping.handle
        doc: dict[str, Any] = {"workflow_id": handle.id, "settings": stopping.settings.model_dump(mode="json")}
        if wait:
            try:
                doc["result"] = (await handle.result()).model_dump(mode="json")
            except WorkflowFailureError as err:
                raise RunFailedError(workflow_failure_message(err, handle.id)) from err
        return doc

    doc = run_sync(go())
    text = f"{doc['workflow_id']} is stopping: it ends 'paused' at its next turn"
    if "result" in doc:
        text = f"{doc['workflow_id']} stopped\n{_result_text(doc['result'])}"
    emit(as_json, doc, text)


def _effective_text(workflow_id: str, s: EffectiveSettings) -> str:
    return (
        f"{workflow_id} runs with: threshold {s.max_backlog_threshold}, batch {s.batch_size}, "
        f"throttle {s.throttle_seconds:g}s, policy {s.throttle_policy.value}, "
        f"rate cap {'none' if s.max_tasks_per_second is None else f'{s.max_tasks_per_second:g}/s'}"
        + (", stopping" if s.stopping else "")
    )
