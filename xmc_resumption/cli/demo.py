"""``xmc demo``: replay held tasks end to end on local services (``xmc_resumption.demo``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from xmc_resumption.cli.common import cli, run_sync, settings_of
from xmc_resumption.cli.params import FiniteFloat, IntegerRange, field_type
from xmc_resumption.demo import DemoOptions, run_demo
from xmc_resumption.workflows.models import ResumptionInput

DEFAULTS = {f.name: f.default for f in dataclasses.fields(DemoOptions)}
"""The demo's defaults, from ``DemoOptions`` (whose threshold, batch and policy are
``ResumptionInput``'s)."""


@cli.command("demo", short_help="replay held tasks end to end on local services")
@click.option(
    "--tasks",
    type=IntegerRange(1, 10_000_000),
    default=DEFAULTS["tasks"],
    show_default=True,
    help="tasks to hold and replay",
)
@click.option(
    "--rate",
    type=FiniteFloat(0, 1e6, min_open=True),
    default=DEFAULTS["rate"],
    show_default=True,
    help="consumer rate, tasks per second in all",
)
@click.option(
    "--consumers",
    type=IntegerRange(1, 1_000),
    default=DEFAULTS["consumers"],
    show_default=True,
    help="consumers in the group",
)
@click.option(
    "--threshold",
    type=field_type(ResumptionInput, "max_backlog_threshold"),
    default=DEFAULTS["threshold"],
    show_default=True,
    help="max_backlog_threshold, entries",
)
@click.option(
    "--batch",
    type=field_type(ResumptionInput, "batch_size"),
    default=DEFAULTS["batch"],
    show_default=True,
    help="most tasks one publish script moves (default: automatic)",
)
@click.option(
    "--throttle-seconds",
    type=field_type(ResumptionInput, "throttle_seconds"),
    default=DEFAULTS["throttle_seconds"],
    show_default=True,
    help="one throttle wait, seconds",
)
@click.option(
    "--policy",
    type=field_type(ResumptionInput, "throttle_policy"),
    default=DEFAULTS["policy"],
    show_default=True,
    help="throttle_policy",
)
@click.option(
    "--linger",
    type=FiniteFloat(0, 86_400),
    default=DEFAULTS["linger"],
    show_default=True,
    help="seconds to keep the services up at the end (Ctrl-C ends it early)",
)
@click.pass_context
def demo(ctx: click.Context, /, **opts: Any) -> None:
    """Replay held tasks end to end on local services.

    Starts redis-server and a Temporal dev server unless XMC_REDIS_URL / TEMPORAL_ADDRESS are set.
    Prints its own report (no --json).
    """
    options = DemoOptions(**opts)
    options.resumption_input("demo")  # a knob the workflow would refuse fails here, before any service starts
    settings_of(ctx)
    code = run_sync(run_demo(options))
    ctx.exit(code)
