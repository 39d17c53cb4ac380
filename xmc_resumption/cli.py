"""The ``xmc`` command (Click): pause, enqueue, status, dead, plan, resume, list, held, set, rate, stop, demo.

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
       key or field, never a secret (``xmc.errors``).
    130: interrupted (Ctrl-C); 141: stdout was closed (``xmc status E | head``), quietly.
Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeVar

import annotated_types
import click
from pydantic import TypeAdapter, ValidationError
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
    OperatorError,
    RunFailedError,
    one_line,
    operator_message,
    update_failure_message,
    workflow_failure_message,
)
from xmc_resumption.ops import (
    MAX_LISTED,
    add_etas,
    experiment_status,
    fleet_phases,
    fleet_query,
    held_experiments,
    list_resumptions,
    live_run,
    refuse_evicting_redis,
    running_handle,
    start_resumption,
    state_and_held,
)
from xmc_resumption.plan import DEFAULT_SAMPLE_SECONDS, MAX_SAMPLE_SECONDS, Plan, plan
from xmc_resumption.redisclient import deadletter, held, ratecap
from xmc_resumption.redisclient.acl import is_denial
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys, as_text, validate_name
from xmc_resumption.redisclient.results import ExperimentState, MissingGroupPolicy
from xmc_resumption.settings import Settings, connect_temporal
from xmc_resumption.workflows.models import (
    Control,
    ControlChange,
    EffectiveSettings,
    Phase,
    Progress,
    ResumptionInput,
    ResumptionResult,
    ThrottlePolicy,
    duration_text,
    workflow_id_for,
)
from xmc_resumption.workflows.resumption import ResumptionWorkflow

T = TypeVar("T")

DESCRIPTION = (
    "Operate xmc-resumption: pause experiments, enqueue tasks, inspect them, plan, start, watch, change "
    "and stop resumptions, cap a stream's rate, list the fleet, run the demo. Redis from XMC_REDIS_URL; Temporal from "
    "TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE / profiles. Exit codes: 0 done, 1 a run awaited with "
    "--wait ended without a result, 2 an operator error or refusal (one line on stderr)."
)

POLL_SECONDS = 1.0
"""``--wait``: how often the progress query is asked (seconds)."""

QUERY_TIMEOUT_SECONDS = 5.0
"""How long one progress query may take before it counts as unanswered (seconds)."""

ETA_QUERIES = 50
"""``xmc list``: the most running resumptions whose progress query is asked for the ETA (the
newest first); the others show '-'. The queries run together, all within ``QUERY_TIMEOUT_SECONDS``."""

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


class NameType(click.ParamType):
    """A name that becomes part of a key (an experiment ID, a stream): ``validate_name``'s rule."""

    name = "name"

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return validate_name(self.what, str(value))
        except ValueError as err:
            self.fail(str(err), param, ctx)


class EntryIdType(click.ParamType):
    """A stream entry ID, ``<ms>-<seq>``."""

    name = "entry-id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if not re.fullmatch(r"\d+-\d+", str(value)):
            self.fail(f"not a stream entry ID (<ms>-<seq>): {str(value)[:40]!r}", param, ctx)
        return str(value)


EXPERIMENT_ID = NameType("experiment_id")
STREAM_NAME = NameType("stream")
GROUP_NAME = NameType("consumer_group")
"""Consumer group names follow the same rule: not keys, but they reach XINFO, the logs and the UI."""


def _bounds(name: str) -> str:
    """The bounds ``ResumptionInput`` puts on field ``name``, for help texts (``>= 1, <= 10000``)."""
    parts = []
    for m in ResumptionInput.model_fields[name].metadata:
        for kind, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            bound = getattr(m, kind, None)
            if isinstance(m, annotated_types.BaseMetadata) and bound is not None:
                parts.append(f"{sign} {bound:g}")
    return ", ".join(parts)


def _field_adapter(name: str) -> TypeAdapter[Any]:
    """``ResumptionInput``'s rule for one field (type and bounds), to check a value alone."""
    info = ResumptionInput.model_fields[name]
    return TypeAdapter(Annotated[info.annotation, *info.metadata])  # type: ignore[arg-type,name-defined]


@dataclass(frozen=True)
class InputOption:
    """A ``resume`` option that sets one ``ResumptionInput`` field (its default, bounds and rule
    come from the model)."""

    flag: str
    field: str
    type: click.ParamType
    help: str
    default_text: str | None = None


INPUT_OPTIONS = (
    InputOption("--group", "consumer_group", click.STRING, "the consumer group whose backlog throttles the replay"),
    InputOption("--batch", "batch_size", click.INT, "most tasks one publish moves (entries)"),
    InputOption("--threshold", "max_backlog_threshold", click.INT, "at or above this backlog the replay waits"),
    InputOption("--throttle-seconds", "throttle_seconds", click.FLOAT, "one fixed throttle wait (seconds)"),
    InputOption(
        "--policy",
        "throttle_policy",
        click.Choice([p.value for p in ThrottlePolicy]),
        "fixed waits, or adaptive to the measured drain rate",
    ),
    InputOption("--min-wait", "min_wait_seconds", click.FLOAT, "shortest adaptive wait (seconds)"),
    InputOption("--max-wait", "max_wait_seconds", click.FLOAT, "longest adaptive wait (seconds)", "--throttle-seconds"),
    InputOption(
        "--claim-lease-seconds",
        "claim_lease_seconds",
        click.FLOAT,
        "the claim's lease (seconds); must exceed --throttle-seconds and --max-wait",
    ),
    InputOption(
        "--redis-retry-seconds", "redis_retry_seconds", click.FLOAT, "wait after a Redis fault outlasted retries"
    ),
    InputOption(
        "--stall-window-seconds",
        "stall_window_seconds",
        click.FLOAT,
        "stalled once the backlog has not gone down for this long (seconds)",
    ),
    InputOption(
        "--max-stall-seconds",
        "max_stall_seconds",
        click.FLOAT,
        "end the run 'stalled' after a stall this long (seconds)",
        "never",
    ),
    InputOption(
        "--missing-group",
        "missing_group",
        click.Choice([p.value for p in MissingGroupPolicy]),
        "a missing consumer group: zero (backlog 0, warning) or error (the run fails)",
    ),
    InputOption("--max-bytes-per-call", "max_bytes_per_call", click.INT, "byte budget of one Redis script"),
    InputOption("--turns-per-run", "turns_per_run", click.INT, "continue-as-new after this many turns"),
    InputOption(
        "--max-memory-fraction",
        "max_memory_fraction",
        click.FLOAT,
        "wait while Redis's used memory is at or above this share of maxmemory",
    ),
    InputOption(
        "--fair-share/--no-fair-share",
        "fair_share",
        click.BOOL,
        "take at most this experiment's weighted share of the stream's headroom",
    ),
    InputOption(
        "--max-tasks-per-second",
        "max_tasks_per_second",
        click.FLOAT,
        "this replay's rate cap, tasks per second (xmc rate sets the stream's)",
        "none",
    ),
)
"""One option per ``ResumptionInput`` field but the experiment, the stream (every command's) and
``carry`` (the workflow's own); tests/test_cli.py checks that none is missing."""


def _input_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``INPUT_OPTIONS`` to a command, each with the model's default (a default of None, such
    as ``max_wait_seconds``'s, stays None: the model fills it in)."""
    for opt in reversed(INPUT_OPTIONS):
        bounds = _bounds(opt.field)
        default = ResumptionInput.model_fields[opt.field].default
        fn = click.option(
            opt.flag,
            opt.field,
            type=opt.type,
            default=getattr(default, "value", default),
            show_default=opt.default_text or True,
            help=f"{opt.field}: {opt.help}" + (f" ({bounds})" if bounds else ""),
        )(fn)
    return fn


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


def _sample_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--sample-seconds",
        type=click.FloatRange(0, MAX_SAMPLE_SECONDS),
        default=DEFAULT_SAMPLE_SECONDS,
        show_default=True,
        help="plan: sample the consumer groups' drain this long (seconds; 0: no sample, no estimate)",
    )(fn)


def _int_range(name: str) -> click.IntRange:
    """A click range with the ``ge``/``le`` bounds ``ResumptionInput`` puts on integer field ``name``."""
    metadata = ResumptionInput.model_fields[name].metadata
    low = next((m.ge for m in metadata if isinstance(m, annotated_types.Ge)), None)
    high = next((m.le for m in metadata if isinstance(m, annotated_types.Le)), None)
    return click.IntRange(low, high)  # type: ignore[arg-type]


THRESHOLD_TYPE = _int_range("max_backlog_threshold")
"""A backlog threshold on the command line: ``ResumptionInput.max_backlog_threshold``'s bounds."""

UPDATE_TIMEOUT = click.FloatRange(0, 3_600, min_open=True)


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


def _status_text(doc: Mapping[str, Any]) -> str:
    """``xmc status`` as text: one fact a line; keys it does not know are printed as they are."""
    e, s = doc["experiment_id"], doc["stream"]
    if not doc["exists"]:
        lines = [f"{e} on {s}: unknown: no key of this experiment in Redis (never paused here: a typo, or --stream?)"]
    else:
        lines = [f"{e} on {s}: {doc['state']}" + (" (orphaned: resuming, no live claim)" if doc["orphaned"] else "")]
        lines.append(f"  held: {doc['held']} tasks; set aside: {doc['set_aside']}")
    claim = doc["claim"]
    if claim:
        lease = int(claim.get("lease_ms", "0")) / 1000
        lines.append(f"  claim: token {claim.get('token')} owned by {claim.get('owner')}, lease {lease:.0f}s left")
    elif doc["exists"]:
        lines.append("  claim: none")
    lines.append(f"  fencing token: {doc['fence']}")
    b = doc["backlog"]
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
    lines.append("  " + _run_text(doc.get("run")))
    known = {"experiment_id", "stream", "exists", "state", "orphaned", "held", "set_aside", "claim", "fence"}
    lines += [f"  {k}: {v}" for k, v in doc.items() if k not in known | {"backlog", "run", "redis_memory"}]
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
            f"backlog {_or(progress['backlog'])}/{progress['threshold']}, "
            f"ETA {_eta_text(progress.get('eta_seconds'), progress.get('eta_at'))}"
            + (
                f", STALLED {progress['stalled_seconds']:.0f}s: {progress['stall_reason']}"
                if progress["stalled"]
                else ""
            )
            + (f", RATE LIMITED: {progress['rate_reason']}" if progress["phase"] == Phase.RATE_LIMITED.value else "")
        )
    else:
        text += f": phase {_or(run['phase'])}, replayed {_or(run['replayed'])}, remaining {_or(run['remaining'])}"
        text += f", outcome {run['outcome']}" if run.get("outcome") else ""
        text += f" ({run['progress_error']})" if run.get("progress_error") else ""
    return text


def _or(value: object, missing: str = "?") -> str:
    return missing if value is None else str(value)


def _eta_text(eta_seconds: float | None, eta_at: str | datetime | None) -> str:
    """An ETA for people, counted from now on this machine's clock: ``~3m 07s (at 12:34:56Z)``,
    ``0s`` when nothing is left, ``-`` while it cannot be estimated."""
    if eta_seconds is None or eta_at is None:
        return "-"
    if eta_seconds == 0:
        return "0s"
    at = eta_at if isinstance(eta_at, datetime) else datetime.fromisoformat(eta_at)
    left = (at - datetime.now(UTC)).total_seconds()
    return f"~{duration_text(max(0.0, left))} (at {at.astimezone(UTC).strftime('%H:%M:%SZ')})"


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
            raise OperatorError(f"nothing moved: {err}") from err
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
@_json_option
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
        _settings(ctx)
        client = await connect_temporal()
        rows = await list_resumptions(client, query, limit)
        if eta:
            await add_etas(client, rows, ETA_QUERIES, QUERY_TIMEOUT_SECONDS)
        return rows

    rows = _run(go())
    table = _table(
        ["WORKFLOW ID", "STATUS", "EXPERIMENT", "PHASE", "REPLAYED", "REMAINING", "ETA", "OUTCOME", "STARTED"],
        [
            [
                r["workflow_id"],
                r["status"],
                _or(r["experiment_id"], "-"),
                _or(r["phase"], "-"),
                _or(r["replayed"], "-"),
                _or(r["remaining"], "-"),
                _eta_text(r.get("eta_seconds"), r.get("eta_at")).split(" (at")[0],  # type: ignore[arg-type]
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
@click.option("--dry-run", is_flag=True, help="start nothing: print what xmc plan prints for this input")
@_sample_option
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
        found = _run(_plan(ctx, inp, sample_seconds))
        _emit(as_json, found.model_dump(mode="json"), _plan_text(found))
        if not found.startable:
            print(f"{ctx.command_path}: the start would be refused: {one_line(found.refusals[0])}", file=sys.stderr)
            ctx.exit(EXIT_OPERATOR_ERROR)
        return
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
    cli,
    "plan",
    "what resuming would move, cost and meet: held tasks and bytes, every group's backlog, the estimated "
    "time, every reason it would be refused or wait; writes nothing",
)
@_input_options
@_sample_option
def plan_cmd(
    ctx: click.Context, experiment_id: str, stream: str, as_json: bool, sample_seconds: float, **fields: Any
) -> None:
    """Plan the resumption xmc resume would start with the same options, writing nothing: the held
    tasks (count, bytes, oldest and newest), each consumer group's backlog (the replay's rule),
    their drain sampled over --sample-seconds and the time the replay would take at that rate
    (bounded by the fixed policy's waits and the rate caps), and every reason the start would be
    refused or would wait (eviction policy, ACL, memory, a running resumption, a missing stream or
    group, a backlog at the threshold, a rate cap). Exit 0 whatever it finds (xmc resume
    --dry-run exits 2 when the start would be refused)."""
    given = {name: value for name, value in fields.items() if value is not None}
    inp = ResumptionInput.model_validate({"experiment_id": experiment_id, "stream": stream, **given})
    found = _run(_plan(ctx, inp, sample_seconds))
    _emit(as_json, found.model_dump(mode="json"), _plan_text(found))


async def _plan(ctx: click.Context, inp: ResumptionInput, sample_seconds: float) -> Plan:
    """``plan.plan`` with the CLI's Redis, and its Temporal when it can be reached."""
    settings = _settings(ctx)
    temporal: Client | None = None
    error: str | None = None
    try:
        temporal = await connect_temporal()
    except Exception as err:  # the Redis part stands; the plan says what is unknown and why
        error = operator_message(err, settings)
        if error is None:
            raise
    redis = settings.redis()
    try:
        return await plan(
            redis,
            inp,
            temporal=temporal,
            temporal_error=error,
            sample_seconds=sample_seconds,
            query_timeout=QUERY_TIMEOUT_SECONDS / 2,
        )
    finally:
        await redis.aclose()


def _plan_text(p: Plan) -> str:
    """``xmc plan`` as text: what would move, the groups, the estimate, then refusals and waits."""
    size = f"{p.held_bytes:,} bytes" + ("" if p.held_bytes_exact else " (estimated)")
    lines = [f"{p.experiment_id} on {p.stream}: {p.state}, {p.held:,} held tasks, {size}"]
    if p.oldest and p.newest:
        lines.append(
            f"  oldest {p.oldest.id} ({p.oldest.time.isoformat(timespec='seconds')}), "
            f"newest {p.newest.id} ({p.newest.time.isoformat(timespec='seconds')})"
        )
    if not p.stream_exists:
        lines.append(f"  task stream {p.stream}: missing")
    for g in p.groups:
        own = " (this replay's)" if g.group == p.consumer_group else ""
        rate = "-" if g.drain_rate is None else f"{g.drain_rate:,.1f}/s"
        lines.append(
            f"  group {g.group}{own}: {g.consumers} consumers, backlog {g.backlog}{'+' if g.capped else ''} "
            f"(pending {g.pending} + lag {g.lag}), drain {rate}" + (f" ({g.drain_note})" if g.drain_note else "")
        )
    estimate = "unknown" if p.estimate_seconds is None else f"~{duration_text(p.estimate_seconds)}"
    if p.at_least_seconds is not None:
        estimate += f", at least {duration_text(p.at_least_seconds)}"
    lines.append(f"  estimated time: {estimate} ({p.estimate_basis})")
    lines += [f"  refused: {r}" for r in p.refusals]
    lines += [f"  waits: {w}" for w in p.waits]
    lines += [f"  note: {n}" for n in p.notes]
    verdict = "xmc resume would start" if p.startable else "xmc resume would be refused"
    lines.append(f"  {verdict}; nothing was written")
    return "\n".join(lines)


@cli.command("rate", short_help="show, set or clear the stream-wide rate cap shared by every replay of a stream")
@click.option("--stream", type=STREAM_NAME, default=DEFAULT_STREAM, show_default=True, help="the task stream")
@click.option(
    "--set",
    "limit",
    type=click.FloatRange(ratecap.MIN_TASKS_PER_SECOND, ratecap.MAX_TASKS_PER_SECOND),
    help="cap every replay of the stream together at this many tasks per second",
)
@click.option("--clear", is_flag=True, help="remove the stream's cap")
@_json_option
@click.pass_context
def rate_cmd(ctx: click.Context, stream: str, limit: float | None, clear: bool, as_json: bool) -> None:
    """The stream-wide rate cap ({S}:rate in Redis): every publish of every replay of the stream
    takes its tasks from one token bucket on Redis's clock (a second's worth at most), so together
    they move at most this many tasks per second. Applies from each replay's next publish; a
    replay's own max_tasks_per_second applies as well. Without --set or --clear: show it."""
    if limit is not None and clear:
        raise click.UsageError("--set and --clear exclude each other", ctx)

    async def go() -> ratecap.StreamRate | None:
        redis = _settings(ctx).redis()
        try:
            if clear:
                await ratecap.clear_stream_rate(redis, stream)
            elif limit is not None:
                await ratecap.set_stream_rate(redis, stream, limit)
            return await ratecap.stream_rate(redis, stream)
        except ValueError as err:
            raise OperatorError(str(err)) from err
        finally:
            await redis.aclose()

    cap = _run(go())
    doc = {"stream": stream, "key": ratecap.rate_key(stream), "limit": cap.limit if cap else None}
    if cap:
        doc |= {"capacity": cap.capacity, "tokens": cap.tokens}
    text = (
        f"{stream}: at most {cap.limit:g} tasks/s for all its replays ({cap.key}; bucket {cap.tokens:,.1f} of "
        f"{cap.capacity:,.1f})"
        if cap
        else f"{stream}: no stream-wide rate cap"
    )
    _emit(as_json, doc, text)


@_experiment_command(
    cli,
    "set",
    "change a running resumption's threshold, batch, throttle wait, policy or rate cap (the configure Update)",
)
@click.option(
    "--threshold",
    "max_backlog_threshold",
    type=click.INT,
    help=f"max_backlog_threshold ({_bounds('max_backlog_threshold')})",
)
@click.option("--batch", "batch_size", type=click.INT, help=f"batch_size ({_bounds('batch_size')})")
@click.option(
    "--throttle-seconds", "throttle_seconds", type=click.FLOAT, help=f"throttle_seconds ({_bounds('throttle_seconds')})"
)
@click.option(
    "--policy", "throttle_policy", type=click.Choice([p.value for p in ThrottlePolicy]), help="throttle_policy"
)
@click.option(
    "--max-tasks-per-second",
    "max_tasks_per_second",
    type=click.FLOAT,
    help=f"max_tasks_per_second ({_bounds('max_tasks_per_second')}; 0 removes the cap)",
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
            _field_adapter(name).validate_python(value)
        except ValidationError as err:
            msg = err.errors(include_url=False)[0]["msg"]
            raise OperatorError(f"invalid ControlChange: {name}: {msg}") from None
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
        f"throttle {s.throttle_seconds:g}s, policy {s.throttle_policy.value}, "
        f"rate cap {'none' if s.max_tasks_per_second is None else f'{s.max_tasks_per_second:g}/s'}"
        + (", stopping" if s.stopping else "")
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
        eta = f"ETA {_eta_text(p.eta_seconds, p.eta_at)}"
        detail = f"{p.phase.value}, {backlog}, {eta}" + (", STALLED" if p.stalled else "")
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=p.replayed, total=total, detail=detail)
            return
        now = time.monotonic()
        if self._quiet or (p.phase is self._last_phase and now - self._last_line < PLAIN_LINE_SECONDS):
            return
        self._last_phase, self._last_line = p.phase, now
        print(
            f"{workflow_id}: {p.phase.value}: {p.replayed}/{_or(total)} replayed, remaining {_or(p.remaining)}, "
            f"{backlog}, {eta}" + (", STALLED" if p.stalled else ""),
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
    type=click.FloatRange(0, 1e6, min_open=True),
    default=400.0,
    show_default=True,
    help="consumer rate, tasks per second in all",
)
@click.option("--consumers", type=click.IntRange(1, 1_000), default=4, show_default=True, help="consumers in the group")
@click.option("--threshold", type=click.INT, default=500, show_default=True, help="max_backlog_threshold, entries")
@click.option("--batch", type=click.INT, default=100, show_default=True, help="most tasks one publish moves")
@click.option("--throttle-seconds", type=click.FLOAT, default=2.0, show_default=True, help="one throttle wait, seconds")
@click.option(
    "--policy",
    type=click.Choice([p.value for p in ThrottlePolicy]),
    default=ThrottlePolicy.FIXED.value,
    show_default=True,
    help="throttle_policy",
)
@click.option(
    "--linger",
    type=click.FloatRange(0, 86_400),
    default=0.0,
    show_default=True,
    help="seconds to keep the services up at the end (Ctrl-C ends it early)",
)
@click.pass_context
def demo(ctx: click.Context, **opts: Any) -> None:
    """Replay held tasks end to end; starts redis-server and a Temporal dev server unless
    XMC_REDIS_URL / TEMPORAL_ADDRESS are set. Prints its own report (no --json)."""
    _settings(ctx)
    code = _run(run_demo(DemoOptions(**opts)))
    ctx.exit(code)


# --- entry point ------------------------------------------------------------------------------------


def _command_path(err: click.ClickException) -> str:
    ctx = getattr(err, "ctx", None)
    return ctx.command_path if ctx is not None else "xmc"


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
        where = _command_path(err)
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
        gc.collect()  # sdk-python#300: avoids an abort at interpreter exit (TEMPORAL_NOTES.md)
