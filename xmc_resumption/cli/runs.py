"""The Temporal-side commands on resumptions: ``list``, ``resume``, ``set`` and ``stop``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import click
from pydantic import ValidationError
from temporalio.client import (
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from xmc_resumption.cli.common import (
    EXPERIMENT_ID,
    QUERY_TIMEOUT_SECONDS,
    STREAM_NAME,
    UPDATE_TIMEOUT,
    app_state,
    cli,
    emit,
    eta_text,
    experiment_command,
    field_adapter,
    input_bounds,
    input_options,
    json_option,
    or_missing,
    run_sync,
    settings_of,
    text_table,
)
from xmc_resumption.cli.planning import plan_text, run_plan, sample_option
from xmc_resumption.cli.watch import Watcher
from xmc_resumption.errors import (
    EXIT_OPERATOR_ERROR,
    OperatorError,
    RunFailedError,
    one_line,
    update_failure_message,
    workflow_failure_message,
)
from xmc_resumption.ops import (
    MAX_LISTED,
    add_etas,
    fleet_phases,
    fleet_query,
    list_resumptions,
    refuse_evicting_redis,
    running_handle,
    start_resumption,
    state_and_held,
)
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.settings import connect_temporal
from xmc_resumption.workflows.models import (
    Control,
    ControlChange,
    EffectiveSettings,
    ResumptionInput,
    ThrottlePolicy,
    workflow_id_for,
)

ETA_QUERIES = 50
"""``xmc list``: the most running resumptions whose progress query is asked for the ETA (the
newest first); the others show '-'. The queries run together, all within ``QUERY_TIMEOUT_SECONDS``."""


@cli.command("list", short_help="every resumption in Temporal visibility, with its phase and progress")
@click.option("--running", is_flag=True, help="only running resumptions")
@click.option("--phase", type=click.Choice(fleet_phases()), help="only this XmcPhase (an outcome once ended)")
@click.option("--experiment", "experiment_id", type=EXPERIMENT_ID, help="only this experiment")
@click.option("--stream", type=STREAM_NAME, help="only resumptions into this stream")
@click.option("--limit", type=click.IntRange(1, MAX_LISTED), default=200, show_default=True, help="most runs listed")
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
    limit: int,
    eta: bool,
    as_json: bool,
) -> None:
    """Every ResumptionWorkflow run visibility knows (a continue-as-new chain once, by its newest
    run), newest first, from the search attributes XmcExperimentId, XmcPhase, XmcReplayed,
    XmcRemaining and XmcOutcome: no worker needed. The same query works from the Temporal CLI:
    temporal workflow list --query "XmcPhase = 'throttled'". The ETA column is no search attribute
    (it changes with every reading): it comes from the progress query of each running run, asked
    together within a few seconds, '-' where no worker answered in time or no rate is known yet."""
    query = fleet_query(running=running, phase=phase, experiment_id=experiment_id, stream=stream)

    async def go() -> list[dict[str, object]]:
        settings_of(ctx)
        client = await connect_temporal()
        rows = await list_resumptions(client, query, limit)
        if eta:
            await add_etas(client, rows, ETA_QUERIES, QUERY_TIMEOUT_SECONDS)
        return rows

    rows = run_sync(go())
    table = text_table(
        ["WORKFLOW ID", "STATUS", "EXPERIMENT", "PHASE", "REPLAYED", "REMAINING", "ETA", "OUTCOME", "STARTED"],
        [
            [
                r["workflow_id"],
                r["status"],
                or_missing(r["experiment_id"], "-"),
                or_missing(r["phase"], "-"),
                or_missing(r["replayed"], "-"),
                or_missing(r["remaining"], "-"),
                eta_text(r.get("eta_seconds"), r.get("eta_at")).split(" (at")[0],  # type: ignore[arg-type]
                or_missing(r["outcome"], "-"),
                or_missing(r["start_time"], "-"),
            ]
            for r in rows
        ],
    )
    emit(as_json, {"query": query, "resumptions": rows}, table if rows else f"no resumption matches {query}")


@experiment_command(
    cli, "resume", "start ResumptionWorkflow for the experiment (ID resumption-<E>); --wait shows its progress"
)
@input_options
@click.option("--wait", is_flag=True, help="show progress until the run ends, then print its result")
@click.option("--quiet", "-q", is_flag=True, help="with --wait: no progress display (warnings still shown)")
@click.option("--force", is_flag=True, help="start even if the experiment is running and holds nothing")
@click.option("--dry-run", is_flag=True, help="start nothing: print what xmc plan prints for this input")
@sample_option
def resume(
    ctx: click.Context,
    experiment_id: str,
    stream: str,
    as_json: bool,
    wait: bool,
    quiet: bool,
    force: bool,
    dry_run: bool,
    sample_seconds: float,
    **fields: Any,
) -> None:
    """Start a resumption. Options left out take ResumptionInput's defaults; the whole input is
    validated by the model before anything is read or started (one rule: the workflow's).
    Refused (exit 2) when the experiment is running and holds nothing, or a resumption of it
    already runs. With --wait: progress every second on stderr (a bar on a terminal, a line every
    few seconds otherwise), a warning when no consumer drains the stream or no worker answers;
    exit 1 when the run ends without a result (failed, terminated, cancelled). With --dry-run:
    nothing is written or started; the plan is printed (as xmc plan), exit 2 when the start
    would be refused."""
    given = {name: value for name, value in fields.items() if value is not None}
    inp = ResumptionInput.model_validate({"experiment_id": experiment_id, "stream": stream, **given})
    if dry_run:
        found = run_sync(run_plan(ctx, inp, sample_seconds))
        emit(as_json, found.model_dump(mode="json"), plan_text(found))
        if not found.startable:
            print(f"{ctx.command_path}: the start would be refused: {one_line(found.refusals[0])}", file=sys.stderr)
            ctx.exit(EXIT_OPERATOR_ERROR)
        return
    doc = run_sync(_resume(ctx, inp, wait=wait, quiet=quiet or as_json, force=force, as_json=as_json))
    if not as_json and doc.get("result"):
        print(_result_text(doc["result"]))
    elif as_json:
        emit(True, doc, "")


async def _resume(
    ctx: click.Context, inp: ResumptionInput, *, wait: bool, quiet: bool, force: bool, as_json: bool
) -> dict[str, Any]:
    settings = settings_of(ctx)
    redis = settings.redis()
    keys = ExperimentKeys(inp.stream, inp.experiment_id)
    try:
        state, waiting = await state_and_held(redis, keys)
        await refuse_evicting_redis(redis, keys)
    finally:
        await redis.aclose()
    if state is ExperimentState.RUNNING and not waiting and not force:
        raise OperatorError(
            f"experiment {inp.experiment_id} is running and holds no tasks on {inp.stream}: nothing to resume "
            "(--force starts the workflow anyway)"
        )
    client = await connect_temporal()
    handle = await start_resumption(client, inp, settings.task_queue)
    doc: dict[str, Any] = {
        "workflow_id": handle.id,
        "run_id": handle.result_run_id,
        "input": inp.model_dump(mode="json"),
    }
    if not as_json:
        print(f"started {handle.id} (run {handle.result_run_id})", flush=True)
    if wait:
        app_state(ctx).interrupted_note = f"{handle.id} keeps running (xmc stop {inp.experiment_id} stops it)"
        watcher = Watcher(ctx, client, settings, inp, quiet=quiet)
        doc["result"] = (await watcher.run(handle.id)).model_dump(mode="json")
    return doc


def _result_text(result: Mapping[str, Any]) -> str:
    return (
        f"outcome: {result['outcome']}; {result['replayed']} replayed, {result['remaining']} remaining, "
        f"{result['throttles']} throttle waits, {result['turns']} turns, {result['runs']} run(s), "
        f"fencing token {result['token']}" + (f", {result['set_aside']} set aside" if result.get("set_aside") else "")
    )


@experiment_command(
    cli,
    "set",
    "change a running resumption's threshold, batch, throttle wait, policy or rate cap (the configure Update)",
)
@click.option(
    "--threshold",
    "max_backlog_threshold",
    type=click.INT,
    help=f"max_backlog_threshold ({input_bounds('max_backlog_threshold')})",
)
@click.option("--batch", "batch_size", type=click.INT, help=f"batch_size ({input_bounds('batch_size')})")
@click.option(
    "--throttle-seconds",
    "throttle_seconds",
    type=click.FLOAT,
    help=f"throttle_seconds ({input_bounds('throttle_seconds')})",
)
@click.option(
    "--policy", "throttle_policy", type=click.Choice([p.value for p in ThrottlePolicy]), help="throttle_policy"
)
@click.option(
    "--max-tasks-per-second",
    "max_tasks_per_second",
    type=click.FLOAT,
    help=f"max_tasks_per_second ({input_bounds('max_tasks_per_second')}; 0 removes the cap)",
)
@click.option(
    "--timeout", type=UPDATE_TIMEOUT, default=30.0, show_default=True, help="seconds to wait for a worker to answer"
)
def set_cmd(ctx: click.Context, experiment_id: str, stream: str, as_json: bool, timeout: float, **fields: Any) -> None:
    """Change the settings of a running resumption with one configure Update; prints the
    settings it runs with from now on. Each value is checked against ResumptionInput's bounds
    here, and the whole input again by the workflow's validator (claim_lease_seconds must stay
    longer than every wait), which refuses a bad change without a trace in the history."""
    given = {name: value for name, value in fields.items() if value is not None}
    if not given:
        raise click.UsageError(
            "nothing to change: give --threshold, --batch, --throttle-seconds, --policy or --max-tasks-per-second", ctx
        )
    for name, value in given.items():
        if name == "max_tasks_per_second" and value == 0:
            continue  # removes the cap
        try:
            field_adapter(name).validate_python(value)
        except ValidationError as err:
            msg = err.errors(include_url=False)[0]["msg"]
            raise OperatorError(f"invalid ControlChange: {name}: {msg}") from None
    change = ControlChange.model_validate(given)

    async def go() -> EffectiveSettings:
        settings_of(ctx)
        handle = await running_handle(await connect_temporal(), experiment_id)
        return await _update(handle, Control.CONFIGURE, change, timeout)

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
    """Ask the running resumption to stop: at its next turn it releases the claim, leaves the
    experiment paused and ends with outcome 'paused'; held tasks stay. A throttle wait is cut
    short. xmc resume goes on from where it stopped."""

    async def go() -> dict[str, Any]:
        settings_of(ctx)
        handle = await running_handle(await connect_temporal(), experiment_id)
        effective = await _update(handle, Control.PAUSE, None, timeout)
        doc: dict[str, Any] = {"workflow_id": handle.id, "settings": effective.model_dump(mode="json")}
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


async def _update(handle: WorkflowHandle[Any, Any], name: Control, arg: Any, seconds: float) -> EffectiveSettings:
    """Run Update ``name`` on the running resumption; at most ``seconds``.

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


def _effective_text(workflow_id: str, s: EffectiveSettings) -> str:
    return (
        f"{workflow_id} runs with: threshold {s.max_backlog_threshold}, batch {s.batch_size}, "
        f"throttle {s.throttle_seconds:g}s, policy {s.throttle_policy.value}, "
        f"rate cap {'none' if s.max_tasks_per_second is None else f'{s.max_tasks_per_second:g}/s'}"
        + (", stopping" if s.stopping else "")
    )
