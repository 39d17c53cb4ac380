"""Run a Temporal worker for xmc-resumption: ``python -m xmc_resumption.worker`` (``make worker``).

From a checkout, ``python -m worker`` runs the same (the shim ``worker.py`` at the top).

A thin user of ``xmc_resumption.plugin.ResumptionPlugin``, which registers ``ResumptionWorkflow``
and its activities, owns their Redis client and checks the namespace's search attributes; this
module adds the process: the task queue ``XMC_TASK_QUEUE`` (default ``xmc-resumption``), Temporal
from envconfig (``TEMPORAL_ADDRESS``, ...), Redis from ``XMC_REDIS_URL`` (checked once before
connecting to Temporal, ``check_redis``), Prometheus metrics on ``XMC_METRICS_BIND`` when set, log
lines on stderr as JSON or text (``XMC_LOG_FORMAT``, default ``json``; ``runner.setup_logging``).
The process is ``xmc_resumption.runner.run_worker``'s: SIGINT or SIGTERM stops polling, lets running
activities finish (up to 10 s) and exits 0 (after ``SHUTDOWN_LIMIT_SECONDS`` at most); running
workflows continue on any other worker, their durable timers intact.

Bad settings, an unreachable Temporal or a Redis that refuses the configuration (a database that
does not exist, wrong credentials, an endpoint that is not Redis) print one line and exit 2
(``xmc_resumption.errors``). A Redis that is merely down at start is waited out like any outage.
"""

from __future__ import annotations

import functools
import logging
import sys

from redis.exceptions import AuthenticationError, InvalidResponse, RedisError, ResponseError
from temporalio.worker import Worker

from xmc_resumption.errors import EXIT_OPERATOR_ERROR, is_certificate_refused, operator_message, redis_message
from xmc_resumption.plugin import GRACEFUL_SHUTDOWN, ResumptionPlugin
from xmc_resumption.redisclient.acl import is_denial
from xmc_resumption.redisclient.connection import RedisClient
from xmc_resumption.redisclient.keys import DEFAULT_STREAM
from xmc_resumption.redisclient.memory import read_memory
from xmc_resumption.redisclient.text import one_line
from xmc_resumption.runner import JSON_FIELDS as JSON_FIELDS
from xmc_resumption.runner import JSON_RENAMES as JSON_RENAMES
from xmc_resumption.runner import SHUTDOWN_LIMIT_SECONDS as SHUTDOWN_LIMIT_SECONDS
from xmc_resumption.runner import run_worker, setup_logging
from xmc_resumption.settings import Settings, connect_temporal

log = logging.getLogger("xmc.worker")


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


async def build_worker(settings: Settings) -> Worker:
    """Check Redis once, connect to Temporal and build the worker with ``ResumptionPlugin``.

    With ``XMC_DEPLOYMENT_NAME`` and ``XMC_BUILD_ID`` the plugin runs it as that Worker Deployment Version. It runs
    at most ``XMC_MAX_CONCURRENT_WORKFLOW_TASKS`` workflow tasks at once (docs/scale.md, "How many workers").

    Raises:
        TemporalUnreachableError: Temporal cannot be reached (``connect_temporal``).
        RedisError: a Redis configuration that Redis refuses (``check_redis``).
    """
    await check_redis(settings)
    client = await connect_temporal(metrics_bind=settings.metrics_bind, forward_core_logs=True)
    return Worker(
        client,
        task_queue=settings.task_queue,
        plugins=[ResumptionPlugin(settings)],
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        max_concurrent_workflow_tasks=settings.max_concurrent_workflow_tasks,
    )


def cli() -> int:
    """Entry point of ``python -m xmc_resumption.worker`` (and ``python -m worker``); returns the exit code.

    Settings from the environment; an operator error (``xmc_resumption.errors.operator_message``) is one
    line on stderr and exit 2, a bug keeps its traceback.
    """
    settings: Settings | None = None
    try:
        settings = Settings()
        setup_logging(settings.log_format)
        run_worker(functools.partial(build_worker, settings))  # until SIGINT or SIGTERM
        return 0
    except Exception as err:
        message = operator_message(err, settings)
        if message is None:
            raise
        print(f"worker: {message}", file=sys.stderr)
        return EXIT_OPERATOR_ERROR


if __name__ == "__main__":
    sys.exit(cli())
