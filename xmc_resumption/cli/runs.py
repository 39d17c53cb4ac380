"""The Temporal-side commands on resumptions: ``list``, ``resume``, ``set`` and ``stop``."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import click
from temporalio.client import (
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from xmc_resumption.cli.common import (
    EXPERIMENT_ID,
    STREAM_NAME,
    UPDATE_TIMEOUT,
    app_state,
    cli,
    emit,
    experiment_command,
    field_option,
    input_options,
    json_option,
    or_missing,
    run_sync,
    settings_of,
    text_table,
)
from xmc_resumption.cli.watch import Watcher
from xmc_resumption.errors import (
    OperatorError,
    RunFailedError,
    one_line,
    update_failure_message,
    workflow_failure_message,
)
from xmc_resumption.ops import (
    MAX_LISTED,
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
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.models import (
    Control,
    ControlChange,
    EffectiveSettings,
    ResumptionInput,
    workflow_id_for,
)


@cli.command("list", short_help="every resumption in Temporal visibility, with its phase and progress")
@click.option("--running", is_flag=True, help="only running resumptions")
@click.option("--phase", type=click.Choice(fleet.phase_values()), help="only this XmcPhase (an outcome once ended)")
@click.option("--experiment", "experiment_id", type=EXPERIMENT_ID, help="only this experiment")
@click.option("--stream", type=STREAM_NAME, help="only resumptions into this stream")
@click.option("--limit", type=click.IntRange(1, MAX_LISTED), default=200, show_default=True, help="most runs listed")
@json_option
@click.pass_context
def list_cmd(
    ctx: click.Context,
    running: bool,
    phase: str | None,
    experiment_id: str | None,
    stream: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Every ResumptionWorkflow run visibility knows (a continue-as-new chain once, by its newest
    run), newest first, from the search attributes XmcExperimentId, XmcPhase, XmcReplayed,
    XmcRemaining and XmcOutcome: no worker needed. The same query works from the Temporal CLI:
    temporal workflow list --query "XmcPhase = 'throttled'"."""
    query = fleet_query(running=running, phase=phase, experiment_id=experiment_id, stream=stream)

    async def go() -> list[dict[str, object]]:
        settings_of(ctx)
        return await list_resumptions(await connect_temporal(), query, limit)

    rows = run_sync(go())
    table = text_table(
        ["WORKFLOW ID", "STATUS", "EXPERIMENT", "PHASE", "REPLAYED", "REMAINING", "OUTCOME", "STARTED"],
        [
            [
                r["workflow_id"],
                r["status"],
                or_missing(r["experiment_id"], "-"),
                or_missing(r["phase"], "-"),
                or_missing(r["replayed"], "-"),
                or_missing(r["remaining"], "-"),
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
def resume(
    ctx: click.Context,
    experiment_id: str,
    stream: str,
    as_json: bool,
    wait: bool,
    quiet: bool,
    force: bool,
    **fields: Any,
) -> None:
    """Start a resumption. Options left out take ResumptionInput's defaults; the whole input is
    validated by the model before anything is read or started (one rule: the workflow's).
    Refused (exit 2) when the experiment is running and holds nothing, or a resumption of it
    already runs. With --wait: progress every second on stderr (a bar on a terminal, a line every
    few seconds otherwise), a warning when no consumer drains the stream or no worker answers;
    exit 1 when the run ends without a result (failed, terminated, cancelled)."""
    given = {name: value for name, value in fields.items() if value is not None}
    inp = ResumptionInput.model_validate({"experiment_id": experiment_id, "stream": stream, **given})
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
    cli, "set", "change a running resumption's threshold, batch, throttle wait or policy (the configure Update)"
)
@field_option("--threshold", "max_backlog_threshold")
@field_option("--batch", "batch_size")
@field_option("--throttle-seconds", "throttle_seconds")
@field_option("--policy", "throttle_policy")
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
        raise click.UsageError("nothing to change: give --threshold, --batch, --throttle-seconds or --policy", ctx)
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
        f"throttle {s.throttle_seconds:g}s, policy {s.throttle_policy.value}" + (", stopping" if s.stopping else "")
    )
