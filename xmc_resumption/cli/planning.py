"""Capacity commands: ``plan`` and ``rate``.

``plan``: what a resumption would move, cost and meet (``resume --dry-run`` prints the same);
``rate``: the stream-wide rate cap. docs/operating.md, "Plan"; docs/pacing.md, "Rate caps".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from xmc_resumption.cli.common import (
    STREAM_NAME,
    cli,
    client_of,
    emit,
    experiment_command,
    input_options,
    json_option,
    run_sync,
)
from xmc_resumption.cli.params import FiniteFloat
from xmc_resumption.errors import OperatorError
from xmc_resumption.plan import DEFAULT_SAMPLE_SECONDS, MAX_SAMPLE_SECONDS, Plan
from xmc_resumption.redisclient import ratecap
from xmc_resumption.redisclient.keys import DEFAULT_STREAM
from xmc_resumption.redisclient.text import show_name
from xmc_resumption.workflows.models import ResumptionInput
from xmc_resumption.workflows.text import duration_text


def sample_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--sample-seconds`` of ``plan`` and ``resume --dry-run``."""
    return click.option(
        "--sample-seconds",
        type=FiniteFloat(0, MAX_SAMPLE_SECONDS),
        default=DEFAULT_SAMPLE_SECONDS,
        show_default=True,
        help="plan: sample the consumer groups' drain this long (seconds; 0: no sample, no estimate)",
    )(fn)


@experiment_command(
    cli,
    "plan",
    "what resuming would move, cost and meet: held tasks and bytes, every group's backlog, the estimated "
    "time, every reason it would be refused or wait; writes nothing",
)
@input_options
@sample_option
def plan_cmd(
    ctx: click.Context, experiment_id: str, stream: str, as_json: bool, sample_seconds: float, **fields: Any
) -> None:
    """Plan the resumption xmc resume would start with the same options, writing nothing.

    Shows the held tasks (count, bytes, oldest and newest), each consumer group's backlog (the replay's
    rule), their drain sampled over --sample-seconds and the time the replay would take at that rate
    (bounded by the fixed policy's waits and the rate caps), and every reason the start would be refused
    or would wait (eviction policy, ACL, memory, a running resumption, a missing stream or group, a
    backlog at the threshold, a rate cap). Exit 0 whatever it finds (xmc resume --dry-run exits 2 when
    the start would be refused).
    """
    given = {name: value for name, value in fields.items() if value is not None}
    inp = ResumptionInput.model_validate({"experiment_id": experiment_id, "stream": stream, **given})
    found = run_sync(run_plan(ctx, inp, sample_seconds))
    emit(as_json, found.model_dump(mode="json"), plan_text(found))


async def run_plan(ctx: click.Context, inp: ResumptionInput, sample_seconds: float) -> Plan:
    """``XmcClient.plan`` with the CLI's Redis, and its Temporal when it can be reached."""
    async with client_of(ctx, inp.stream) as client:
        return await client.plan(inp, sample_seconds=sample_seconds)


def plan_text(p: Plan) -> str:
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
        rate = "-" if g.drain_rate is None else f"{'at least ' if g.caught_up else ''}{g.drain_rate:,.1f}/s"
        lines.append(
            f"  group {show_name(g.group)}{own}: {g.consumers} consumers, backlog {g.backlog}{'+' if g.capped else ''} "
            f"(pending {g.pending} + lag {g.lag}), drain {rate}" + (f" ({g.drain_note})" if g.drain_note else "")
        )
    if p.sample_seconds and p.added_rate is not None:
        lines.append(f"  producers added {p.added_rate:,.1f}/s to {p.stream} during the {p.sample_seconds:g}s sample")
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
    type=FiniteFloat(ratecap.MIN_TASKS_PER_SECOND, ratecap.MAX_TASKS_PER_SECOND),
    help="cap every replay of the stream together at this many tasks per second",
)
@click.option("--clear", is_flag=True, help="remove the stream's cap")
@json_option
@click.pass_context
def rate_cmd(ctx: click.Context, stream: str, limit: float | None, clear: bool, as_json: bool) -> None:
    """Show, set or clear the stream-wide rate cap ({S}:rate in Redis).

    Every publish of every replay of the stream takes its tasks from one token bucket on Redis's clock
    (a second's worth at most), so together they move at most this many tasks per second. Applies from
    each replay's next publish; a replay's own max_tasks_per_second applies as well. Without --set or
    --clear: show it.
    """
    if limit is not None and clear:
        raise click.UsageError("--set and --clear exclude each other", ctx)

    async def go() -> ratecap.StreamRate | None:
        async with client_of(ctx, stream) as client:
            try:
                if clear:
                    await ratecap.clear_stream_rate(client.redis, stream)
                elif limit is not None:
                    await ratecap.set_stream_rate(client.redis, stream, limit)
                return await ratecap.stream_rate(client.redis, stream)
            except ValueError as err:
                raise OperatorError(str(err)) from err

    cap = run_sync(go())
    doc: dict[str, Any] = {"stream": stream, "key": ratecap.rate_key(stream), "limit": cap.limit if cap else None}
    if cap:
        doc |= {"capacity": cap.capacity, "tokens": cap.tokens}
    text = (
        f"{stream}: at most {cap.limit:g} tasks/s for all its replays ({cap.key}; bucket {cap.tokens:,.1f} of "
        f"{cap.capacity:,.1f})"
        if cap
        else f"{stream}: no stream-wide rate cap"
    )
    emit(as_json, doc, text)
