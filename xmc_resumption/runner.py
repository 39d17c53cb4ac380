"""Run a Temporal worker until SIGINT or SIGTERM, as the stand-alone worker runs: ``run_worker``.

For a platform's own worker application hosting the resumption through ``ResumptionPlugin``
(docs/embedding.md), and for ``python -m xmc_resumption.worker``, which uses it. What it does for
the process: SIGINT and SIGTERM handlers that stop polling; ``worker.shutdown()`` bounded by
``SHUTDOWN_LIMIT_SECONDS`` (a workflow task running local activities back to back keeps the SDK's
shutdown waiting); an error that stops the worker or its start (a plugin refusing it, Temporal out
of reach) raised to the caller; ``gc.collect()`` after ``asyncio.run`` (sdk-python#300: a process
that used the SDK can abort at interpreter exit otherwise). And one log line a record on stderr:
``setup_logging``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Awaitable, Callable

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter
from redis.exceptions import RedisError
from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from xmc_resumption.redisclient.text import one_line

__all__ = [
    "EXPECTED_FAULTS",
    "JSON_FIELDS",
    "JSON_LEFT_OUT",
    "JSON_RENAMES",
    "LOG_FORMAT",
    "SHUTDOWN_LIMIT_SECONDS",
    "ExpectedFaultFilter",
    "TextFormatter",
    "run_worker",
    "serve",
    "setup_logging",
]

log = logging.getLogger("xmc.worker")

SHUTDOWN_LIMIT_SECONDS = 15.0
"""How long a stopping worker waits for its shutdown at most (seconds). A workflow task that keeps
running local activities back to back (an adaptive replay polling, or publishing without a wait)
stays open, and temporalio 1.35's shutdown waits for it to end (measured: still blocked after
30 s). Past this limit the worker exits anyway, like a crash: every Redis step is atomic and
idempotent, and another worker takes the workflow over once its workflow task times out."""


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
"""The ``text`` format: one line a record; ``TextFormatter`` appends the ``extra`` fields."""

JSON_FIELDS = ("levelname", "name", "message")
"""The record attributes every JSON line starts with (after ``time``), renamed by ``JSON_RENAMES``;
every ``extra`` field of the call follows them, under its own name."""

JSON_RENAMES = {"levelname": "level", "name": "logger"}

JSON_LEFT_OUT = (*RESERVED_ATTRS, "temporal_log")
"""Record attributes that are not ``extra`` fields: the logging module's own, and the SDK core's
forwarded entry (``temporal_log``: its message and fields are already in ``message``)."""

EXPECTED_FAULTS = (RedisError, ApplicationError)
"""Exceptions whose message says all: a Redis fault (connection, timeout, error reply) and the
errors the activities raise on purpose (``activities/resumption.py`` ``_classified``)."""


class TextFormatter(logging.Formatter):
    """``LOG_FORMAT``, then every ``extra`` field of the call as `` key=value`` on the same line.

    The resumption's lines say what happened in their fields (a throttle wait's ``experiment_id``,
    ``reason`` and ``seconds``, an end's ``outcome`` and counts): without them a text line would drop it.
    A value is shown by ``one_line`` (``repr`` for text with spaces), so a record stays one line.
    """

    def __init__(self) -> None:
        super().__init__(LOG_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        """The record as ``LOG_FORMAT`` followed by its ``extra`` fields, sorted by name."""
        extras = sorted((k, v) for k, v in record.__dict__.items() if k not in JSON_LEFT_OUT and not k.startswith("_"))
        return " ".join([super().format(record), *(f"{k}={_shown(v)}" for k, v in extras)])


def _shown(value: object) -> str:
    """``value`` as ``TextFormatter`` shows it: one line, text with spaces (or none) quoted by ``repr``."""
    return one_line(repr(value) if isinstance(value, str) and (" " in value or not value) else str(value))


class ExpectedFaultFilter(logging.Filter):
    """Log an activity attempt that failed with an expected fault as one line, without traceback.

    temporalio logs every failed activity attempt on the ``temporalio.activity`` logger as
    ``Completing activity as failed`` with ``exc_info``: during a Redis outage the local
    activities' fast retries would flood the log with tracebacks. For an exception in
    ``EXPECTED_FAULTS`` the record keeps its level and the activity's details and gains
    ``error=Type: message`` on the same line; any other exception (a bug) keeps its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite ``record`` in place when it carries an expected fault; never drops a record."""
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, EXPECTED_FAULTS):
            record.msg = f"{record.getMessage()} error={type(exc).__name__}: {one_line(str(exc))}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def setup_logging(log_format: str = "json", level: int = logging.INFO) -> None:
    """Log to stderr, one line per record; expected activity faults without traceback.

    Args:
        log_format: ``json`` (``XMC_LOG_FORMAT``'s default): one JSON object a line (python-json-logger)
            with ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message`` and every ``extra``
            field of the call, e.g. a throttle wait's ``experiment_id``, ``reason`` and ``seconds``,
            and the SDK's ``temporal_workflow`` / ``temporal_activity`` context (workflow ID, run
            ID, attempt) as objects. The SDK loggers then stop appending that context to the
            message as text. The SDK core's own warnings arrive on the logger
            ``temporalio.core-...`` (``settings.sdk_runtime``), in the same format. ``text``:
            ``LOG_FORMAT`` with the ``extra`` fields appended as ``key=value`` (``TextFormatter``).
        level: the root logger's level.
    """
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(
            JsonFormatter(JSON_FIELDS, rename_fields=JSON_RENAMES, timestamp="time", reserved_attrs=JSON_LEFT_OUT)
        )
        workflow.logger.workflow_info_on_message = False
        activity.logger.activity_info_on_message = False
    else:
        handler.setFormatter(TextFormatter())
    handler.addFilter(ExpectedFaultFilter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.captureWarnings(True)  # warnings too, in the same format (logger ``py.warnings``)


async def serve(worker: Worker, stop: asyncio.Event, *, shutdown_limit: float = SHUTDOWN_LIMIT_SECONDS) -> None:
    """Run ``worker`` until ``stop`` is set, then shut it down within ``shutdown_limit`` seconds.

    Running activities get the worker's ``graceful_shutdown_timeout`` to finish; past
    ``shutdown_limit`` the call returns with a warning, the worker still busy (see
    ``SHUTDOWN_LIMIT_SECONDS``).

    Raises:
        Exception: whatever stopped the worker before ``stop`` (``Worker.run``: a plugin that refused
            the start, e.g. ``SearchAttributesMissingError``; a fatal poll error).
    """
    running = asyncio.create_task(worker.run())
    deployment = worker.config(active_config=True).get("deployment_config")
    if deployment is not None and deployment.use_worker_versioning:
        version = deployment.version
        log.info(
            "worker polling task queue %s as Worker Deployment Version %s.%s",
            worker.task_queue,
            version.deployment_name,
            version.build_id,
        )
    else:
        log.info("worker polling task queue %s", worker.task_queue)
    await asyncio.wait([running, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    if running.done():
        running.result()  # the worker failed, or a plugin refused to start it: raise why
    log.info("stopping worker")
    try:
        await asyncio.wait_for(asyncio.shield(worker.shutdown()), shutdown_limit)
    except TimeoutError:
        log.warning(
            "worker still busy after %gs (a workflow task running local activities back to back); "
            "exiting: another worker takes it over after its workflow task times out",
            shutdown_limit,
        )
        return
    await running  # plugins clean up (ResumptionPlugin closes its Redis client) when the run ends


def run_worker(make_worker: Callable[[], Awaitable[Worker]], *, shutdown_limit: float = SHUTDOWN_LIMIT_SECONDS) -> None:
    """Build a worker with ``make_worker`` and run it until SIGINT or SIGTERM; returns once it stopped.

    Blocking: it runs its own event loop (``asyncio.run``), installs the signal handlers before it
    calls ``make_worker`` (a signal while connecting stops the worker as soon as it is built), runs
    it with ``serve`` and calls ``gc.collect()`` after the loop ends, whatever happened.

    Args:
        make_worker: an async function that connects the client and returns the ``Worker`` (e.g.
            with ``ResumptionPlugin`` on its client); called on the runner's event loop.
        shutdown_limit: the bound on the shutdown (seconds, > 0).

    Raises:
        ValueError: ``shutdown_limit`` is not a positive finite number.
        Exception: whatever ``make_worker`` or the worker raised (``serve``), unchanged.
    """
    if not 0 < shutdown_limit < float("inf"):
        raise ValueError(f"shutdown_limit must be a positive number of seconds, got {shutdown_limit}")
    try:
        asyncio.run(_until_signalled(make_worker, shutdown_limit))
    finally:
        gc.collect()  # sdk-python#300: avoids an abort at interpreter exit (docs/development.md, "Temporal facts")


async def _until_signalled(make_worker: Callable[[], Awaitable[Worker]], shutdown_limit: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    worker = await make_worker()
    await serve(worker, stop, shutdown_limit=shutdown_limit)
