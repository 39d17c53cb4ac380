"""A typed client for producers and operators: ``XmcClient`` (asyncio) and ``XmcSyncClient`` (blocking).

Producers pause an experiment and enqueue its tasks: ``pause``, ``enqueue``, ``enqueue_many`` (any
number of tasks, in atomic script calls of up to ``MAX_ENQUEUE_TASKS``), each task optionally with
an idempotency key so that a retry after a lost reply adds it once, and each call with a request ID
so that such a retry answers as the lost send would have. The contract behind them, for producers in any
language: docs/producers.md. Operators start, watch and stop resumptions: ``resume`` (one or many
experiments, with the checks ``xmc resume`` makes), ``plan``, ``stop``, ``configure``, ``status``,
``held``, ``list_resumptions``; ``XmcSyncClient`` offers every one of them. The ``xmc`` command is
a user of this module.

Retries: a client made by ``from_settings`` turns redis-py's own retries off, because redis-py
sends a command again after a connection error, and a command whose reply was lost has run: an
enqueue without a key would be added twice. This module retries, ``retries`` times with a short
backoff, only what is safe to send twice: reads, the pause (a ``SET``), and an enqueue whose every
task has an idempotency key. A client built from a Redis client of your own keeps that client's
retry policy for everything.

``XmcSyncClient`` runs the producer calls on a blocking redis-py client (no event loop). The
operator calls need Temporal, whose SDK is asyncio only: they run an ``XmcClient`` on one event
loop in a thread of the sync client's own, started at the first such call.
"""

from xmc_resumption.client.aio import XmcClient
from xmc_resumption.client.sync import XmcSyncClient
from xmc_resumption.client.views import (
    BacklogSummary,
    ExperimentStatus,
    FleetRow,
    HeldRow,
    NothingToResumeError,
    ResumeError,
    Stopping,
)
from xmc_resumption.redisclient.held import MAX_ENQUEUE_TASKS, Enqueued, EnqueueInterruptedError, FieldValue, Task

__all__ = [
    "MAX_ENQUEUE_TASKS",
    "BacklogSummary",
    "EnqueueInterruptedError",
    "Enqueued",
    "ExperimentStatus",
    "FieldValue",
    "FleetRow",
    "HeldRow",
    "NothingToResumeError",
    "ResumeError",
    "Stopping",
    "Task",
    "XmcClient",
    "XmcSyncClient",
]
