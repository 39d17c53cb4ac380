"""The Redis-side commands on experiments: ``pause``, ``enqueue``, ``status``, ``dead`` and ``held``."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import click
from redis.exceptions import ResponseError, WatchError

from xmc_resumption.cli.common import (
    GROUP_NAME,
    QUERY_TIMEOUT_SECONDS,
    STREAM_NAME,
    THRESHOLD_TYPE,
    cli,
    client_of,
    emit,
    eta_text,
    experiment_command,
    json_option,
    or_missing,
    run_sync,
    settings_of,
    text_table,
)
from xmc_resumption.cli.params import EntryIdType, FiniteFloat, IntegerRange, NameListType
from xmc_resumption.client import MAX_ENQUEUE_TASKS
from xmc_resumption.errors import EXIT_OPERATOR_ERROR, OperatorError
from xmc_resumption.reconcile import undone_completions
from xmc_resumption.redisclient import deadletter
from xmc_resumption.redisclient.acl import is_denial
from xmc_resumption.redisclient.held import Task
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.redisclient.text import MAX_DETAIL_CHARS, one_line, show_name
from xmc_resumption.status import DEFAULT_IDLE_SECONDS, MAX_LISTED
from xmc_resumption.workflows.models import Phase, ResumptionInput

MAX_TASKS_ENQUEUED = 1_000_000
"""The most synthetic tasks one ``xmc enqueue`` writes."""


@experiment_command(cli, "pause", "pause an experiment: its new tasks are held")
def pause(ctx: click.Context, experiment_id: str, stream: str, as_json: bool) -> None:
    """``xmc pause E``: set the state ``paused`` (``XmcClient.pause``); producers hold."""

    async def go() -> None:
        async with client_of(ctx, stream) as client:
            await client.pause(experiment_id)

    run_sync(go())
    emit(
        as_json,
        {"experiment_id": experiment_id, "stream": stream, "state": ExperimentState.PAUSED.value},
        f"experiment {experiment_id} paused: its new tasks are held",
    )


@experiment_command(cli, "enqueue", "enqueue synthetic tasks through the pause-aware script")
@click.option(
    "--count", type=IntegerRange(1, MAX_TASKS_ENQUEUED), default=100, show_default=True, help="tasks to enqueue"
)
def enqueue(ctx: click.Context, experiment_id: str, stream: str, as_json: bool, count: int) -> None:
    """``xmc enqueue E --count N``: N synthetic tasks through the pause-aware enqueue script.

    ``XmcClient.enqueue_many``, ``MAX_ENQUEUE_TASKS`` a call.
    """

    async def go() -> dict[str, int]:
        where: dict[str, int] = {}
        async with client_of(ctx, stream) as client:
            for first in range(0, count, MAX_ENQUEUE_TASKS):
                tasks: list[Task] = [
                    {"task": f"{experiment_id}:{i:06d}", "n": i}
                    for i in range(first, min(count, first + MAX_ENQUEUE_TASKS))
                ]
                for done in await client.enqueue_many(experiment_id, tasks):
                    where[done.destination] = where.get(done.destination, 0) + 1
        return where

    where = run_sync(go())
    text = f"enqueued {count} tasks of {experiment_id}: " + ", ".join(f"{n} to {dest}" for dest, n in where.items())
    emit(as_json, {"experiment_id": experiment_id, "enqueued": where}, text)


@experiment_command(
    cli,
    "status",
    "state, held tasks, claim, fencing token and backlog in Redis; and the resumption in Temporal, if any",
)
@click.option(
    "--group", type=GROUP_NAME, default=DEFAULT_GROUP, show_default=True, help="the consumer group that must exist"
)
@click.option(
    "--groups",
    type=NameListType("consumer_groups"),
    default=None,
    show_default="--group and every group with a consumer",
    help="the groups whose backlog bounds a replay, comma-separated, --group among them",
)
@click.option(
    "--threshold",
    type=THRESHOLD_TYPE,
    default=ResumptionInput.model_fields["max_backlog_threshold"].default,
    show_default=True,
    help="count the backlog up to this many entries",
)
@click.option(
    "--idle-seconds",
    type=FiniteFloat(0, 30 * 86_400),
    default=DEFAULT_IDLE_SECONDS,
    show_default=True,
    help="name the consumers holding pending entries while idle this long (seconds)",
)
def status(
    ctx: click.Context,
    experiment_id: str,
    stream: str,
    as_json: bool,
    group: str,
    groups: list[str] | None,
    threshold: int,
    idle_seconds: float,
) -> None:
    """``xmc status E``: ``XmcClient.status``: Redis's side, and the run in Temporal when it can be reached.

    When Temporal cannot be reached, ``run`` holds the one-line reason.
    """
    if groups is not None and group not in groups:
        raise click.BadParameter(f"must include --group {group}", ctx, param_hint="'--groups'")

    async def go() -> dict[str, object]:
        async with client_of(ctx, stream) as client:
            found = await client.status(
                experiment_id,
                group=group,
                threshold=threshold,
                query_timeout=QUERY_TIMEOUT_SECONDS / 2,
                groups=groups,
                idle_seconds=idle_seconds,
            )
        doc = found.model_dump(mode="json")
        if doc["unknown"] is None:
            del doc["unknown"]  # the document names ``unknown`` only when a part could not be read
        return doc

    doc = run_sync(go())
    emit(as_json, doc, _status_text(doc))
    unknown: Mapping[str, str] = doc.get("unknown") or {}  # type: ignore[assignment]
    for reason in unknown.values():
        print(f"{ctx.command_path}: {one_line(reason, limit=2 * MAX_DETAIL_CHARS)}", file=sys.stderr)
    if unknown:
        ctx.exit(EXIT_OPERATOR_ERROR)


def _status_text(doc: Mapping[str, Any]) -> str:
    """``xmc status`` as text: one fact a line.

    A part that could not be read says ``unknown`` and why (``status.experiment_status``); keys it does not
    know are printed as they are.
    """
    e, s = doc["experiment_id"], doc["stream"]
    unknown: Mapping[str, str] = doc.get("unknown") or {}

    def why(*parts: str) -> str:
        return "unknown (" + "; ".join(unknown[p] for p in parts if p in unknown) + ")"

    if doc["exists"] is False:
        lines = [f"{e} on {s}: unknown: no key of this experiment in Redis (never paused here: a typo, or --stream?)"]
    else:
        state = doc["state"] if "state" not in unknown else why("state")
        note = " (orphaned: resuming, no live claim)" if doc["orphaned"] else ""
        if doc.get("cut_off"):
            note = " (running, its worker cannot reach Redis: no live claim; the run goes on once a worker reaches it)"
        lines = [f"{e} on {s}: {state}{note}"]
        held_text = f"{doc['held']} tasks" if "state" not in unknown else why("state")
        dead = doc["set_aside"] if "set_aside" not in unknown else why("set_aside")
        lines.append(f"  held: {held_text}; set aside: {dead}")
    claim = doc["claim"]
    if "claim" in unknown:
        lines.append(f"  claim: {why('claim')}")
    elif claim:
        lease = int(claim.get("lease_ms", "0")) / 1000
        owner = show_name(str(claim.get("owner", "")))
        lines.append(f"  claim: token {claim.get('token')} owned by {owner}, lease {lease:.0f}s left")
    elif doc["exists"] is not False:
        lines.append("  claim: none")
    lines.append(f"  fencing token: {doc['fence'] if 'fence' not in unknown else why('fence')}")
    b = doc["backlog"]
    if b is None:
        lines.append(f"  backlog: {why('backlog')}")
    else:
        lines += _backlog_lines(b)
    idle = doc.get("idle_consumers")
    if "idle_consumers" in unknown:
        lines.append(f"  idle consumers holding pending entries: {why('idle_consumers')}")
    elif idle:
        held_by = (
            f"{show_name(c['group'])}/{show_name(c['consumer'])} holds {c['pending']}, idle {c['idle_ms'] / 1000:.0f}s"
            for c in idle
        )
        lines.append("  idle consumers holding pending entries: " + "; ".join(held_by))
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
    known = {"experiment_id", "stream", "exists", "state", "orphaned", "cut_off", "held", "set_aside", "claim", "fence"}
    shown = known | {"backlog", "run", "redis_memory", "unknown", "idle_consumers"}
    lines += [f"  {k}: {v}" for k, v in doc.items() if k not in shown]
    return "\n".join(lines)


def _backlog_lines(b: Mapping[str, Any]) -> list[str]:
    """``xmc status``'s backlog lines.

    The largest among the groups, the group that has it, each group's part (when there are several) and
    a missing stream or group.
    """

    def part(g: Mapping[str, Any]) -> str:
        if g.get("missing"):
            return "missing"
        lag = f"{g['lag']}{'+' if g['capped'] else ''}" if g.get("counted", True) else "not counted"
        return f"{g['pending']} pending + {lag} undelivered"

    groups = b.get("groups") or []
    limiting = next((g for g in groups if g["name"] == b.get("limiting_group")), None)
    if b["status"] != "ok" and b.get("missing_group"):
        what = "stream" if b["status"] == "no_stream" else "consumer group"
        name = show_name(b["missing_group"]) if what == "consumer group" else "(so no group)"
        lines = [f"  backlog: {what} {name} missing: a replay waits for it under missing_group wait"]
    else:
        side = "at or over" if b["pending"] + b["lag"] >= b["threshold"] else "under"
        shown = part(limiting) if limiting else part({**b, "counted": True})
        lines = [
            f"  backlog of {show_name(b.get('limiting_group') or b['group'])}: {shown}, {side} {b['threshold']} "
            f"(counted up to --threshold)" + (f"; the largest of {len(groups)} groups" if len(groups) > 1 else "")
        ]
    if len(groups) > 1:
        unattended = "; no consumer: not waited for"
        lines += [
            f"    group {show_name(g['name'])}: {part(g)}" + unattended * (g.get("bounds") is False) for g in groups
        ]
    return lines


STALL_CHARS = 2_000
"""Longest stall reason ``xmc status`` shows (characters): it names up to five idle consumers."""


def _run_text(run: Mapping[str, Any] | None) -> str:
    if run is None:
        return "resumption: none in Temporal"
    if "error" in run:
        return f"resumption: unknown ({run['error']})"
    text = f"resumption: {run['workflow_id']} {run['status']} (run {run['run_id']})"
    progress = run.get("progress")
    if progress:
        text += (
            f": {progress['phase']}, replayed {progress['replayed']}, remaining {or_missing(progress['remaining'])}, "
            f"backlog {or_missing(progress['backlog'])}/{progress['threshold']}"
            + (f" of {show_name(progress['limiting_group'])}" if progress.get("limiting_group") else "")
            + f", ETA {eta_text(progress.get('eta_seconds'), progress.get('eta_at'))}"
            + (
                f", waiting for a consumer group: {one_line(progress['throttle_reason'])}"
                if progress["phase"] == Phase.WAITING_FOR_GROUP.value
                else ""
            )
            + (
                f", STALLED {progress['stalled_seconds']:.0f}s: {one_line(progress['stall_reason'], STALL_CHARS)}"
                if progress["stalled"]
                else ""
            )
            + (
                f", RATE LIMITED: {one_line(progress['rate_reason'])}"
                if progress["phase"] == Phase.RATE_LIMITED.value
                else ""
            )
        )
    else:
        text += f": phase {or_missing(run['phase'])}, replayed {or_missing(run['replayed'])}, "
        text += f"remaining {or_missing(run['remaining'])}"
        text += f", outcome {run['outcome']}" if run.get("outcome") else ""
        text += f" ({run['progress_error']})" if run.get("progress_error") else ""
    text += f"; its result could not be read ({run['result_error']})" if run.get("result_error") else ""
    release_error = run.get("release_error") or (progress or {}).get("release_error")
    return text + (f"\n  CLAIM NOT RELEASED: {release_error}" if release_error else "")


@experiment_command(cli, "dead", "list the tasks set aside (too many fields to move by script), or retry or drop one")
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
        redis = settings_of(ctx).redis()
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

    doc = run_sync(go())
    if "tasks" in doc:
        text = "\n".join(
            [f"{len(doc['tasks'])} tasks set aside in {doc['key']}"]
            + [f"  {t['id']}: {t['fields']} fields, {t['bytes']} bytes" for t in doc["tasks"]]
        )
    elif "retried_to" in doc:
        text = f"{doc['entry_id']} put back into {doc['retried_to']}"
    else:
        text = f"{doc['entry_id']} dropped from {doc['dropped']}"
    emit(as_json, doc, text)


@cli.command("held", short_help="experiments paused or orphaned in Redis, with their held tasks")
@click.option("--stream", type=STREAM_NAME, default=DEFAULT_STREAM, show_default=True, help="the task stream")
@click.option("--orphaned", is_flag=True, help="only orphaned experiments (resuming, no live claim)")
@click.option(
    "--undone",
    is_flag=True,
    help="also ask Temporal which are undone completions (completed there, holding its tasks again here)",
)
@click.option("--limit", type=IntegerRange(1, MAX_LISTED), default=1_000, show_default=True, help="most experiments")
@json_option
@click.pass_context
def held_cmd(ctx: click.Context, stream: str, orphaned: bool, undone: bool, limit: int, as_json: bool) -> None:
    """Every experiment on the stream that Redis holds something for.

    Paused, orphaned (resuming with no live claim: start a resumption again), resuming (a replay holds
    the claim), unknown (a state value the contract does not know), stranded (tasks held but no state
    key), bad_keys. Found by SCAN (never KEYS), so it is safe on a busy Redis. With --undone, each whose newest
    resumption Temporal shows completed while Redis holds the tasks it moved is flagged an undone completion (a
    crash failover lost the moves; xmc reconcile resumes it), with the tasks held again.
    """

    async def go() -> tuple[list[dict[str, object]], bool]:
        async with client_of(ctx, stream) as client:
            found, truncated = await client.held(limit=limit)
            rows = [row.model_dump(mode="json", exclude_unset=True) for row in found]
            if undone:
                completions = await undone_completions(await client.temporal(), client.redis, stream)
                flagged = {u.experiment_id: u.model_dump(mode="json") for u in completions}
                for row in rows:
                    row["undone_completion"] = flagged.get(str(row["experiment_id"]))
        return rows, truncated

    rows, truncated = run_sync(go())
    if orphaned:
        rows = [r for r in rows if r["condition"] == "orphaned"]
    table = text_table(
        ["EXPERIMENT", "CONDITION", "STATE", "HELD", "CLAIM"] + (["UNDONE COMPLETION"] if undone else []),
        [
            [
                r["experiment_id"],
                r["condition"],
                or_missing(r["state"]),
                or_missing(r["held"]),
                r.get("error") or _claim_text(r["claim"]),  # type: ignore[arg-type]
            ]
            + ([_undone_text(r["undone_completion"])] if undone else [])  # type: ignore[arg-type]
            for r in rows
        ],
    )
    more = f"\n(more than {limit} experiments: --limit)" if truncated else ""
    none = "is orphaned" if orphaned else "is paused, resuming or holding tasks"
    text = (table if rows else f"no experiment on {stream} {none}") + more
    emit(as_json, {"stream": stream, "experiments": rows, "truncated": truncated}, text)


def _undone_text(undone: Mapping[str, Any] | None) -> str:
    if not undone:
        return "-"
    capped = "+" if undone["held_again_capped"] else ""
    return f"{undone['held_again']}{capped} held again after {undone['run_id'] or undone['workflow_id']} completed"


def _claim_text(claim: Mapping[str, str]) -> str:
    if not claim:
        return "-"
    owner = show_name(str(claim.get("owner", "")))
    return f"token {claim.get('token')} by {owner}, {int(claim.get('lease_ms', '0')) / 1000:.0f}s left"
