"""The ``xmc`` command: ``xmc demo``, ``xmc pause E``, ``xmc enqueue E``, ``xmc status E``, ``xmc resume E``.

Redis from ``XMC_REDIS_URL``, Temporal from envconfig (``TEMPORAL_ADDRESS``, ...), like the worker.
Errors an operator can mend (bad arguments, Redis or Temporal unreachable, a resumption already
running) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
from collections.abc import Awaitable, Callable

from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from temporalio.exceptions import WorkflowAlreadyStartedError

from redisclient import held
from redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys
from redisclient.results import ExperimentState
from workflows.models import ResumptionInput, ThrottlePolicy
from xmc.demo import DemoOptions, run_demo
from xmc.ops import experiment_status, start_resumption
from xmc.settings import Settings, connect_temporal

DESCRIPTION = (
    "Operate xmc-resumption: pause experiments, enqueue tasks, inspect them, start resumptions, run the demo. "
    "Redis from XMC_REDIS_URL; Temporal from TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE / profiles."
)


async def _pause(args: argparse.Namespace) -> int:
    redis = Settings().redis()
    await held.pause(redis, ExperimentKeys(args.stream, args.experiment_id))
    print(f"experiment {args.experiment_id} paused: its new tasks are held")
    await redis.aclose()
    return 0


async def _enqueue(args: argparse.Namespace) -> int:
    redis = Settings().redis()
    keys = ExperimentKeys(args.stream, args.experiment_id)
    where: dict[str, int] = {}
    for i in range(args.count):
        dest, _ = await held.enqueue_task(redis, keys, {"task": f"{args.experiment_id}:{i:06d}", "n": i})
        where[dest] = where.get(dest, 0) + 1
    print(json.dumps({"experiment_id": args.experiment_id, "enqueued": where}))
    await redis.aclose()
    return 0


async def _status(args: argparse.Namespace) -> int:
    redis = Settings().redis()
    status = await experiment_status(redis, ExperimentKeys(args.stream, args.experiment_id), args.group, args.threshold)
    print(json.dumps(status, indent=2))
    await redis.aclose()
    return 0


async def _resume(args: argparse.Namespace) -> int:
    settings = Settings()
    redis = settings.redis()
    keys = ExperimentKeys(args.stream, args.experiment_id)
    state, waiting = await held.get_state(redis, keys), await held.held_count(redis, keys)
    await redis.aclose()
    if state is ExperimentState.RUNNING and not waiting and not args.force:
        print(
            f"experiment {args.experiment_id} is running and holds no tasks: nothing to resume "
            "(--force starts the workflow anyway)",
            file=sys.stderr,
        )
        return 1
    inp = ResumptionInput(
        experiment_id=args.experiment_id,
        stream=args.stream,
        consumer_group=args.group,
        batch_size=args.batch,
        max_backlog_threshold=args.threshold,
        throttle_seconds=args.throttle_seconds,
        throttle_policy=ThrottlePolicy(args.policy),
    )
    client = await connect_temporal()
    handle = await start_resumption(client, inp, settings.task_queue)
    print(f"started {handle.id} (run {handle.result_run_id})")
    if args.wait:
        print((await handle.result()).model_dump_json(indent=2))
    return 0


async def _demo(args: argparse.Namespace) -> int:
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
    p = argparse.ArgumentParser(prog="xmc", description=DESCRIPTION, formatter_class=fmt)
    sub = p.add_subparsers(dest="command", required=True)

    def experiment_cmd(name: str, help_text: str, fn: Callable[[argparse.Namespace], Awaitable[int]]):  # type: ignore[no-untyped-def]
        cmd = sub.add_parser(name, help=help_text, description=help_text, formatter_class=fmt)
        cmd.add_argument("experiment_id", help="the experiment ID")
        cmd.add_argument("--stream", default=DEFAULT_STREAM, help="the task stream")
        cmd.set_defaults(fn=fn)
        return cmd

    experiment_cmd("pause", "pause an experiment: its new tasks are held", _pause)
    enqueue = experiment_cmd("enqueue", "enqueue synthetic tasks through the pause-aware script", _enqueue)
    enqueue.add_argument("--count", type=int, default=100, help="tasks to enqueue")
    status = experiment_cmd("status", "print state, held tasks, claim, fencing token and backlog as JSON", _status)
    status.add_argument("--group", default=DEFAULT_GROUP, help="the consumer group")
    status.add_argument("--threshold", type=int, default=500, help="count the backlog up to this many entries")
    resume = experiment_cmd("resume", "start ResumptionWorkflow for the experiment (ID resumption-<E>)", _resume)
    resume.add_argument("--group", default=DEFAULT_GROUP, help="the consumer group whose backlog throttles")
    resume.add_argument("--batch", type=int, default=100, help="most tasks one publish moves")
    resume.add_argument("--threshold", type=int, default=500, help="max_backlog_threshold, entries")
    resume.add_argument("--throttle-seconds", type=float, default=10.0, help="one throttle wait, seconds")
    resume.add_argument("--policy", choices=[p.value for p in ThrottlePolicy], default=ThrottlePolicy.FIXED.value,
                        help="throttle_policy: fixed waits, or adaptive to the measured drain rate")  # fmt: skip
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
    """Run the ``xmc`` command; returns its exit code."""
    args = parser().parse_args(argv)
    try:
        return asyncio.run(args.fn(args))
    except ValidationError as err:
        print(f"xmc {args.command}: invalid input: {err}", file=sys.stderr)
    except RedisConnectionError as err:
        print(f"xmc {args.command}: cannot reach Redis at {Settings().redis_url}: {err}", file=sys.stderr)
    except WorkflowAlreadyStartedError as err:
        print(f"xmc {args.command}: a resumption is already running: {err}", file=sys.stderr)
    except RuntimeError as err:  # what Client.connect raises when Temporal is unreachable
        print(f"xmc {args.command}: {err}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"xmc {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        gc.collect()  # sdk-python#300: avoids an abort at interpreter exit (TEMPORAL_NOTES.md)
    return 2


if __name__ == "__main__":
    sys.exit(main())
