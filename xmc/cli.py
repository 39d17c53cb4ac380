"""The ``xmc`` command: ``xmc demo``, ``xmc pause E``, ``xmc enqueue E``, ``xmc status E``, ``xmc resume E``.

Redis from ``XMC_REDIS_URL``, Temporal from envconfig (``TEMPORAL_ADDRESS``, ...), like the worker.
Errors an operator can mend (bad arguments or settings, Redis or Temporal unreachable, a key
holding garbage, a resumption already running or failed) print one line naming the argument,
setting or key, never a secret, and exit 2 (``xmc.errors``). A closed stdout (``xmc status E |
head``) ends the command quietly with 141. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, NoReturn

from pydantic import TypeAdapter, ValidationError
from redis.exceptions import ResponseError, WatchError
from temporalio.client import WorkflowFailureError

from redisclient import deadletter, held
from redisclient.acl import is_denial
from redisclient.backlog import validate_threshold
from redisclient.connection import RedisClient
from redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys, validate_name
from redisclient.results import ExperimentState
from workflows.models import ResumptionInput, ThrottlePolicy
from xmc.demo import DemoOptions, run_demo
from xmc.errors import EXIT_BROKEN_PIPE, EXIT_OPERATOR_ERROR, OperatorError, operator_message, workflow_failure_message
from xmc.ops import experiment_status, refuse_evicting_redis, start_resumption, state_and_held
from xmc.settings import Settings, connect_temporal

DESCRIPTION = (
    "Operate xmc-resumption: pause experiments, enqueue tasks, inspect them, start resumptions, run the demo. "
    "Redis from XMC_REDIS_URL; Temporal from TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE / profiles."
)


Command = Callable[[argparse.Namespace, Settings], Awaitable[int]]

_EXPERIMENT_ID: TypeAdapter[str] = TypeAdapter(
    Annotated[str, *ResumptionInput.model_fields["experiment_id"].metadata]  # type: ignore[valid-type]
)
"""The experiment ID rule of ``ResumptionInput`` (one rule: the CLI checks what the workflow checks)."""


class OneLineParser(argparse.ArgumentParser):
    """``argparse`` whose errors are one line (``xmc status: error: ...``) and exit 2, not a usage
    block; ``--help`` is unchanged."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` on one line with a pointer to ``--help`` and exit 2."""
        self.exit(EXIT_OPERATOR_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def experiment_id_arg(value: str) -> str:
    """An experiment ID as ``ResumptionInput.experiment_id`` and the key layout accept it."""
    try:
        _EXPERIMENT_ID.validate_python(value)
        ExperimentKeys(DEFAULT_STREAM, value)
    except (ValidationError, ValueError) as err:
        msg = err.errors()[0]["msg"] if isinstance(err, ValidationError) else str(err)
        raise argparse.ArgumentTypeError(f"experiment ID {value[:40]!r}: {msg}") from None
    return value


def stream_arg(value: str) -> str:
    """A stream name the key layout accepts (not empty, no braces: they set the hash tag)."""
    try:
        ExperimentKeys(value, "E")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def group_arg(value: str) -> str:
    """A consumer group name, by the rule of stream names (``redisclient.keys.validate_name``)."""
    try:
        return validate_name("consumer_group", value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def threshold_arg(value: str) -> int:
    """A backlog threshold: an integer of at least 1 entry."""
    try:
        threshold = int(value)
        validate_threshold(threshold)
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            str(err) if "threshold" in str(err) else f"not an integer: {value!r}"
        ) from None
    return threshold


def count_arg(value: str) -> int:
    """A task count: an integer of at least 1."""
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {count}")
    return count


def entry_id_arg(value: str) -> str:
    """A stream entry ID (``<ms>-<seq>``) from the command line."""
    if not re.fullmatch(r"\d+-\d+", value):
        raise argparse.ArgumentTypeError(f"not a stream entry ID (<ms>-<seq>): {value[:40]!r}")
    return value


async def _pause(args: argparse.Namespace, settings: Settings) -> int:
    redis = settings.redis()
    await held.pause(redis, ExperimentKeys(args.stream, args.experiment_id))
    print(f"experiment {args.experiment_id} paused: its new tasks are held")
    await redis.aclose()
    return 0


async def _enqueue(args: argparse.Namespace, settings: Settings) -> int:
    redis = settings.redis()
    keys = ExperimentKeys(args.stream, args.experiment_id)
    where: dict[str, int] = {}
    for i in range(args.count):
        dest, _ = await held.enqueue_task(redis, keys, {"task": f"{args.experiment_id}:{i:06d}", "n": i})
        where[dest] = where.get(dest, 0) + 1
    print(json.dumps({"experiment_id": args.experiment_id, "enqueued": where}))
    await redis.aclose()
    return 0


async def _status(args: argparse.Namespace, settings: Settings) -> int:
    redis = settings.redis()
    status = await experiment_status(redis, ExperimentKeys(args.stream, args.experiment_id), args.group, args.threshold)
    print(json.dumps(status, indent=2))
    await redis.aclose()
    return 0


async def _dead(args: argparse.Namespace, settings: Settings) -> int:
    redis = settings.redis()
    keys = ExperimentKeys(args.stream, args.experiment_id)
    try:
        return await _dead_action(args, redis, keys)
    except WatchError as err:
        raise OperatorError(f"{keys.dead} or the experiment changed meanwhile; nothing moved: try again") from err
    except ResponseError as err:
        if is_denial(err):
            raise  # an ACL refusal: operator_message names the user and the command
        raise OperatorError(f"nothing moved: {err}") from err
    finally:
        await redis.aclose()


async def _dead_action(args: argparse.Namespace, redis: RedisClient, keys: ExperimentKeys) -> int:
    """List, retry or drop the experiment's set-aside tasks (``redisclient.deadletter``)."""
    if not (args.retry or args.drop):
        rows = await deadletter.dead_letters(redis, keys)
        print(json.dumps({"key": keys.dead, "tasks": [{"id": i, "fields": f, "bytes": b} for i, f, b in rows]}))
        return 0
    entry_id = args.retry or args.drop
    where = (
        await deadletter.retry(redis, keys, entry_id) if args.retry else await deadletter.drop(redis, keys, entry_id)
    )
    if not where:
        raise OperatorError(f"no set-aside task {entry_id} in {keys.dead}")
    print(json.dumps({"entry_id": entry_id, "retried_to" if args.retry else "dropped": where}))
    return 0


async def _resume(args: argparse.Namespace, settings: Settings) -> int:
    inp = ResumptionInput(  # validated before anything is read or started
        experiment_id=args.experiment_id,
        stream=args.stream,
        consumer_group=args.group,
        batch_size=args.batch,
        max_backlog_threshold=args.threshold,
        throttle_seconds=args.throttle_seconds,
        throttle_policy=ThrottlePolicy(args.policy),
    )
    redis = settings.redis()
    keys = ExperimentKeys(args.stream, args.experiment_id)
    state, waiting = await state_and_held(redis, keys)
    await refuse_evicting_redis(redis, keys)
    await redis.aclose()
    if state is ExperimentState.RUNNING and not waiting and not args.force:
        print(
            f"experiment {args.experiment_id} is running and holds no tasks: nothing to resume "
            "(--force starts the workflow anyway)",
            file=sys.stderr,
        )
        return 1
    client = await connect_temporal()
    handle = await start_resumption(client, inp, settings.task_queue)
    print(f"started {handle.id} (run {handle.result_run_id})")
    if args.wait:
        try:
            result = await handle.result()
        except WorkflowFailureError as err:
            raise OperatorError(workflow_failure_message(err, handle.id)) from err
        print(result.model_dump_json(indent=2))
    return 0


async def _demo(args: argparse.Namespace, settings: Settings) -> int:
    return await run_demo(
        DemoOptions(
            tasks=args.tasks,
            rate=args.rate,
            consumers=args.consumers,
            threshold=args.threshold,
            batch=args.batch,
            throttle_seconds=args.throttle_seconds,
            policy=args.policy,
            linger=args.linger,
        )
    )


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``xmc``."""
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = OneLineParser(prog="xmc", description=DESCRIPTION, formatter_class=fmt)
    sub = p.add_subparsers(dest="command", required=True)

    def experiment_cmd(name: str, help_text: str, fn: Command) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text, description=help_text, formatter_class=fmt)
        cmd.add_argument("experiment_id", type=experiment_id_arg, help="the experiment ID")
        cmd.add_argument("--stream", type=stream_arg, default=DEFAULT_STREAM, help="the task stream")
        cmd.set_defaults(fn=fn)
        return cmd

    experiment_cmd("pause", "pause an experiment: its new tasks are held", _pause)
    enqueue = experiment_cmd("enqueue", "enqueue synthetic tasks through the pause-aware script", _enqueue)
    enqueue.add_argument("--count", type=count_arg, default=100, help="tasks to enqueue")
    status = experiment_cmd("status", "print state, held tasks, claim, fencing token and backlog as JSON", _status)
    status.add_argument("--group", type=group_arg, default=DEFAULT_GROUP, help="the consumer group")
    status.add_argument(
        "--threshold", type=threshold_arg, default=500, help="count the backlog up to this many entries"
    )
    dead = experiment_cmd(
        "dead", "list the tasks set aside (too many fields to move by script), or retry or drop one", _dead
    )
    action = dead.add_mutually_exclusive_group()
    action.add_argument(
        "--retry",
        metavar="ID",
        type=entry_id_arg,
        help="put it back: held if the experiment holds tasks, else the stream",
    )
    action.add_argument("--drop", metavar="ID", type=entry_id_arg, help="delete it")
    resume = experiment_cmd("resume", "start ResumptionWorkflow for the experiment (ID resumption-<E>)", _resume)
    resume.add_argument(
        "--group", type=group_arg, default=DEFAULT_GROUP, help="the consumer group whose backlog throttles"
    )
    defaults = {name: field.default for name, field in ResumptionInput.model_fields.items()}
    resume.add_argument("--batch", type=int, default=defaults["batch_size"], help="most tasks one publish moves")
    resume.add_argument(
        "--threshold", type=int, default=defaults["max_backlog_threshold"], help="max_backlog_threshold, entries"
    )
    resume.add_argument(
        "--throttle-seconds", type=float, default=defaults["throttle_seconds"], help="one throttle wait, seconds"
    )
    resume.add_argument(
        "--policy",
        choices=[p.value for p in ThrottlePolicy],
        default=defaults["throttle_policy"].value,
        help="throttle_policy: fixed waits, or adaptive to the measured drain rate",
    )
    resume.add_argument("--wait", action="store_true", help="wait for the result and print it")
    resume.add_argument("--force", action="store_true", help="start even if the experiment holds nothing")

    demo = sub.add_parser(
        "demo",
        help="replay held tasks end to end on local services",
        formatter_class=fmt,
        description="Replay held tasks end to end; starts redis-server and a Temporal dev "
        "server unless XMC_REDIS_URL / TEMPORAL_ADDRESS are set.",
    )
    demo.add_argument("--tasks", type=int, default=5_000, help="tasks to hold and replay")
    demo.add_argument("--rate", type=float, default=400.0, help="consumer rate, tasks per second in all")
    demo.add_argument("--consumers", type=int, default=4, help="consumers in the group")
    demo.add_argument("--threshold", type=int, default=500, help="max_backlog_threshold, entries")
    demo.add_argument("--batch", type=int, default=100, help="most tasks one publish moves")
    demo.add_argument("--throttle-seconds", type=float, default=2.0, help="one throttle wait, seconds")
    demo.add_argument("--policy", choices=[p.value for p in ThrottlePolicy], default=ThrottlePolicy.FIXED.value,
                      help="throttle_policy: fixed waits, or adaptive to the measured drain rate")  # fmt: skip
    demo.add_argument(
        "--linger", type=float, default=0.0, help="seconds to keep the services up at the end (Ctrl-C ends it early)"
    )
    demo.set_defaults(fn=_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the ``xmc`` command; returns its exit code (0, 1 for nothing to do, 2 for an operator
    error, 130 on Ctrl-C, 141 when stdout was closed)."""
    args = parser().parse_args(argv)
    settings: Settings | None = None
    try:
        settings = Settings()
        code: int = asyncio.run(args.fn(args, settings))
        sys.stdout.flush()  # a closed pipe fails here, inside the handler, not at interpreter exit
        return code
    except BrokenPipeError:
        # the reader went away (xmc status E | head): say nothing; point stdout at /dev/null so the
        # interpreter's last flush does not fail again (Python docs, "Note on SIGPIPE")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"xmc {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        message = operator_message(err, settings)
        if message is None:
            raise  # a bug: keep its traceback
        print(f"xmc {args.command}: {message}", file=sys.stderr)
        return EXIT_OPERATOR_ERROR
    finally:
        gc.collect()  # sdk-python#300: avoids an abort at interpreter exit (TEMPORAL_NOTES.md)


if __name__ == "__main__":
    sys.exit(main())
