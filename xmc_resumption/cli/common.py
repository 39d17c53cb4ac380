"""What every ``xmc`` command shares: the group, the settings, parameter types and options, output, error handling.

The options are taken from ``ResumptionInput``; ``main``'s exit codes are the package docstring's.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

from xmc_resumption import __version__
from xmc_resumption.cli.params import FiniteFloat, NameType, TaskQueueType, field_type
from xmc_resumption.client import XmcClient
from xmc_resumption.errors import (
    EXIT_BROKEN_PIPE,
    EXIT_OPERATOR_ERROR,
    EXIT_RUN_FAILED,
    RunFailedError,
    operator_message,
)
from xmc_resumption.redisclient.keys import DEFAULT_STREAM
from xmc_resumption.redisclient.text import one_line
from xmc_resumption.settings import Settings
from xmc_resumption.workflows.models import ResumptionInput
from xmc_resumption.workflows.text import duration_text

T = TypeVar("T")

DESCRIPTION = (
    "Operate xmc-resumption: pause experiments, enqueue tasks, inspect them, plan, start, watch, "
    "change and stop resumptions, cap a stream's rate, list the fleet, run the demo. Redis from "
    "XMC_REDIS_URL; Temporal from TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE / profiles. Exit codes: 0 "
    "done, 1 a run awaited with --wait ended without a result, 2 an operator error or refusal (one "
    "line on stderr)."
)

QUERY_TIMEOUT_SECONDS = 5.0
"""How long one progress query may take before it counts as unanswered (seconds)."""


@dataclass
class AppState:
    """What the error handler of ``main`` needs from the command that ran."""

    settings: Settings | None = None
    interrupted_note: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def app_state(ctx: click.Context) -> AppState:
    """The ``AppState`` ``main`` handed the group."""
    state = ctx.find_root().obj
    assert isinstance(state, AppState)
    return state


def settings_of(ctx: click.Context) -> Settings:
    """The settings, read once; a bad one raises ``ValidationError`` (one line, exit 2)."""
    state = app_state(ctx)
    if state.settings is None:
        state.settings = Settings()
    return state.settings


def client_of(ctx: click.Context, stream: str) -> XmcClient:
    """The client of a command (``xmc_resumption.client``): the settings' Redis and task queue, the command's stream.

    It sends nothing twice: a command reports a Redis fault at once (the operator runs it again).
    """
    return XmcClient.from_settings(settings_of(ctx), stream=stream, retries=0)


class Interrupted(Exception):
    """Ctrl-C during a command; raised instead of ``KeyboardInterrupt``.

    So Click does not print a line of its own before ``main``'s one.
    """


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; Ctrl-C raises ``Interrupted``."""
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        raise Interrupted from None


def emit(as_json: bool, doc: Mapping[str, Any] | Sequence[Any], text: str) -> None:
    """One JSON document or the text on stdout, never both."""
    print(json.dumps(doc, indent=2, default=str) if as_json else text)


class ManyArgument(click.Argument):
    """An argument taking one or more values: ``NAME...`` in the usage line, ``'NAME'`` in errors."""

    def get_error_hint(self, ctx: click.Context | None) -> str:
        """How errors name the argument: as a single argument does."""
        return f"'{self.human_readable_name}'"


EXPERIMENT_ID = NameType("experiment_id")
STREAM_NAME = NameType("stream")
TASK_QUEUE_NAME = TaskQueueType()
GROUP_NAME = NameType("consumer_group")
"""Consumer group names follow the same rule: not keys, but they reach XINFO, the logs and the UI."""


@dataclass(frozen=True)
class InputOption:
    """A ``resume`` option that sets one ``ResumptionInput`` field.

    Its type, bounds and default come from the model (``params.field_type``).
    """

    flag: str
    field: str
    help: str
    default_text: str | None = None

    @property
    def type(self) -> click.ParamType[Any]:
        """The option's click type: the field's type and bounds."""
        return field_type(ResumptionInput, self.field)


INPUT_OPTIONS = (
    InputOption("--group", "consumer_group", "the consumer group that must exist before anything moves"),
    InputOption(
        "--groups",
        "consumer_groups",
        "the groups whose largest backlog bounds the replay, comma-separated, --group among them",
        "--group and every group with a consumer",
    ),
    InputOption("--batch", "batch_size", "most tasks one publish script moves (entries)", "automatic"),
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
        "a missing stream or group: wait (nothing moves until it exists), zero (the stream's entries "
        "count as its backlog), or error (the run fails)",
    ),
    InputOption("--max-bytes-per-call", "max_bytes_per_call", "byte budget of one Redis script"),
    InputOption("--turns-per-run", "turns_per_run", "continue-as-new after this many turns"),
    InputOption(
        "--max-run-seconds",
        "max_run_seconds",
        "continue-as-new once a run has lasted this long (seconds): how long a release takes to reach the replay",
    ),
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
    InputOption(
        "--max-tasks-per-second",
        "max_tasks_per_second",
        "this replay's rate cap, tasks per second (xmc rate sets the stream's)",
        "none",
    ),
    InputOption(
        "--moved-through",
        "moved_through",
        "the last held entry ID an earlier resumption was told it moved: tasks held at or below it are moved again "
        "marked xmc-redelivery (xmc reconcile sets it)",
        "none",
    ),
)
"""One option per ``ResumptionInput`` field but the experiment, the stream (every command's) and
``carry`` (the workflow's own); tests/test_cli.py checks that none is missing."""


def input_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``INPUT_OPTIONS`` to a command, each with the model's default.

    A default of None, such as ``max_wait_seconds``'s, stays None, and so does an empty one (``moved_through``'s):
    the model fills it in.
    """
    for opt in reversed(INPUT_OPTIONS):
        default = ResumptionInput.model_fields[opt.field].default
        default = None if default == "" else default
        fn = click.option(
            opt.flag,
            opt.field,
            type=opt.type,
            default=getattr(default, "value", default),
            show_default=opt.default_text or True,
            help=f"{opt.field}: {opt.help}",
        )(fn)
    return fn


def field_option(flag: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An option that sets ``ResumptionInput`` field ``name``, with no default.

    Its type and bounds come from the field (click shows them in the help).
    """
    return click.option(flag, name, type=field_type(ResumptionInput, name), help=name)


def experiment_command(group: click.Group, name: str, help_text: str) -> Callable[..., Any]:
    """A command of ``group`` taking EXPERIMENT_ID, ``--stream`` and ``--json``."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of text")(fn)
        fn = click.option(
            "--stream", type=STREAM_NAME, default=DEFAULT_STREAM, show_default=True, help="the task stream"
        )(fn)
        fn = click.argument("experiment_id", type=EXPERIMENT_ID)(fn)
        return group.command(name, help=help_text, short_help=help_text.split(";")[0])(click.pass_context(fn))

    return wrap


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--json`` option of a command: one JSON document instead of text."""
    return click.option("--json", "as_json", is_flag=True, help="print one JSON document instead of text")(fn)


THRESHOLD_TYPE = field_type(ResumptionInput, "max_backlog_threshold")
"""A backlog threshold on the command line: ``ResumptionInput.max_backlog_threshold``'s bounds."""

UPDATE_TIMEOUT = FiniteFloat(0.1, 3_600)
"""``--timeout`` of the Updates (seconds): below 0.1 s no server round trip fits."""


@click.group(help=DESCRIPTION, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="xmc", message="%(prog)s %(version)s")
def cli() -> None:
    """The ``xmc`` group; see ``DESCRIPTION``."""


def eta_text(eta_seconds: float | None, eta_at: str | datetime | None) -> str:
    """An ETA for people, counted from now on this machine's clock: ``~3m 07s (at 12:34:56Z)``.

    ``0s`` when nothing is left, ``-`` while it cannot be estimated (``Progress.eta_seconds``,
    ``eta_at``: a datetime, or its ISO text from JSON).
    """
    if eta_seconds is None or eta_at is None:
        return "-"
    if eta_seconds == 0:
        return "0s"
    at = eta_at if isinstance(eta_at, datetime) else datetime.fromisoformat(eta_at)
    left = (at - datetime.now(UTC)).total_seconds()
    return f"~{duration_text(max(0.0, left))} (at {at.astimezone(UTC).strftime('%H:%M:%SZ')})"


def or_missing(value: object, missing: str = "?") -> str:
    """``value`` as text, ``missing`` for None."""
    return missing if value is None else str(value)


def text_table(header: list[str], rows: list[list[object]]) -> str:
    """Rows as plain columns, left-aligned (no terminal width games: scripts use ``--json``)."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def _command_path(err: click.ClickException, args: Sequence[str]) -> str:
    """The command an error is about: its context's, else the command named in ``args``, else ``xmc``.

    Click raises some parse errors, such as a value given to a flag, without a context.
    """
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
