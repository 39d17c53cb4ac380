"""Run a Temporal worker for xmc-resumption: ``python worker.py``.

Registers ``ResumptionWorkflow`` and its activities on the task queue ``XMC_TASK_QUEUE`` (default
``xmc-resumption``). Temporal from envconfig (``TEMPORAL_ADDRESS``, ...), Redis from
``XMC_REDIS_URL``, Prometheus metrics on ``XMC_METRICS_BIND`` when set. SIGINT or SIGTERM stops
polling, lets running activities finish (up to 10 s) and exits 0 (after ``SHUTDOWN_LIMIT_SECONDS``
at most); running workflows continue on any other worker, their durable timers intact.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from datetime import timedelta

from temporalio.worker import Worker

from activities.resumption import ResumptionActivities
from workflows.resumption import ResumptionWorkflow
from xmc.settings import Settings, connect_temporal

log = logging.getLogger("xmc.worker")


GRACEFUL_SHUTDOWN = timedelta(seconds=10)
"""How long a stopping worker lets running activities finish."""

SHUTDOWN_LIMIT_SECONDS = 15.0
"""How long a stopping worker waits for its shutdown at most (seconds). A workflow task that keeps
running local activities back to back (an adaptive replay polling, or publishing without a wait)
stays open, and temporalio 1.35's shutdown waits for it to end (measured: still blocked after
30 s). Past this limit the worker exits anyway, like a crash: every Redis step is atomic and
idempotent, and another worker takes the workflow over once its workflow task times out."""


async def run_worker(settings: Settings, stop: asyncio.Event) -> None:
    """Run a worker until ``stop`` is set; raises what connecting to Temporal raises."""
    client = await connect_temporal(metrics_bind=settings.metrics_bind)
    redis = settings.redis()
    try:
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            workflows=[ResumptionWorkflow],
            activities=ResumptionActivities(redis).all(),
            graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        )
        running = asyncio.create_task(worker.run())
        log.info("worker polling task queue %s", settings.task_queue)
        await asyncio.wait([running, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        if running.done():
            running.result()  # the worker failed: raise why
        log.info("stopping worker")
        try:
            await asyncio.wait_for(asyncio.shield(worker.shutdown()), SHUTDOWN_LIMIT_SECONDS)
        except TimeoutError:
            log.warning(
                "worker still busy after %gs (a workflow task running local activities back to back); "
                "exiting: another worker takes it over after its workflow task times out",
                SHUTDOWN_LIMIT_SECONDS,
            )
    finally:
        await redis.aclose()


async def main() -> None:
    """Entry point: settings from the environment, stop on SIGINT/SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await run_worker(Settings(), stop)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(main())
    gc.collect()  # sdk-python#300: avoids an abort at interpreter exit (TEMPORAL_NOTES.md)
