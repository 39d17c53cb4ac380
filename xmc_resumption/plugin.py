"""``ResumptionPlugin``: xmc-resumption as a Temporal plugin for a platform's own client and worker.

Built on ``temporalio.plugin.SimplePlugin``; see docs/embedding.md.

Given to ``Client.connect(plugins=[ResumptionPlugin()])`` it configures that client and every
worker built from it; given to one ``Worker(..., plugins=[ResumptionPlugin()])``, that worker only
(its client must then carry the pydantic data converter already). Not both: the SDK would apply
it twice. On each worker it:

- registers ``ResumptionWorkflow`` and its activities (``activities.resumption``) beside the
  worker's own. The activities' Redis client is built from ``Settings`` (``XMC_REDIS_URL`` and the
  other ``XMC_REDIS_*`` variables) when the worker starts and closed when its run ends;
- checks, when the worker starts, that the namespace has the fleet view's search attributes
  (``workflows/fleet.py``): without them every resumption's workflow task fails for ever after
  its first upsert. A namespace that lacks some stops the start with one
  ``SearchAttributesMissingError`` naming them and the commands that register them;
- adds ``SANDBOX_PASSTHROUGH`` to a sandboxed workflow runner;
- with ``XMC_DEPLOYMENT_NAME`` and ``XMC_BUILD_ID`` set, turns Worker Versioning on
  (``deployment_config``), and on a worker with Worker Versioning registers the workflow pinned
  (``PinnedResumptionWorkflow``): each run stays on its release and the next run starts on the current one
  (docs/operating.md, "Rolling out a release").

On the client and on a ``Replayer`` it sets the pydantic data converter (``pydantic_converter``).
The metric conventions are the runtime's, which belongs to the process and not to a plugin:
``prometheus_runtime`` builds one that follows them (docs/embedding.md, "Metrics"). Where Temporal
is, is the SDK's envconfig's to say, as for ``xmc`` and the stand-alone worker:
``Client.connect(**temporal_connect_config(), plugins=[ResumptionPlugin()])``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import weakref
from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio.client import Client
from temporalio.common import VersioningBehavior
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import DataConverter, DefaultPayloadConverter
from temporalio.plugin import SimplePlugin
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker, WorkerConfig, WorkerDeploymentConfig, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from xmc_resumption import search_attributes
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.reconcile import ReconcileActivities
from xmc_resumption.settings import Settings, prometheus_runtime, temporal_connect_config
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.reconcile import ReconcileWorkflow
from xmc_resumption.workflows.resumption import ResumptionWorkflow
from xmc_resumption.workflows.versioned import AutoUpgradeReconcileWorkflow, PinnedResumptionWorkflow

GRACEFUL_SHUTDOWN = timedelta(seconds=10)
"""How long a stopping worker lets running activities finish, when its ``graceful_shutdown_timeout`` is the SDK's 0."""

__all__ = [
    "DEFAULT_VERSIONING_BEHAVIOR",
    "GRACEFUL_SHUTDOWN",
    "PLUGIN_NAME",
    "SANDBOX_PASSTHROUGH",
    "ResumptionPlugin",
    "deployment_config",
    "prometheus_runtime",
    "pydantic_converter",
    "sandbox_passthrough",
    "temporal_connect_config",
]

log = logging.getLogger("xmc.plugin")

PLUGIN_NAME = "xmc_resumption.ResumptionPlugin"
"""The plugin's ``name()``, as the worker reports it to the server."""

SANDBOX_PASSTHROUGH = (
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "redis",
    "xmc_resumption.activities",
    "xmc_resumption.redisclient",
    "xmc_resumption.workflows.models",
    "xmc_resumption.workflows.resumption",
    "xmc_resumption.workflows.versioned",
)
"""Modules that ``ResumptionWorkflow``'s sandbox takes from the worker process instead of
importing them again for each run: pydantic and the contract's models (one class each, so the
converter and the workflow agree on them), and the activity and Redis modules the workflow names in
its calls, with redis-py under them (they do I/O, which never runs in workflow code). The workflow
module passes them through where it imports them; on the runner they are passed through for every
workflow module of the worker, e.g. a platform's parent workflow that imports the models without
``workflow.unsafe.imports_passed_through()``.

The workflow's own modules too (``PinnedResumptionWorkflow``'s on a worker with Worker Versioning):
they hold no state of their own (each run's is its ``RunState``) and their helpers are passed through
already, so loading them again for each run (compiling them where no bytecode is cached, and
``workflow.defn`` reading the class) isolated nothing and cost most of a short replay's worker CPU
(docs/benchmarks.md, figure m)."""


DEFAULT_VERSIONING_BEHAVIOR = VersioningBehavior.AUTO_UPGRADE
"""The ``default_versioning_behavior`` of the Worker Versioning the plugin turns on: that of the worker's other
workflows that declare none, which then move to a new release at their next workflow task, as on a worker
without versioning (``ResumptionWorkflow`` is registered pinned)."""


def deployment_config(settings: Settings, existing: WorkerDeploymentConfig | None) -> WorkerDeploymentConfig | None:
    """The worker's Worker Versioning: ``existing``, or the one ``settings`` names.

    ``settings.deployment_version()`` (``XMC_DEPLOYMENT_NAME``, ``XMC_BUILD_ID``) turns it on, with
    ``DEFAULT_VERSIONING_BEHAVIOR``, on a worker given none; None when neither sets one (unversioned).

    Raises:
        ValueError: the worker has a ``deployment_config`` of another version, or without Worker Versioning,
            and the settings name one: the plugin cannot tell which is meant.
    """
    version = settings.deployment_version()
    if version is None:
        return existing
    if existing is None:
        return WorkerDeploymentConfig(
            version=version, use_worker_versioning=True, default_versioning_behavior=DEFAULT_VERSIONING_BEHAVIOR
        )
    if existing.version != version or not existing.use_worker_versioning:
        raise ValueError(
            f"ResumptionPlugin: the worker's deployment_config ({existing.version.deployment_name}."
            f"{existing.version.build_id}, use_worker_versioning={existing.use_worker_versioning}) disagrees with "
            f"XMC_DEPLOYMENT_NAME and XMC_BUILD_ID ({version.deployment_name}.{version.build_id}): set one of them"
        )
    return existing


def pydantic_converter(existing: DataConverter | None) -> DataConverter:
    """``existing`` with pydantic's payload converter (``temporalio.contrib.pydantic``).

    The workflow's input, result, progress and Updates need it (they are pydantic models).

    The SDK's default converter gets ``PydanticPayloadConverter`` in place of its payload converter;
    its payload codec (encryption, compression) and failure converter are kept. A converter whose
    payload converter is already pydantic's (or a subclass) is returned as it is.

    Raises:
        ValueError: ``existing`` has another custom payload converter, which the plugin cannot
            combine with pydantic's (base it on ``PydanticPayloadConverter`` instead).
    """
    converter = existing or DataConverter.default
    if issubclass(converter.payload_converter_class, PydanticPayloadConverter):
        return converter
    if converter.payload_converter_class is DefaultPayloadConverter:
        return dataclasses.replace(converter, payload_converter_class=PydanticPayloadConverter)
    raise ValueError(
        f"ResumptionPlugin needs pydantic's payload converter, and the client has "
        f"{converter.payload_converter_class.__qualname__}: base it on "
        "temporalio.contrib.pydantic.PydanticPayloadConverter"
    )


def sandbox_passthrough(runner: WorkflowRunner | None) -> WorkflowRunner:
    """``runner`` with ``SANDBOX_PASSTHROUGH`` added to its restrictions when it is sandboxed.

    Whatever else its restrictions say is kept; any other runner is returned as it is.

    Raises:
        ValueError: no runner (a worker always has one unless another plugin removed it).
    """
    if runner is None:
        raise ValueError("ResumptionPlugin: the worker has no workflow runner")
    if isinstance(runner, SandboxedWorkflowRunner):
        restrictions = runner.restrictions.with_passthrough_modules(*SANDBOX_PASSTHROUGH)
        return dataclasses.replace(runner, restrictions=restrictions)
    return runner


class ResumptionPlugin(SimplePlugin):
    """xmc-resumption for a platform's own Temporal client and workers (see the module docstring).

    Args:
        settings: where the activities' Redis is (``XMC_REDIS_URL``, ``XMC_REDIS_CLUSTER``, TLS,
            timeouts) and the worker's Worker Deployment Version (``XMC_DEPLOYMENT_NAME``,
            ``XMC_BUILD_ID``); None reads ``Settings()`` from the environment here. Its ``task_queue``
            is not used: the workflow runs on the queue of each worker the plugin is on, and
            ``xmc resume`` must start it there (``XMC_TASK_QUEUE``).

    Raises:
        pydantic.ValidationError: ``settings`` is None and an ``XMC_*`` variable is invalid.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings if settings is not None else Settings()
        self._waiting: weakref.WeakSet[ResumptionActivities] = weakref.WeakSet()
        super().__init__(
            PLUGIN_NAME,
            data_converter=pydantic_converter,
            workflows=[ResumptionWorkflow, ReconcileWorkflow],
            workflow_runner=sandbox_passthrough,
        )

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        """Add the workflow, the activities, the sandbox pass-throughs and the Worker Versioning to ``config``.

        A worker left at the SDK's ``graceful_shutdown_timeout`` of 0 gets ``GRACEFUL_SHUTDOWN``, so a
        publish running at SIGTERM ends instead of being cancelled. The activities have no Redis client until the
        worker starts. The workflow is ``PinnedResumptionWorkflow``
        on a worker with Worker Versioning (``deployment_config``), else ``ResumptionWorkflow``.

        Raises:
            ValueError: the worker's client lacks the pydantic data converter (the plugin was given
                to the worker only; give it to ``Client.connect`` instead, or connect with
                ``temporalio.contrib.pydantic.pydantic_data_converter``); or its ``deployment_config``
                disagrees with the settings' (``deployment_config``); or the worker has the
                resumption's activities already (the plugin was given to both the client and the
                worker: the SDK would refuse the second set by its first activity's name).
        """
        client = config["client"]
        if not issubclass(client.data_converter.payload_converter_class, PydanticPayloadConverter):
            raise ValueError(
                "ResumptionPlugin: the worker's client lacks the pydantic data converter; give the plugin to "
                "Client.connect(plugins=[...]) or connect with temporalio.contrib.pydantic.pydantic_data_converter"
            )
        if any(isinstance(getattr(a, "__self__", None), ResumptionActivities) for a in config.get("activities", ())):
            raise ValueError(
                f"{PLUGIN_NAME} is given twice to this worker (to Client.connect and to the Worker, or "
                "beside the resumption's own activities): give it to one of them"
            )
        runtime = client.service_client.config.runtime or Runtime.default()
        activities = ResumptionActivities(meter=runtime.metric_meter)
        self._waiting.add(activities)
        reconciling = ReconcileActivities(activities, meter=runtime.metric_meter)
        config["activities"] = [*config.get("activities", ()), *activities.all(), reconciling.reconcile_completions]
        if not config.get("graceful_shutdown_timeout"):
            config["graceful_shutdown_timeout"] = GRACEFUL_SHUTDOWN
        versioning = deployment_config(self.settings, config.get("deployment_config"))
        if versioning is not None:
            config["deployment_config"] = versioning
        config = super().configure_worker(config)
        if versioning is not None and versioning.use_worker_versioning:
            # a server refuses every workflow task completed with a versioning behavior by a worker without
            # versioning: the pinned declaration goes only where versioning is on (workflows/versioned.py)
            versioned = {ResumptionWorkflow: PinnedResumptionWorkflow, ReconcileWorkflow: AutoUpgradeReconcileWorkflow}
            config["workflows"] = [versioned.get(w, w) for w in config.get("workflows", ())]
        return config

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        """Check the namespace, give the activities their Redis client, run the worker, close the client.

        The client is closed when the run ends, however it ends, once the replays queued on the worker were given
        their turns (``BacklogWatches.close``).

        Raises:
            xmc_resumption.search_attributes.SearchAttributesMissingError: the namespace lacks some
                of the search attributes; the worker never polls.
            temporalio.service.RPCError: the server refused to list them (other than UNIMPLEMENTED).
            RuntimeError: the worker's activities no longer include this plugin's (a plugin after it
                removed them): every resumption would fail.
        """
        try:
            activities = self._activities_on(worker)
            await _check_namespace(worker.client)
        except BaseException:
            _mark_never_started(worker)
            raise
        redis = self.settings.worker_redis()
        activities.redis = redis
        try:
            await next(worker)
        finally:
            try:
                await activities.watches.close()  # its queued replays have their turns before the process ends
            finally:
                await redis.aclose()

    def _activities_on(self, worker: Worker) -> ResumptionActivities:
        """The activities this plugin registered on ``worker``; raises ``RuntimeError`` if gone."""
        for fn in worker.config(active_config=True).get("activities", ()):
            owner = getattr(fn, "__self__", None)
            if isinstance(owner, ResumptionActivities) and owner in self._waiting:
                return owner
        raise RuntimeError(
            "ResumptionPlugin: the worker's activities no longer include ResumptionWorkflow's (removed by a plugin "
            "configured after it)"
        )


async def _check_namespace(client: Client) -> None:
    """``search_attributes.require``, except on a server that cannot list search attributes.

    The time-skipping test server answers UNIMPLEMENTED: a warning, and no check.
    """
    try:
        await search_attributes.require(client)
    except RPCError as err:
        if err.status is not RPCStatusCode.UNIMPLEMENTED:
            raise
        log.warning(
            "the Temporal server cannot list search attributes; not checked that namespace %s has %s",
            client.namespace,
            ", ".join(k.name for k in fleet.ALL),
        )


def _mark_never_started(worker: Worker) -> None:
    """Let ``worker.shutdown()`` (and so ``async with worker``) return after a start this plugin refused.

    The worker never polls.

    temporalio 1.35's ``shutdown`` waits for an event that only the worker's own run sets, and a
    plugin that raises before that run leaves it unset: the caller would wait for ever. The SDK
    sets the same event, and does nothing more, when its own start-up check fails
    (``Worker._run``); as there, the core keeps the refused worker registered on its task queue,
    and the process cannot build another worker for that queue. (A run started with its shutdown
    already requested would release it, but its pollers reach the server before they stop.)
    """
    event = getattr(worker, "_shutdown_complete_event", None)
    if isinstance(event, asyncio.Event):
        event.set()
