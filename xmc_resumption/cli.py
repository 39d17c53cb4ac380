"""The ``xmc`` command (Click): pause, enqueue, status, dead, resume, list, held, set, stop, demo.

Redis from ``XMC_REDIS_URL``, Temporal from envconfig (``TEMPORAL_ADDRESS``, ...), like the worker.
Every command but ``demo`` takes ``--json``: one JSON document on stdout instead of text, never
both. Progress and warnings go to stderr.

Exit codes:
    0: done (with ``--wait``: the run returned a result, whatever its outcome; the output says it).
    1: ``--wait``: the awaited run ended without a result (failed, terminated, cancelled, timed
       out); one line on stderr names the run and the cause.
    2: an error the operator can mend or a refusal: bad arguments or settings, Redis or Temporal
       unreachable, a key holding garbage, a resumption already running, nothing to resume, a
       change a running resumption rejected. One line on stderr naming the argument, setting,
       key or field, never a secret (``xmc.errors``). ``xmc status`` prints every part it could
       read first, the others marked unknown, and one such line per unknown part.
    130: interrupted (Ctrl-C); 141: stdout was closed (``xmc status E | head``), quietly.
Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import click
from redis.exceptions import RedisError, ResponseError, WatchError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as ProgressBar
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from xmc_resumption.demo import DemoOptions, run_demo
from xmc_resumption.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_OPERATOR_ERROR,
    EXIT_RUN_FAILED,
    MAX_DETAIL_CHARS,
    OperatorError,
    RunFailedError,
    one_line,
    operator_message,
    update_failure_message,
    workflow_failure_message,
)
from xmc_resumption.ops import (
    MAX_LISTED,
    experiment_status,
    fleet_query,
    held_experiments,
    list_resumptions,
    live_run,
    refuse_evicting_redis,
    running_handle,
    start_resumption,
    state_and_held,
)
from xmc_resumption.params import EntryIdType, FiniteFloat, NameType, field_type
from xmc_resumption.redisclient import deadletter, held
from xmc_resumption.redisclient.acl import is_denial
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys, as_text
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.settings import Settings, connect_temporal
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.models import (
    Control,
    ControlChange,
    EffectiveSettings,
    Phase,
    Progress,
    ResumptionInput,
    ResumptionResult,
    ThrottlePolicy,
    workflow_id_for,
)
from xmc_resumption.workflows.resumption import ResumptionWorkflow

T = TypeVar("T")

DESCRIPTION = (
    "Operate xmc-resumption: pause experiments, enqueue tasks, inspect them, start, watch, change "
    "and stop resumptions, list the fleet, run the demo. Redis from XMC_REDIS_URL; Temporal from "
    "TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE / profiles. Exit codes: 0 done, 1 a run awaited with "
    "--wait ended without a result, 2 an operator error or refusal (one line on stderr)."
)

POLL_SECONDS = 1.0
"""``--wait``: how often the progress query is asked (seconds)."""

QUERY_TIMEOUT_SECONDS = 5.0
"""How long one progress query may take before it counts as unanswered (seconds)."""

NO_WORKER_WARNING_SECONDS = 10.0
"""``--wait``: warn when no worker has answered the progress query for this long (seconds)."""

PLAIN_LINE_SECONDS = 5.0
"""``--wait`` when stderr is no terminal: at most one progress line this often (seconds), and one
whenever the phase changes."""

MIN_DRAIN_WARNING_SECONDS = 15.0
"""``--wait``: the least time (seconds) the backlog must sit unchanged at the threshold, nothing
replayed, before the "no consumer is draining" warning; the wait is also at least 2.5 of the
run's longest throttle wait, so a healthy fixed-wait replay never triggers it."""

MAX_TASKS_ENQUEUED = 1_000_000
"""The most synthetic tasks one ``xmc enqueue`` writes."""


@dataclass
class AppState:
    """What the error handler of ``main`` needs from the command that ran."""

    settings: Settings | None = None
    interrupted_note: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _app(ctx: click.Context) -> AppState:
    state = ctx.find_root().obj
    assert isinstance(state, AppState)
    return state


def _settings(ctx: click.Context) -> Settings:
    """The settings, read once; a bad one raises ``ValidationError`` (one line, exit 2)."""
    state = _app(ctx)
    if state.settings is None:
        state.settings = Settings()
    return state.settings


class Interrupted(Exception):
    """Ctrl-C during a command; raised instead of ``KeyboardInterrupt`` so that Click does not
    print a line of its own before ``main``'s one."""


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        raise Interrupted from None


def _emit(as_json: bool, doc: Mapping[str, Any] | Sequence[Any], text: str) -> None:
    """One JSON document or the text on stdout, never both."""
    print(json.dumps(doc, indent=2, default=str) if as_json else text)


def _warn(ctx: click.Context, message: str) -> None:
    print(f"{ctx.command_path}: warning: {one_line(message)}", file=sys.stderr, flush=True)


# --- parameters ---------------------------------------------------------------------------------


EXPERIMENT_ID = NameType("experiment_id")
STREAM_NAME = NameType("stream")
GROUP_NAME = NameType("consumer_group")
"""Consumer group names follow the same rule: not keys, but they reach XINFO, the logs and the UI."""


@dataclass(frozen=True)
class InputOption:
    """A ``resume`` option that sets one ``ResumptionInput`` field: its type, bounds and default
    come from the model (``params.field_type``)."""

    flag: str
    field: str
    help: str
    default_text: str | None = None

    @property
    def type(self) -> click.ParamType:
        """The option's click type: the field's type and bounds."""
        return field_type(ResumptionInput, self.field)


INPUT_OPTIONS = (
    InputOption("--group", "consumer_group", "the consumer group whose backlog throttles the replay"),
    InputOption("--batch", "batch_size", "most tasks one publish moves (entries)"),
    InputOption("--threshold", "max_backlog_threshold", "at or above this backlog the replay waits"),
    InputOption("--throttle-seconds", "throttle_seconds", "one fixed throttle wait (seconds)"),
    InputOption("--policy", "throttle_policy", "fixed waits, or adaptive to the measured drain rate"),
    InputOption("--min-wait", "min_wait_seconds", "shortest adaptive wait (seconds)"),
    InputOption("--max-wait", "max_wait_seconds", "longest adaptive wait (seconds)", "--throttle-seconds"),
    InputOption(
        "--claim-lease-seconds",
        "claim_lease_seconds",
        "the claim's lease (seconds); must exceed --throttle-seconds and --max-wait",
    ),
    InputOption("--redis-retry-seconds", "redis_retry_seconds", "wait after a Redis fault outlasted retries"),
    InputOption(
        "--stall-window-seconds",
        "stall_window_seconds",
        "stalled once the backlog has not gone down for this long (seconds)",
    ),
    InputOption(
        "--max-stall-seconds", "max_stall_seconds", "end the run 'stalled' after a stall this long (seconds)", "never"
    ),
    InputOption(
        "--missing-group",
        "missing_group",
        "a missing consumer group: zero (backlog 0, warning) or error (the run fails)",
    ),
    InputOption("--max-bytes-per-call", "max_bytes_per_call", "byte budget of one Redis script"),
    InputOption("--turns-per-run", "turns_per_run", "continue-as-new after this many turns"),
    InputOption(
        "--max-memory-fraction",
        "max_memory_fraction",
        "wait while Redis's used memory is at or above this share of maxmemory",
    ),
    InputOption(
        "--fair-share/--no-fair-share",
        "fair_share",
        "take at most this experiment's weighted share of the stream's headroom",
    ),
)
"""One option per ``ResumptionInput`` field but the experiment, the stream (every command's) and
``carry`` (the workflow's own); tests/test_cli.py checks that none is missing."""


def _input_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``INPUT_OPTIONS`` to a command, each with the model's default (a default of None, such
    as ``max_wait_seconds``'s, stays None: the model fills it in)."""
    for opt in reversed(INPUT_OPTIONS):
        default = ResumptionInput.model_fields[opt.field].default
        fn = click.option(
            opt.flag,
            opt.field,
            type=opt.type,
            default=getattr(default, "value", default),
            show_default=opt.default_text or True,
            help=f"{opt.field}: {opt.help}",
        )(fn)
    return fn


def _field_option(flag: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An option that sets ``ResumptionInput`` field ``name``: its type and bounds (click shows
    them in the help), no default."""
    return click.option(flag, name, type=field_type(ResumptionInput, name), help=name)


def _experiment_command(group: click.Group, name: str, help_text: str) -> Callable[..., Any]:
    """A command of ``group`` taking EXPERIMENT_ID, ``--stream`` and ``--json``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of text")(fn)
        fn = click.option(
            "--stream", type=STREAM_NAME, default=DEFAULT_STREAM, show_default=True, help="the task stream"
        )(fn)
        fn = click.argument("experiment_id", type=EXPERIMENT_ID)(fn)
        return group.command(name, help=help_text, short_help=help_text.split(";")[0])(click.pass_context(fn))

    return wrap


def _json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of text")(fn)


THRESHOLD_TYPE = field_type(ResumptionInput, "max_backlog_threshold")
"""A backlog threshold on the command line: ``ResumptionInput.max_backlog_threshold``'s bounds."""

UPDATE_TIMEOUT = FiniteFloat(0.1, 3_600)
"""``--timeout`` of the Updates (seconds): below 0.1 s no server round trip fits."""


@click.group(help=DESCRIPTION, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def cli() -> None:
    """The ``xmc`` group; see ``DESCRIPTION``."""


# --- Redis-side commands ----------------------------------------------------------------------------


@_experiment_command(cli, "pause", "pause an experiment: its new tasks are held")
def pause(ctx: click.Context, experiment_id: str, stream: str, as_json: bool) -> None:
    """``xmc pause E``: set the state ``paused`` (``redisclient.held.pause``); producers hold."""

    async def go() -> None:
        redis = _settings(ctx).redis()
        try:
            await held.pause(redis, ExperimentKeys(stream, experiment_id))
        finally:
            await redis.aclose()

    _run(go())
    _emit(
        as_json,
        {"experiment_id": experiment_id, "stream": stream, "state": ExperimentState.PAUSED.value},
        f"experiment {experiment_id} paused: its new tasks are held",
    )


@_experiment_command(cli, "enqueue", "enqueue synthetic tasks through the pause-aware script")
@click.option(
    "--count", type=click.IntRange(1, MAX_TASKS_ENQUEUED), default=100, show_default=True, help="tasks to enqueue"
)
def enqueue(ctx: click.Context, experiment_id: str, stream: str, as_json: bool, count: int) -> None:
    """``xmc enqueue E --count N``: N synthetic tasks through the pause-aware enqueue script."""

    async def go() -> dict[str, int]:
        redis = _settings(ctx).redis()
        keys = ExperimentKeys(stream, experiment_id)
        where: dict[str, int] = {}
        try:
            for i in range(count):
                dest, _ = await held.enqueue_task(redis, keys, {"task": f"{experiment_id}:{i:06d}", "n": i})
                where[dest] = where.get(dest, 0) + 1
        finally:
            await redis.aclose()
        return where

    where = _run(go())
    text = f"enqueued {count} tasks of {experiment_id}: " + ", ".join(f"{n} to {dest}" for dest, n in where.items())
    _emit(as_json, {"experiment_id": experiment_id, "enqueued": where}, text)


@_experiment_command(
    cli,
    "status",
    "state, held tasks, claim, fencing token and backlog in Redis; and the resumption in Temporal, if any",
)
@click.option("--group", type=GROUP_NAME, default=DEFAULT_GROUP, show_default=True, help="the consumer group")
@click.option(
    "--threshold",
    type=THRESHOLD_TYPE,
    default=ResumptionInput.model_fields["max_backlog_threshold"].default,
    show_default=True,
    help="count the backlog up to this many entries",
)
def status(ctx: click.Context, experiment_id: str, stream: str, as_json: bool, group: str, threshold: int) -> None:
    """``xmc status E``: ``ops.experiment_status`` from Redis, and ``ops.live_run`` from Temporal
    when it can be reached (else ``run`` holds the one-line reason)."""

    async def go() -> dict[str, object]:
        redis = _settings(ctx).redis()
        try:
            doc = await experiment_status(redis, ExperimentKeys(stream, experiment_id), group, threshold)
        finally:
            await redis.aclose()
        try:
            client = await connect_temporal()
            doc["run"] = await live_run(client, experiment_id, QUERY_TIMEOUT_SECONDS / 2)
        except Exception as err:  # the Redis part stands; say why the Temporal part is missing
            message = operator_message(err, _app(ctx).settings)
            if message is None:
                raise
            doc["run"] = {"error": message}
        return doc

    doc = _run(go())
    _emit(as_json, doc, _status_text(doc))
    unknown: Mapping[str, str] = doc.get("unknown") or {}  # type: ignore[assignment]
    for reason in unknown.values():
        print(f"{ctx.command_path}: {one_line(reason, limit=2 * MAX_DETAIL_CHARS)}", file=sys.stderr)
    if unknown:
        ctx.exit(EXIT_OPERATOR_ERROR)


def _status_text(doc: Mapping[str, Any]) -> str:
    """``xmc status`` as text: one fact a line; a part that could not be read says ``unknown`` and
    why (``ops.experiment_status``); keys it does not know are printed as they are."""
    e, s = doc["experiment_id"], doc["stream"]
    unknown: Mapping[str, str] = doc.get("unknown") or {}

    def why(*parts: str) -> str:
        return "unknown (" + "; ".join(unknown[p] for p in parts if p in unknown) + ")"

    if doc["exists"] is False:
        lines = [f"{e} on {s}: unknown: no key of this experiment in Redis (never paused here: a typo, or --stream?)"]
    else:
        state = doc["state"] if "state" not in unknown else why("state")
        lines = [f"{e} on {s}: {state}" + (" (orphaned: resuming, no live claim)" if doc["orphaned"] else "")]
        held_text = f"{doc['held']} tasks" if "state" not in unknown else why("state")
        dead = doc["set_aside"] if "set_aside" not in unknown else why("set_aside")
        lines.append(f"  held: {held_text}; set aside: {dead}")
    claim = doc["claim"]
    if "claim" in unknown:
        lines.append(f"  claim: {why('claim')}")
    elif claim:
        lease = int(claim.get("lease_ms", "0")) / 1000
        lines.append(f"  claim: token {claim.get('token')} owned by {claim.get('owner')}, lease {lease:.0f}s left")
    elif doc["exists"] is not False:
        lines.append("  claim: none")
    lines.append(f"  fencing token: {doc['fence'] if 'fence' not in unknown else why('fence')}")
    b = doc["backlog"]
    if b is None:
        lines.append(f"  backlog: {why('backlog')}")
    else:
        lag = f"{b['lag']}{'+' if b['capped'] else ''}"
        side = "at or over" if b["pending"] + b["lag"] >= b["threshold"] else "under"
        group = "" if b["status"] == "ok" else f"; consumer group: {b['status']}"
        lines.append(
            f"  backlog of {b['group']}: {b['pending']} pending + {lag} undelivered, {side} "
            f"{b['threshold']} (counted up to --threshold){group}"
        )
    memory = doc.get("redis_memory")
    if memory:
        limit = f"of {memory['maxmemory']:,} bytes" if memory["maxmemory"] else "(no maxmemory)"
        lines.append(
            f"  redis memory: {memory['used_memory']:,} bytes used {limit}, maxmemory-policy {memory['policy']}"
            + (f": {memory['problem']}" if memory["problem"] else "")
        )
    elif "redis_memory" in unknown:
        lines.append(f"  redis memory: {why('redis_memory')}")
    lines.append("  " + _run_text(doc.get("run")))
    known = {"experiment_id", "stream", "exists", "state", "orphaned", "held", "set_aside", "claim", "fence"}
    shown = known | {"backlog", "run", "redis_memory", "unknown"}
    lines += [f"  {k}: {v}" for k, v in doc.items() if k not in shown]
    return "\n".join(lines)


def _run_text(run: Mapping[str, Any] | None) -> str:
    if run is None:
        return "resumption: none in Temporal"
    if "error" in run:
        return f"resumption: unknown ({run['error']})"
    text = f"resumption: {run['workflow_id']} {run['status']} (run {run['run_id']})"
    progress = run.get("progress")
    if progress:
        text += (
            f": {progress['phase']}, replayed {progress['replayed']}, remaining {_or(progress['remaining'])}, "
            f"backlog {_or(progress['backlog'])}/{progress['threshold']}"
            + (
                f", STALLED {progress['stalled_seconds']:.0f}s: {progress['stall_reason']}"
                if progress["stalled"]
                else ""
            )
        )
    else:
        text += f": phase {_or(run['phase'])}, replayed {_or(run['replayed'])}, remaining {_or(run['remaining'])}"
        text += f", outcome {run['outcome']}" if run.get("outcome") else ""
        text += f" ({run['progress_error']})" if run.get("progress_error") else ""
    return text


def _or(value: object, missing: str = "?") -> str:
    return missing if value is None else str(value)


@_experiment_command(cli, "dead", "list the tasks set aside (too many fields to move by script), or retry or drop one")
@click.option(
    "--retry", metavar="ID", type=EntryIdType(), help="put it back: held if the experiment holds tasks, else the stream"
)
@click.option("--drop", metavar="ID", type=EntryIdType(), help="delete it")
def dead(
    ctx: click.Context, experiment_id: str, stream: str, as_json: bool, retry: str | None, drop: str | None
) -> None:
    """``xmc dead E``: list the set-aside tasks, or ``--retry`` / ``--drop`` one (``redisclient.deadletter``)."""
    if retry and drop:
        raise click.UsageError("--retry and --drop exclude each other", ctx)
    keys = ExperimentKeys(stream, experiment_id)

    async def go() -> dict[str, Any]:
        redis = _settings(ctx).redis()
        try:
            if not (retry or drop):
                rows = await deadletter.dead_letters(redis, keys)
                return {"key": keys.dead, "tasks": [{"id": i, "fields": f, "bytes": b} for i, f, b in rows]}
            entry_id = retry or drop
            assert entry_id is not None
            where: str | bool | None = (
                await deadletter.retry(redis, keys, entry_id) if retry else await deadletter.drop(redis, keys, entry_id)
            )
            if not where:
                raise OperatorError(f"no set-aside task {entry_id} in {keys.dead}")
            return {"entry_id": entry_id, "retried_to" if retry else "dropped": where}
        except WatchError as err:
            raise OperatorError(f"{keys.dead} or the experiment changed meanwhile; nothing moved: try again") from err
        except ResponseError as err:
            if is_denial(err):
                raise  # an ACL refusal: operator_message names the user and the command
            # a WRONGTYPE names the key (redisclient.scripts.naming_wrong_type)
            raise OperatorError(f"nothing moved: {err}" if retry or drop else str(err)) from err
        finally:
            await redis.aclose()

    doc = _run(go())
    if "tasks" in doc:
        text = "\n".join(
            [f"{len(doc['tasks'])} tasks set aside in {doc['key']}"]
            + [f"  {t['id']}: {t['fields']} fields, {t['bytes']} bytes" for t in doc["tasks"]]
        )
    elif "retried_to" in doc:
        text = f"{doc['entry_id']} put back into {doc['retried_to']}"
    else:
        text = f"{doc['entry_id']} dropped from {doc['dropped']}"
    _emit(as_json, doc, text)


@cli.command("held", short_help="experiments paused or orphaned in Redis, with their held tasks")
@click.option("--stream", type=STREAM_NAME, default=DEFAULT_STREAM, show_default=True, help="the task stream")
@click.option("--orphaned", is_flag=True, help="only orphaned experiments (resuming, no live claim)")
@click.option("--limit", type=click.IntRange(1, MAX_LISTED), default=1_000, show_default=True, help="most experiments")
@_json_option
@click.pass_context
def held_cmd(ctx: click.Context, stream: str, orphaned: bool, limit: int, as_json: bool) -> None:
    """Every experiment on the stream that Redis holds something for: paused, orphaned (resuming
    with no live claim: start a resumption again), resuming (a replay holds the claim), unknown
    (a state value the contract does not know), stranded (tasks held but no state key), bad_keys.
    Found by SCAN (never KEYS), so it is safe on a busy Redis."""

    async def go() -> tuple[list[dict[str, object]], bool]:
        redis = _settings(ctx).redis()
        try:
            return await held_experiments(redis, stream, limit)
        finally:
            await redis.aclose()

    rows, truncated = _run(go())
    if orphaned:
        rows = [r for r in rows if r["condition"] == "orphaned"]
    table = _table(
        ["EXPERIMENT", "CONDITION", "STATE", "HELD", "CLAIM"],
        [
            [
                r["experiment_id"],
                r["condition"],
                _or(r["state"]),
                _or(r["held"]),
                r.get("error") or _claim_text(r["claim"]),  # type: ignore[arg-type]
            ]
            for r in rows
        ],
    )
    more = f"\n(more than {limit} experiments: --limit)" if truncated else ""
    text = (table if rows else f"no experiment on {stream} is paused, resuming or holding tasks") + more
    _emit(as_json, {"stream": stream, "experiments": rows, "truncated": truncated}, text)


def _claim_text(claim: Mapping[str, str]) -> str:
    if not claim:
        return "-"
    return f"token {claim.get('token')} by {claim.get('owner')}, {int(claim.get('lease_ms', '0')) / 1000:.0f}s left"


def _table(header: list[str], rows: list[list[object]]) -> str:
    """Rows as plain columns, left-aligned (no terminal width games: scripts use ``--json``)."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


# --- Temporal-side commands -------------------------------------------------------------------------


@cli.command("list", short_help="every resumption in Temporal visibility, with its phase and progress")
@click.option("--running", is_flag=True, help="only running resumptions")
@click.option("--phase", type=click.Choice(fleet.phase_values()), help="only this XmcPhase (an outcome once ended)")
@click.option("--experiment", "experiment_id", type=EXPERIMENT_ID, help="only this experiment")
@click.option("--stream", type=STREAM_NAME, help="only resumptions into this stream")
@click.option("--limit", type=click.IntRange(1, MAX_LISTED), default=200, show_default=True, help="most runs listed")
@_json_option
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
        _settings(ctx)
        return await list_resumptions(await connect_temporal(), query, limit)

    rows = _run(go())
    table = _table(
        ["WORKFLOW ID", "STATUS", "EXPERIMENT", "PHASE", "REPLAYED", "REMAINING", "OUTCOME", "STARTED"],
        [
            [
                r["workflow_id"],
                r["status"],
                _or(r["experiment_id"], "-"),
                _or(r["phase"], "-"),
                _or(r["replayed"], "-"),
                _or(r["remaining"], "-"),
                _or(r["outcome"], "-"),
                _or(r["start_time"], "-"),
            ]
            for r in rows
        ],
    )
    _emit(as_json, {"query": query, "resumptions": rows}, table if rows else f"no resumption matches {query}")


@_experiment_command(
    cli, "resume", "start ResumptionWorkflow for the experiment (ID resumption-<E>); --wait shows its progress"
)
@_input_options
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
    doc = _run(_resume(ctx, inp, wait=wait, quiet=quiet or as_json, force=force, as_json=as_json))
    if not as_json and doc.get("result"):
        print(_result_text(doc["result"]))
    elif as_json:
        _emit(True, doc, "")


async def _resume(
    ctx: click.Context, inp: ResumptionInput, *, wait: bool, quiet: bool, force: bool, as_json: bool
) -> dict[str, Any]:
    settings = _settings(ctx)
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
        _app(ctx).interrupted_note = f"{handle.id} keeps running (xmc stop {inp.experiment_id} stops it)"
        watcher = Watcher(ctx, client, settings, inp, quiet=quiet)
        doc["result"] = (await watcher.run(handle.id)).model_dump(mode="json")
    return doc


def _result_text(result: Mapping[str, Any]) -> str:
    return (
        f"outcome: {result['outcome']}; {result['replayed']} replayed, {result['remaining']} remaining, "
        f"{result['throttles']} throttle waits, {result['turns']} turns, {result['runs']} run(s), "
        f"fencing token {result['token']}" + (f", {result['set_aside']} set aside" if result.get("set_aside") else "")
    )


@_experiment_command(
    cli, "set", "change a running resumption's threshold, batch, throttle wait or policy (the configure Update)"
)
@_field_option("--threshold", "max_backlog_threshold")
@_field_option("--batch", "batch_size")
@_field_option("--throttle-seconds", "throttle_seconds")
@_field_option("--policy", "throttle_policy")
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
        _settings(ctx)
        handle = await running_handle(await connect_temporal(), experiment_id)
        return await _update(handle, Control.CONFIGURE, change, timeout)

    effective = _run(go())
    _emit(as_json, effective.model_dump(mode="json"), _effective_text(workflow_id_for(experiment_id), effective))


@_experiment_command(
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
        _settings(ctx)
        handle = await running_handle(await connect_temporal(), experiment_id)
        effective = await _update(handle, Control.PAUSE, None, timeout)
        doc: dict[str, Any] = {"workflow_id": handle.id, "settings": effective.model_dump(mode="json")}
        if wait:
            try:
                doc["result"] = (await handle.result()).model_dump(mode="json")
            except WorkflowFailureError as err:
                raise RunFailedError(workflow_failure_message(err, handle.id)) from err
        return doc

    doc = _run(go())
    text = f"{doc['workflow_id']} is stopping: it ends 'paused' at its next turn"
    if "result" in doc:
        text = f"{doc['workflow_id']} stopped\n{_result_text(doc['result'])}"
    _emit(as_json, doc, text)


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


# --- --wait: progress and the warnings --------------------------------------------------------------


class Watcher:
    """Follows a running resumption until it ends: asks ``progress`` every ``POLL_SECONDS``,
    shows it on stderr (a rich progress bar on a terminal, plain lines otherwise; nothing when
    ``quiet``) and warns once, on stderr, when no consumer drains the stream (the workflow says
    ``stalled``; the group has no consumer while the replay is throttled; or the backlog sat at
    the threshold, nothing replayed, for ``drain_warning_seconds``) and once when no worker
    answers the query for ``NO_WORKER_WARNING_SECONDS``. It never waits silently."""

    def __init__(self, ctx: click.Context, client: Client, settings: Settings, inp: ResumptionInput, *, quiet: bool):
        self._ctx, self._client, self._settings, self._inp, self._quiet = ctx, client, settings, inp, quiet
        self.drain_warning_seconds = max(MIN_DRAIN_WARNING_SECONDS, 2.5 * inp.longest_wait_seconds)
        self._console = Console(stderr=True)
        self._bar: ProgressBar | None = None
        self._task: TaskID | None = None
        self._warned: set[str] = set()
        self._last_line = 0.0
        self._last_phase: Phase | None = None
        self._still: tuple[int, int | None] | None = None
        self._still_since = time.monotonic()

    async def run(self, workflow_id: str) -> ResumptionResult:
        """Follow ``workflow_id`` (its newest run) to its end; returns its result.

        Raises:
            RunFailedError: the run ended without a result.
        """
        handle = self._client.get_workflow_handle(workflow_id, result_type=ResumptionResult)
        result = asyncio.ensure_future(handle.result())
        redis = self._settings.redis()
        if not self._quiet and self._console.is_terminal:
            self._bar = ProgressBar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=self._console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(workflow_id, total=None, detail="starting")
        answered = time.monotonic()
        try:
            while not (await asyncio.wait({result}, timeout=POLL_SECONDS))[0]:
                progress = await self._ask(handle)
                if progress is None:
                    if time.monotonic() - answered > NO_WORKER_WARNING_SECONDS:
                        self._warn_once(
                            "worker",
                            f"no worker has answered {workflow_id}'s progress query for "
                            f"{NO_WORKER_WARNING_SECONDS:g}s: is a worker polling task queue "
                            f"{self._settings.task_queue}?",
                        )
                    continue
                answered = time.monotonic()
                self._show(workflow_id, progress)
                reason = await self._not_draining(redis, progress)
                if reason:
                    self._warn_once("drain", reason + f"; start consumers, or xmc stop {self._inp.experiment_id}")
            try:
                return result.result()
            except WorkflowFailureError as err:
                raise RunFailedError(workflow_failure_message(err, workflow_id)) from err
        finally:
            result.cancel()
            if self._bar is not None:
                self._bar.stop()
            await redis.aclose()

    async def _ask(self, handle: WorkflowHandle[Any, Any]) -> Progress | None:
        """The progress, or None when the run has not answered (no worker, or not ready yet)."""
        try:
            progress: Progress = await asyncio.wait_for(
                handle.query(ResumptionWorkflow.progress), QUERY_TIMEOUT_SECONDS
            )
            return progress
        except (TimeoutError, RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError):
            return None  # no worker, not ready yet, or the run is ending: the loop sees its end

    def _show(self, workflow_id: str, p: Progress) -> None:
        total = p.replayed + p.remaining if p.remaining is not None else None
        backlog = f"backlog {_or(p.backlog)}/{p.threshold}"
        detail = f"{p.phase.value}, {backlog}" + (", STALLED" if p.stalled else "")
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=p.replayed, total=total, detail=detail)
            return
        now = time.monotonic()
        if self._quiet or (p.phase is self._last_phase and now - self._last_line < PLAIN_LINE_SECONDS):
            return
        self._last_phase, self._last_line = p.phase, now
        print(
            f"{workflow_id}: {p.phase.value}: {p.replayed}/{_or(total)} replayed, remaining {_or(p.remaining)}, "
            f"{backlog}" + (", STALLED" if p.stalled else ""),
            file=sys.stderr,
            flush=True,
        )

    async def _not_draining(self, redis: RedisClient, p: Progress) -> str | None:
        """Why no consumer seems to drain the stream, or None."""
        group, stream = self._inp.consumer_group, self._inp.stream
        if p.stalled:
            return f"no consumer is draining {group}: {p.stall_reason} (stalled for {p.stalled_seconds:.0f}s)"
        still = (p.replayed, p.backlog)
        if still != self._still:
            self._still, self._still_since = still, time.monotonic()
        if p.phase not in (Phase.THROTTLED, Phase.STALLED):
            return None
        try:
            groups = await redis.xinfo_groups(stream)
        except RedisError:
            groups = None  # a missing stream, or Redis away: the workflow reports that itself
        consumers = next((int(g["consumers"]) for g in groups or [] if as_text(g["name"]) == group), None)
        if consumers == 0:
            return (
                f"no consumer in group {group} of {stream}: the backlog ({_or(p.backlog)}) stays at the "
                f"threshold ({p.threshold}) until one reads"
            )
        idle = time.monotonic() - self._still_since
        if idle >= self.drain_warning_seconds:
            return (
                f"no consumer seems to drain {group}: backlog {_or(p.backlog)} >= threshold {p.threshold}, "
                f"nothing replayed for {idle:.0f}s ({_or(consumers)} consumers registered)"
            )
        return None

    def _warn_once(self, kind: str, message: str) -> None:
        if kind in self._warned:
            return
        self._warned.add(kind)
        line = f"{self._ctx.command_path}: warning: {one_line(message)}"
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=sys.stderr, flush=True)


# --- the demo ---------------------------------------------------------------------------------------


@cli.command("demo", short_help="replay held tasks end to end on local services")
@click.option(
    "--tasks", type=click.IntRange(1, 10_000_000), default=5_000, show_default=True, help="tasks to hold and replay"
)
@click.option(
    "--rate",
    type=FiniteFloat(0, 1e6, min_open=True),
    default=400.0,
    show_default=True,
    help="consumer rate, tasks per second in all",
)
@click.option("--consumers", type=click.IntRange(1, 1_000), default=4, show_default=True, help="consumers in the group")
@click.option(
    "--threshold",
    type=field_type(ResumptionInput, "max_backlog_threshold"),
    default=DemoOptions.threshold,
    show_default=True,
    help="max_backlog_threshold, entries",
)
@click.option(
    "--batch",
    type=field_type(ResumptionInput, "batch_size"),
    default=DemoOptions.batch,
    show_default=True,
    help="most tasks one publish moves",
)
@click.option(
    "--throttle-seconds",
    type=field_type(ResumptionInput, "throttle_seconds"),
    default=DemoOptions.throttle_seconds,
    show_default=True,
    help="one throttle wait, seconds",
)
@click.option(
    "--policy",
    type=field_type(ResumptionInput, "throttle_policy"),
    default=ThrottlePolicy.FIXED.value,
    show_default=True,
    help="throttle_policy",
)
@click.option(
    "--linger",
    type=FiniteFloat(0, 86_400),
    default=0.0,
    show_default=True,
    help="seconds to keep the services up at the end (Ctrl-C ends it early)",
)
@click.pass_context
def demo(ctx: click.Context, **opts: Any) -> None:
    """Replay held tasks end to end; starts redis-server and a Temporal dev server unless
    XMC_REDIS_URL / TEMPORAL_ADDRESS are set. Prints its own report (no --json)."""
    options = DemoOptions(**opts)
    options.resumption_input("demo")  # a knob the workflow would refuse fails here, before any service starts
    _settings(ctx)
    code = _run(run_demo(options))
    ctx.exit(code)


# --- entry point ------------------------------------------------------------------------------------


def _command_path(err: click.ClickException, args: Sequence[str]) -> str:
    """The command an error is about: its context's, else (click raises some parse errors, such
    as a value given to a flag, without one) the command named in ``args``, else ``xmc``."""
    ctx = getattr(err, "ctx", None)
    if ctx is not None:
        return str(ctx.command_path)
    named = next((a for a in args if not a.startswith("-")), None)
    return f"xmc {named}" if named in cli.commands else "xmc"


def main(argv: list[str] | None = None) -> int:
    """Run the ``xmc`` command; returns its exit code (see the module docstring)."""
    state = AppState()
    args = sys.argv[1:] if argv is None else argv
    name = "xmc " + next((a for a in args if not a.startswith("-")), "")
    try:
        code = cli.main(args=args, prog_name="xmc", standalone_mode=False, obj=state)
        sys.stdout.flush()  # a closed pipe fails here, inside the handler, not at interpreter exit
        return code if isinstance(code, int) else 0
    except click.exceptions.NoArgsIsHelpError as err:
        err.show()
        return EXIT_OPERATOR_ERROR
    except click.ClickException as err:
        where = _command_path(err, args)
        print(f"{where}: error: {one_line(err.format_message())} (see {where} --help)", file=sys.stderr)
        return EXIT_OPERATOR_ERROR
    except BrokenPipeError:
        # the reader went away (xmc status E | head): say nothing; point stdout at /dev/null so the
        # interpreter's last flush does not fail again (Python docs, "Note on SIGPIPE")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (KeyboardInterrupt, click.Abort, Interrupted):
        note = f"; {state.interrupted_note}" if state.interrupted_note else ""
        print(f"{name.strip()}: interrupted{note}", file=sys.stderr)
        return 130
    except Exception as err:
        message = operator_message(err, state.settings)
        if message is None:
            raise  # a bug: keep its traceback
        print(f"{name.strip()}: {message}", file=sys.stderr)
        return EXIT_RUN_FAILED if isinstance(err, RunFailedError) else EXIT_OPERATOR_ERROR
    finally:
        gc.collect()  # sdk-python#300: avoids an abort at interpreter exit (docs/development.md, "Temporal facts")
