"""The demo: 5,000 held tasks replayed into a Redis stream under a real Temporal server.

Starts what is not configured (a redis-server unless ``XMC_REDIS_URL`` is set, a Temporal dev
server with its web UI on port 8233 unless ``TEMPORAL_ADDRESS`` is set), runs the worker in its
own process, pauses an experiment, holds the tasks, starts consumers that drain the stream at a
modest rate, starts the workflow, draws a progress bar from the ``progress`` query, and checks at
the end that every task reached the stream exactly once and in order.

SIGTERM and SIGINT stop it: the consumers, the worker, the Temporal dev server and the redis-server
it started are all stopped before it exits (``run_demo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.exceptions import ResponseError
from temporalio.client import Client, WorkflowHandle

from xmc_resumption.consumer import entries_of, run_consumer
from xmc_resumption.history import history_events_per_run
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import DEFAULT_GROUP, DEFAULT_STREAM, ExperimentKeys
from xmc_resumption.runs import start_resumption
from xmc_resumption.services import free_port, local_redis, local_temporal, port_is_free, stop_process
from xmc_resumption.settings import Settings, connect_temporal
from xmc_resumption.workflows.models import ResumptionInput, ResumptionResult, ThrottlePolicy
from xmc_resumption.workflows.resumption import ResumptionWorkflow

STATE_DIR = Path(".xmc")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that stop the demo and everything it started: ``kill`` (and ``make``, which passes
SIGTERM on to its recipe) and Ctrl-C."""

CANCEL_RETRY_SECONDS = 0.5
"""How often the cancel a stop signal makes is repeated until the demo has stopped (seconds).
Python 3.11's ``asyncio.wait_for``, which redis-py awaits in every command, drops a cancel that
arrives as its command completes (CPython gh-86296, fixed in 3.12). Measured here with one cancel:
3 of 30 stop signals sent while the demo started up or enqueued its tasks were lost (the demo ran
to its end); with the retry, 0 of 30."""

WORKER_STOP_SECONDS = 30.0
"""How long the demo waits for its worker to exit after SIGTERM before killing it (seconds): the
worker itself exits within ``worker.SHUTDOWN_LIMIT_SECONDS`` (15 s)."""


@dataclass
class DemoOptions:
    """Knobs of the demo.

    Tasks (entries), consumer rate (tasks per second, all consumers), threshold (entries), batch
    (entries; None: automatic), throttle wait (seconds), linger (seconds to keep the services up at the end for the
    web UI).
    """

    tasks: int = 5_000
    consumers: int = 4
    rate: float = 400.0
    threshold: int = ResumptionInput.model_fields["max_backlog_threshold"].default
    batch: int | None = ResumptionInput.model_fields["batch_size"].default
    throttle_seconds: float = 2.0
    """The demo's own: shorter than ``ResumptionInput``'s, so that its waits show in a short run."""
    policy: str = ResumptionInput.model_fields["throttle_policy"].default.value
    linger: float = 0.0
    stream: str = DEFAULT_STREAM
    group: str = DEFAULT_GROUP

    def resumption_input(self, experiment: str) -> ResumptionInput:
        """The workflow input of the demo's resumption of ``experiment``.

        Raises:
            pydantic.ValidationError: a knob breaks a bound or a rule of ``ResumptionInput``
                (e.g. a throttle wait longer than the claim's lease); checked by the CLI before
                any service starts.
        """
        return ResumptionInput(
            experiment_id=experiment,
            stream=self.stream,
            consumer_group=self.group,
            batch_size=self.batch,
            max_backlog_threshold=self.threshold,
            throttle_seconds=self.throttle_seconds,
            throttle_policy=ThrottlePolicy(self.policy),
        )


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = width * done // max(total, 1)
    return "[" + "#" * filled + "." * (width - filled) + "]"


async def _history_events(client: Client, handle: WorkflowHandle[Any, Any]) -> tuple[int, int]:
    """(events over all runs, runs), following the continue-as-new chain from the first run."""
    per_run = await history_events_per_run(client, handle)
    return sum(per_run), len(per_run)


async def _run(settings: Settings, opts: DemoOptions, temporal_address: str) -> int:
    os.environ["TEMPORAL_ADDRESS"] = temporal_address
    client = await connect_temporal()
    redis = settings.redis()
    worker_env = {**os.environ, "XMC_REDIS_URL": settings.redis_url, "XMC_TASK_QUEUE": settings.task_queue}
    worker_log = open(STATE_DIR / "worker.log", "ab")  # noqa: SIM115
    worker = subprocess.Popen(
        [sys.executable, "-m", "xmc_resumption.worker"], env=worker_env, stdout=worker_log, stderr=subprocess.STDOUT
    )
    stop = asyncio.Event()
    consumed: list[bytes] = []
    consumers: list[asyncio.Task[None]] = []
    try:
        experiment = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
        keys = ExperimentKeys(opts.stream, experiment)
        with contextlib.suppress(ResponseError):  # BUSYGROUP: the group exists already
            await redis.xgroup_create(opts.stream, opts.group, id="$", mkstream=True)
        # the demo checks only what follows the stream's current tail (a configured Redis may hold more)
        newest = await redis.xrevrange(opts.stream, count=1)
        tail = entries_of([(opts.stream, newest)])[0][0].decode() if newest else "0-0"
        await held.pause(redis, keys)
        names = [f"{experiment}:{i:05d}".encode() for i in range(opts.tasks)]
        t0 = time.monotonic()
        for i, name in enumerate(names):
            await held.enqueue_task(redis, keys, {b"task": name, b"n": str(i).encode()})
        print(f"experiment {experiment}: paused, {opts.tasks} tasks held in {time.monotonic() - t0:.1f} s")
        consumers = [
            asyncio.create_task(
                run_consumer(
                    redis,
                    opts.stream,
                    opts.group,
                    f"demo-consumer-{i}",
                    stop,
                    consumed,
                    rate=opts.rate / opts.consumers,
                )
            )
            for i in range(opts.consumers)
        ]
        inp = opts.resumption_input(experiment)
        started = time.monotonic()
        handle = await start_resumption(client, inp, settings.task_queue)
        print(
            f"started workflow {handle.id} on task queue {settings.task_queue} "
            f"(threshold {opts.threshold}, batch {opts.batch or 'automatic'}, "
            f"{opts.policy} throttle {opts.throttle_seconds:g} s, "
            f"consumers {opts.rate:g} tasks/s)"
        )
        result_task: asyncio.Task[ResumptionResult] = asyncio.create_task(handle.result())
        tty, last = sys.stdout.isatty(), ""
        while not result_task.done():
            with contextlib.suppress(Exception):  # the first workflow task may not have run yet
                p = await handle.query(ResumptionWorkflow.progress)
                line = (
                    f"{_bar(p.replayed, opts.tasks)} {p.replayed}/{opts.tasks} replayed | backlog "
                    f"{p.backlog if p.backlog is not None else '?'}/{p.threshold} | throttles {p.throttles} "
                    f"| {p.phase.value:<10}"
                )
                if tty:
                    print("\r" + line, end="", flush=True)
                elif line.split("|")[0] != last.split("|")[0]:  # a line per change when piped to a log
                    print(line.rstrip(), flush=True)
                last = line
            await asyncio.wait([result_task], timeout=0.25)
        result = result_task.result()
        wall = time.monotonic() - started
        print(
            ("\r" if tty else "")
            + f"{_bar(result.replayed, opts.tasks)} {result.replayed}/{opts.tasks} replayed"
            + " " * 40
        )
        while (await redis.xpending(opts.stream, opts.group))["pending"] or len(consumed) < opts.tasks:
            await asyncio.sleep(0.1)
            if time.monotonic() - started > wall + 120:
                break
        stop.set()
        await asyncio.gather(*consumers)
        events, runs = await _history_events(client, handle)
        prefix = experiment.encode() + b":"
        in_stream = [
            f[b"task"]
            for _, f in entries_of([(opts.stream, await redis.xrange(opts.stream, min=f"({tail}"))])
            if f.get(b"task", b"").startswith(prefix)
        ]
        mine = [t for t in consumed if t.startswith(prefix)]
        checks = {
            "every task in the stream exactly once, in order": in_stream == names,
            "every task consumed exactly once": sorted(mine) == names,
            "held stream drained, experiment running": await held.held_count(redis, keys) == 0
            and (await held.get_state(redis, keys)).value == "running",
        }
        if opts.tasks > opts.threshold:  # fewer tasks than the threshold never engage the throttle
            checks["throttle engaged"] = result.throttles >= 1
        print(
            f"outcome: {result.outcome.value}; {result.replayed} tasks replayed in {wall:.1f} s; "
            f"{result.throttles} throttle waits; {result.turns} turns; {runs} run(s), {events} history events"
        )
        for check, ok in checks.items():
            print(f"  [{'ok' if ok else 'FAILED'}] {check}")
        if opts.linger:
            print(
                f"services stay up for {opts.linger:g} s (Ctrl-C ends it early). In another shell:\n"
                f"  export TEMPORAL_ADDRESS={temporal_address} XMC_REDIS_URL={settings.redis_location()}\n"
                f"  .venv/bin/temporal workflow show --address {temporal_address} -w {handle.id}\n"
                f"  .venv/bin/xmc status {experiment}"
            )
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(opts.linger)
        return 0 if all(checks.values()) and result.outcome.value == "completed" else 1
    finally:
        stop.set()
        for task in consumers:
            task.cancel()
        stop_process(worker, timeout=WORKER_STOP_SECONDS)
        worker_log.close()
        await redis.aclose()


async def run_demo(opts: DemoOptions) -> int:
    """Run the demo; returns the process exit code.

    0 when every check passed, 1 when one failed, 128 + the signal's number (143, 130) when SIGTERM or
    SIGINT stopped it.

    A stop signal cancels the demo where it is (again every ``CANCEL_RETRY_SECONDS`` until it has
    stopped); its cleanup then stops the consumers, the worker (SIGTERM, SIGKILL after
    ``WORKER_STOP_SECONDS``) and the services it started (SIGTERM, SIGKILL after 10 s). A signal
    that arrives while a service is starting takes effect once that service listens (within its
    start timeout: 10 s for redis-server, 60 s for Temporal). During ``--linger`` a signal ends the
    lingering early and the demo ends as after it. Must run in the main thread (signal handlers).
    """
    STATE_DIR.mkdir(exist_ok=True)
    loop, demo = asyncio.get_running_loop(), asyncio.current_task()
    assert demo is not None  # called from a task: asyncio.run
    received: list[int] = []
    retry: asyncio.TimerHandle | None = None

    def cancel_until_stopped() -> None:  # see CANCEL_RETRY_SECONDS
        nonlocal retry
        demo.cancel()
        retry = loop.call_later(CANCEL_RETRY_SECONDS, cancel_until_stopped)

    def on_signal(signum: int) -> None:
        if not received:  # a second signal changes nothing: the demo is stopping
            received.append(signum)
            cancel_until_stopped()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return await _run_with_services(opts)
    except asyncio.CancelledError:
        if not received:
            raise
        while demo.uncancel():  # the cancels were ours, and are answered: the demo has stopped
            pass
        print(f"\n{signal.Signals(received[0]).name}: stopped the demo and everything it started", file=sys.stderr)
        return 128 + received[0]
    finally:
        if retry is not None:
            retry.cancel()
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


async def _run_with_services(opts: DemoOptions) -> int:
    """Start the services that are not configured, run the demo, stop them again."""
    with contextlib.ExitStack() as services:
        if "XMC_REDIS_URL" not in os.environ:
            url = services.enter_context(local_redis(log_file=STATE_DIR / "redis.log"))
            print(f"started redis-server at {url} (set XMC_REDIS_URL to use your own)")
            os.environ["XMC_REDIS_URL"] = url
        address = os.environ.get("TEMPORAL_ADDRESS")
        if not address:
            port = 7233 if port_is_free(7233) else free_port()
            ui = 8233 if port_is_free(8233) else free_port()
            address = services.enter_context(local_temporal(port=port, ui_port=ui, log_file=STATE_DIR / "temporal.log"))
            print(
                f"started Temporal dev server at {address}, web UI http://127.0.0.1:{ui} "
                "(set TEMPORAL_ADDRESS to use your own)"
            )
        return await _run(Settings(), opts, address)
