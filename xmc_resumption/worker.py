"""Run a Temporal worker for xmc-resumption: ``python -m xmc_resumption.worker`` (``make worker``).

From a checkout, ``python -m worker`` runs the same (the shim ``worker.py`` at the top).

A thin user of ``xmc_resumption.plugin.ResumptionPlugin``, which registers ``ResumptionWorkflow``
and its activities, owns their Redis client and checks the namespace's search attributes; this
module adds the process: the task queue ``XMC_TASK_QUEUE`` (default ``xmc-resumption``), Temporal
from envconfig (``TEMPORAL_ADDRESS``, ...), Redis from ``XMC_REDIS_URL`` (checked once before
connecting to Temporal, ``check_redis``), Prometheus metrics on ``XMC_METRICS_BIND`` when set, log
lines on stderr as JSON or text (``XMC_LOG_FORMAT``, default ``json``; ``setup_logging``), and the
signals and the shutdown bound: SIGINT or SIGTERM stops polling, lets running activities finish (up
to 10 s) and exits 0 (after ``SHUTDOWN_LIMIT_SECONDS`` at most); running workflows continue on any
other worker, their durable timers intact.

Bad settings, an unreachable Temporal or a Redis that refuses the configuration (a database that
does not exist, wrong credentials, an endpoint that is not Redis) print one line and exit 2
(``xmc_resumption.errors``). A Redis that is merely down at start is waited out like any outage.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from datetime import timedelta

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter
from redis.exceptions import AuthenticationError, InvalidResponse, RedisError, ResponseError
from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from xmc_resumption.errors import EXIT_OPERATOR_ERROR, is_certificate_refused, operator_message, redis_message
from xmc_resumption.plugin import ResumptionPlugin
from xmc_resumption.redisclient.acl import is_denial
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.keys import DEFAULT_STREAM
from xmc_resumption.redisclient.memory import read_memory
from xmc_resumption.redisclient.text import one_line
from xmc_resumption.settings import Settings, connect_temporal

log = logging.getLogger("xmc.worker")


GRACEFUL_SHUTDOWN = timedelta(seconds=10)
"""How long a stopping worker lets running activities finish."""

SHUTDOWN_LIMIT_SECONDS = 15.0
"""How long a stopping worker waits for its shutdown at most (seconds). A workflow task that keeps
running local activities back to back (an adaptive replay polling, or publishing without a wait)
stays open, and temporalio 1.35's shutdown waits for it to end (measured: still blocked after
30 s). Past this limit the worker exits anyway, like a crash: every Redis step is atomic and
idempotent, and another worker takes the workflow over once its workflow task times out."""


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
"""The ``text`` format: one line a record; ``extra`` fields are not shown."""

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
            ``LOG_FORMAT``, without the ``extra`` fields.
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
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(ExpectedFaultFilter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.captureWarnings(True)  # warnings too, in the same format (logger ``py.warnings``)


async def check_redis(settings: Settings) -> None:
    """Ping Redis once at start: raise on a configuration it refuses, warn on an outage or an evicting policy.

    A configuration it refuses (``ResponseError`` such as ``DB index is out of range``, bad
    credentials, an endpoint that is not Redis, a server certificate that ``XMC_REDIS_TLS_CA_FILE`` does
    not verify) is raised; a Redis that is down only logs a warning, since the replay waits out outages
    by itself. A ``maxmemory-policy`` that could evict the replay's keys (anything but ``noeviction``,
    ``redisclient.memory``) logs a warning too: the worker starts, and every resumption on that Redis
    fails at its claim.
    """
    redis = settings.redis()
    try:
        await redis.ping()
        await _warn_about_eviction(redis)
    except (ResponseError, AuthenticationError, InvalidResponse):
        raise
    except RedisError as err:
        if is_certificate_refused(err):
            raise  # a wrong XMC_REDIS_TLS_CA_FILE: no retry mends it
        log.warning(
            "%s; the worker starts anyway and waits for it",
            redis_message(err, settings.redis_url, settings.redis_timeout_seconds),
        )
    finally:
        await redis.aclose()


async def _warn_about_eviction(redis: RedisClient) -> None:
    """Log a warning when Redis's eviction policy would make every resumption fail, or cannot be read.

    It cannot be read by an ACL user without ``+info`` (the scripts need INFO too).
    """
    try:
        memory = await read_memory(redis, DEFAULT_STREAM)
    except ResponseError as err:
        if is_denial(err) and "key" in str(err).lower():
            # an ACL user whose key patterns are another stream's: nothing to conclude here
            log.info(
                "cannot check Redis's maxmemory-policy at start: stream %s is outside this ACL user's keys; "
                "every resumption checks it at its claim",
                DEFAULT_STREAM,
            )
            return
        log.warning(
            "cannot read Redis's maxmemory-policy (INFO memory): %s; every resumption will fail", one_line(str(err))
        )
        return
    if memory.problem:
        log.warning("%s; every resumption on this Redis fails until then", memory.problem)


async def run_worker(settings: Settings, stop: asyncio.Event) -> None:
    """Run a worker with ``ResumptionPlugin`` until ``stop`` is set.

    With ``XMC_DEPLOYMENT_NAME`` and ``XMC_BUILD_ID`` the plugin runs it as that Worker Deployment Version.

    Raises:
        TemporalUnreachableError: Temporal cannot be reached (``connect_temporal``).
        SearchAttributesMissingError: the namespace lacks the fleet view's search attributes.
        Exception: whatever else stops the worker (``Worker.run``).
    """
    client = await connect_temporal(metrics_bind=settings.metrics_bind, forward_core_logs=True)
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        plugins=[ResumptionPlugin(settings)],
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
    )
    running = asyncio.create_task(worker.run())
    version = settings.deployment_version()
    if version is None:
        log.info("worker polling task queue %s", settings.task_queue)
    else:
        log.info(
            "worker polling task queue %s as Worker Deployment Version %s.%s",
            settings.task_queue,
            version.deployment_name,
            version.build_id,
        )
    await asyncio.wait([running, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    if running.done():
        running.result()  # the worker failed, or the plugin refused to start it: raise why
    log.info("stopping worker")
    try:
        await asyncio.wait_for(asyncio.shield(worker.shutdown()), SHUTDOWN_LIMIT_SECONDS)
    except TimeoutError:
        log.warning(
            "worker still busy after %gs (a workflow task running local activities back to back); "
            "exiting: another worker takes it over after its workflow task times out",
            SHUTDOWN_LIMIT_SECONDS,
        )
        return
    await running  # the plugin closes its Redis client when the run ends


async def main(settings: Settings) -> None:
    """Run the worker with ``settings`` until SIGINT/SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await check_redis(settings)
    await run_worker(settings, stop)


def cli() -> int:
    """Entry point of ``python -m xmc_resumption.worker`` (and ``python -m worker``); returns the exit code.

    Settings from the environment; an operator error (``xmc_resumption.errors.operator_message``) is one
    line on stderr and exit 2, a bug keeps its traceback.
    """
    settings: Settings | None = None
    try:
        settings = Settings()
        setup_logging(settings.log_format)
        asyncio.run(main(settings))
        return 0
    except Exception as err:
        message = operator_message(err, settings)
        if message is None:
            raise
        print(f"worker: {message}", file=sys.stderr)
        return EXIT_OPERATOR_ERROR
    finally:
        gc.collect()  # sdk-python#300: avoids an abort at interpreter exit (docs/development.md, "Temporal facts")


if __name__ == "__main__":
    sys.exit(cli())
