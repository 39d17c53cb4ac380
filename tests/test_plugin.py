"""``ResumptionPlugin`` (``xmc_resumption.plugin``) on real Temporal servers and a real redis-server:
given to a client it hosts the replay beside the worker's own workflow (a parent starting it as a
child), owns the activities' Redis client, follows the metric conventions with
``prometheus_runtime``; given to a worker only, it needs a pydantic client; a namespace without the
search attributes stops the start with one error and never polls; the converter and sandbox
helpers; a ``Replayer`` with the plugin replays a recorded history."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHistory
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import DataConverter, DefaultFailureConverter, DefaultPayloadConverter, PayloadCodec
from temporalio.plugin import SimplePlugin
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker, WorkerDeploymentConfig
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from tests.record_histories import releases
from tests.support.helpers import bare_namespace, hold_tasks, scrape, stream_tasks
from tests.support.parent import ResumeExperimentParent
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.plugin import (
    DEFAULT_VERSIONING_BEHAVIOR,
    GRACEFUL_SHUTDOWN,
    PLUGIN_NAME,
    SANDBOX_PASSTHROUGH,
    ResumptionPlugin,
    deployment_config,
    prometheus_runtime,
    pydantic_converter,
    sandbox_passthrough,
)
from xmc_resumption.reconcile import ReconcileActivities
from xmc_resumption.search_attributes import SearchAttributesMissingError
from xmc_resumption.services import free_port
from xmc_resumption.settings import DEFAULT_WORKFLOW_TASKS, MAX_WORKFLOW_TASKS, Settings
from xmc_resumption.worker import build_worker
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.models import Outcome, ResumptionInput
from xmc_resumption.workflows.reconcile import ReconcileWorkflow
from xmc_resumption.workflows.resumption import ResumptionWorkflow
from xmc_resumption.workflows.versioned import AutoUpgradeReconcileWorkflow, PinnedResumptionWorkflow

ACTIVITIES = [
    "acquire_claim",
    "check_claim",
    "wait_for_drain",
    "publish_rounds",
    "idle_consumers",
    "set_aside",
    "release_claim",
    "reconcile_completions",
]

HISTORIES = releases()[-1]
"""The newest release's recorded histories."""


async def connections(redis: Redis) -> int:
    """Clients connected to the test's redis-server (CLIENT LIST)."""
    return len(await redis.client_list())


async def connections_become(redis: Redis, n: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (now := await connections(redis)) != n:
        assert time.monotonic() < deadline, f"{now} Redis connections, expected {n}"
        await asyncio.sleep(0.05)


def plugin_activities(worker: Worker) -> ResumptionActivities:
    """The one ``ResumptionActivities`` whose methods are registered on ``worker``."""
    owners = {getattr(fn, "__self__", None) for fn in worker.config(active_config=True)["activities"]}
    (owner,) = {o for o in owners if isinstance(o, ResumptionActivities)}
    [reconciling] = [o for o in owners if isinstance(o, ReconcileActivities)]
    assert reconciling._resumption is owner  # the reconciliation uses the replay's Redis client
    assert isinstance(owner, ResumptionActivities)
    return owner


@pytest.mark.real_server
@pytest.mark.slow
async def test_on_the_client_it_hosts_the_replay_beside_the_workers_own_workflow(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str
) -> None:
    port = free_port()
    client = await Client.connect(
        temporal_env.client.service_client.config.target_host,
        plugins=[ResumptionPlugin(Settings(redis_url=redis_url))],
        runtime=prometheus_runtime(f"127.0.0.1:{port}"),
    )
    assert client.data_converter.payload_converter_class is PydanticPayloadConverter
    worker = Worker(client, task_queue=task_queue, workflows=[ResumeExperimentParent])
    config = worker.config(active_config=True)
    assert config["workflows"] == [ResumeExperimentParent, ResumptionWorkflow, ReconcileWorkflow]
    assert [fn.__name__ for fn in config["activities"]] == ACTIVITIES
    runner = config["workflow_runner"]
    assert isinstance(runner, SandboxedWorkflowRunner)
    assert set(SANDBOX_PASSTHROUGH) <= runner.restrictions.passthrough_modules
    activities = plugin_activities(worker)
    with pytest.raises(RuntimeError, match="no Redis client"):
        _ = activities.redis  # built when the worker starts, not before
    before = await connections(redis)
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 20)
    async with worker:
        result = await client.execute_workflow(
            ResumeExperimentParent.run,
            args=[ResumptionInput(experiment_id=e, batch_size=7, missing_group="zero"), task_queue],
            id=f"parent-{e}",
            task_queue=task_queue,
        )
        assert await connections(redis) > before  # the activities' own client
        await activities.redis.ping()
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.COMPLETED, 20, 0)
    assert await stream_tasks(redis) == names
    await connections_become(redis, before)  # closed when the worker's run ended
    scraped = scrape(port).values
    assert [v for (name, _), v in scraped.items() if name == "xmc_resumption_replayed_tasks_total"] == [20]
    assert [v for (name, _), v in scraped.items() if name == "xmc_resumption_outcomes_total"] == [1]


async def test_on_a_worker_only_on_the_time_skipping_server(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The test server cannot list search attributes: the plugin says it did not check, and runs."""
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 5)
    with caplog.at_level(logging.WARNING, logger="xmc.plugin"):
        async with Worker(
            temporal_env.client, task_queue=task_queue, plugins=[ResumptionPlugin(Settings(redis_url=redis_url))]
        ):
            result = await temporal_env.client.execute_workflow(
                ResumptionWorkflow.run,
                ResumptionInput(experiment_id=e, missing_group="zero"),  # no group: 5 tasks, under the threshold
                id=f"resumption-{e}",
                task_queue=task_queue,
            )
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 5)
    assert await stream_tasks(redis) == names
    assert [r.getMessage() for r in caplog.records if r.name == "xmc.plugin"] == [
        "the Temporal server cannot list search attributes; not checked that namespace default has "
        + ", ".join(k.name for k in fleet.ALL)
    ]


@pytest.mark.real_server
@pytest.mark.slow
async def test_a_worker_whose_client_lacks_the_pydantic_converter_is_refused(
    temporal_env: WorkflowEnvironment, redis_url: str
) -> None:
    plain = await Client.connect(temporal_env.client.service_client.config.target_host)
    with pytest.raises(ValueError, match="the worker's client lacks the pydantic data converter"):
        Worker(plain, task_queue="q", plugins=[ResumptionPlugin(Settings(redis_url=redis_url))])


@pytest.mark.real_server
@pytest.mark.slow
async def test_a_namespace_without_the_search_attributes_stops_the_start_and_never_polls(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str
) -> None:
    bare = await bare_namespace(temporal_env.client)
    plugin = ResumptionPlugin(Settings(redis_url=redis_url))
    before = await connections(redis)
    worker = Worker(bare, task_queue=task_queue, plugins=[plugin])
    with pytest.raises(SearchAttributesMissingError) as raised:
        async with worker:  # __aexit__ waits for the shutdown: it must not wait for ever
            await asyncio.sleep(30)
    message = str(raised.value)
    assert message.startswith(f"namespace {bare.namespace} lacks the search attributes XmcExperimentId, XmcStream")
    assert f"temporal operator search-attribute create --namespace {bare.namespace} --name XmcPhase" in message
    with pytest.raises(SearchAttributesMissingError):  # the same from run()
        await asyncio.wait_for(Worker(bare, task_queue=f"{task_queue}-2", plugins=[plugin]).run(), 10)
    await asyncio.wait_for(worker.shutdown(), 1)  # returns at once after a refused start
    request = DescribeTaskQueueRequest(
        namespace=bare.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    assert not (await bare.workflow_service.describe_task_queue(request)).pollers
    assert await connections(redis) == before
    with pytest.raises(RuntimeError, match="no Redis client"):
        _ = plugin_activities(worker).redis
    with pytest.raises(RuntimeError, match="multiple workers"):  # docs/embedding.md: restart the process
        Worker(bare, task_queue=task_queue, plugins=[plugin])


@pytest.mark.real_server
@pytest.mark.slow
async def test_a_plugin_that_removes_the_activities_stops_the_start(
    temporal_env: WorkflowEnvironment, redis_url: str, task_queue: str
) -> None:
    def without_ours(existing: Sequence[Any] | None) -> Sequence[Any]:
        ours = (ResumptionActivities, ReconcileActivities)
        return [fn for fn in existing or () if not isinstance(getattr(fn, "__self__", None), ours)]

    strip = SimplePlugin("strip", activities=without_ours)
    worker = Worker(
        temporal_env.client,
        task_queue=task_queue,
        activities=[notify_owner],
        plugins=[ResumptionPlugin(Settings(redis_url=redis_url)), strip],
    )
    assert worker.config(active_config=True)["activities"] == [notify_owner]
    with pytest.raises(RuntimeError, match="no longer include ResumptionWorkflow's"):
        await asyncio.wait_for(worker.run(), 10)
    await asyncio.wait_for(worker.shutdown(), 1)


@activity.defn
async def notify_owner(message: str) -> str:
    """A platform's own activity."""
    return message


class _Passing(PayloadCodec):
    """A payload codec the pydantic converter must keep."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


class _OwnPydantic(PydanticPayloadConverter):
    pass


class _OwnJson(DefaultPayloadConverter):
    pass


def test_pydantic_converter_swaps_the_default_payload_converter_and_keeps_the_rest() -> None:
    assert pydantic_converter(None).payload_converter_class is PydanticPayloadConverter
    assert pydantic_converter(DataConverter.default).payload_converter_class is PydanticPayloadConverter
    codec = _Passing()
    mine = DataConverter(payload_codec=codec, failure_converter_class=DefaultFailureConverter)
    swapped = pydantic_converter(mine)
    assert swapped.payload_converter_class is PydanticPayloadConverter
    assert swapped.payload_codec is codec and swapped.failure_converter_class is DefaultFailureConverter
    already = DataConverter(payload_converter_class=_OwnPydantic)
    assert pydantic_converter(already) is already
    with pytest.raises(ValueError, match=r"the client has _OwnJson: base it on .*PydanticPayloadConverter"):
        pydantic_converter(DataConverter(payload_converter_class=_OwnJson))


@pytest.mark.real_server
@pytest.mark.slow
async def test_a_client_with_another_custom_payload_converter_is_refused_at_connect(
    temporal_env: WorkflowEnvironment, redis_url: str
) -> None:
    with pytest.raises(ValueError, match="the client has _OwnJson"):
        await Client.connect(
            temporal_env.client.service_client.config.target_host,
            data_converter=DataConverter(payload_converter_class=_OwnJson),
            plugins=[ResumptionPlugin(Settings(redis_url=redis_url))],
        )


def test_sandbox_passthrough_adds_the_modules_and_keeps_the_runners_own() -> None:
    mine = SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules("platform_lib"))
    runner = sandbox_passthrough(mine)
    assert isinstance(runner, SandboxedWorkflowRunner)
    assert runner.restrictions.passthrough_modules == mine.restrictions.passthrough_modules | set(SANDBOX_PASSTHROUGH)
    assert runner.restrictions.invalid_module_members is mine.restrictions.invalid_module_members
    # the replay's own modules: no run loads them again (docs/benchmarks.md, figure m)
    assert {ResumptionWorkflow.__module__, PinnedResumptionWorkflow.__module__} <= set(SANDBOX_PASSTHROUGH)
    unsandboxed = UnsandboxedWorkflowRunner()
    assert sandbox_passthrough(unsandboxed) is unsandboxed
    with pytest.raises(ValueError, match="no workflow runner"):
        sandbox_passthrough(None)


async def test_a_replayer_with_the_plugin_replays_a_recorded_history() -> None:
    """The plugin gives a bare ``Replayer`` the workflow, the pydantic converter and the sandbox."""
    plugin = ResumptionPlugin(Settings())
    assert plugin.name() == PLUGIN_NAME
    replayer = Replayer(workflows=[], plugins=[plugin])
    for name in ("completed_after_throttles", "continued_as_new"):
        path = HISTORIES / f"{name}.json"
        await replayer.replay_workflow(WorkflowHistory.from_json(f"resumption-{name}", path.read_text()))


VERSION = WorkerDeploymentVersion(deployment_name="xmc", build_id="b7")


def test_a_deployment_version_in_the_settings_turns_worker_versioning_on() -> None:
    settings = Settings(deployment_name="xmc", build_id="b7")
    assert settings.deployment_version() == VERSION
    assert deployment_config(settings, None) == WorkerDeploymentConfig(
        version=VERSION, use_worker_versioning=True, default_versioning_behavior=VersioningBehavior.AUTO_UPGRADE
    )
    assert DEFAULT_VERSIONING_BEHAVIOR is VersioningBehavior.AUTO_UPGRADE
    theirs = WorkerDeploymentConfig(
        version=VERSION, use_worker_versioning=True, default_versioning_behavior=VersioningBehavior.PINNED
    )
    assert deployment_config(settings, theirs) is theirs  # the same version: the worker's own choices kept
    for other in (
        WorkerDeploymentConfig(version=WorkerDeploymentVersion("xmc", "b8"), use_worker_versioning=True),
        WorkerDeploymentConfig(version=WorkerDeploymentVersion("other", "b7"), use_worker_versioning=True),
        WorkerDeploymentConfig(version=VERSION, use_worker_versioning=False),
    ):
        with pytest.raises(ValueError, match=r"disagrees with XMC_DEPLOYMENT_NAME and XMC_BUILD_ID \(xmc\.b7\)"):
            deployment_config(settings, other)
    unset = Settings()
    assert unset.deployment_version() is None
    assert deployment_config(unset, None) is None
    assert deployment_config(unset, theirs) is theirs


@pytest.mark.parametrize(
    ("settings", "given", "expected_workflow", "expected_config"),
    [
        # unversioned, as before: ResumptionWorkflow declares no behavior (a server refuses one from such a worker)
        ({}, None, ResumptionWorkflow, None),
        # the worker only reports its version, without versioning: still no behavior
        ({}, WorkerDeploymentConfig(version=VERSION, use_worker_versioning=False), ResumptionWorkflow, "given"),
        # versioning from the settings, or the worker's own: pinned
        (
            {"deployment_name": "xmc", "build_id": "b7"},
            None,
            PinnedResumptionWorkflow,
            WorkerDeploymentConfig(
                version=VERSION, use_worker_versioning=True, default_versioning_behavior=VersioningBehavior.AUTO_UPGRADE
            ),
        ),
        (
            {},
            WorkerDeploymentConfig(
                version=VERSION, use_worker_versioning=True, default_versioning_behavior=VersioningBehavior.PINNED
            ),
            PinnedResumptionWorkflow,
            "given",
        ),
    ],
)
async def test_the_replay_is_registered_pinned_on_a_worker_with_worker_versioning(
    temporal_env: WorkflowEnvironment,
    redis_url: str,
    task_queue: str,
    settings: dict[str, str],
    given: WorkerDeploymentConfig | None,
    expected_workflow: type,
    expected_config: WorkerDeploymentConfig | str | None,
) -> None:
    """The worker's other workflows declare no behavior: with versioning on, the plugin's default covers them."""
    worker = Worker(
        temporal_env.client,
        task_queue=task_queue,
        workflows=[ResumeExperimentParent],
        plugins=[ResumptionPlugin(Settings(redis_url=redis_url, **settings))],
        **({"deployment_config": given} if given else {}),
    )
    config = worker.config(active_config=True)
    reconcile = AutoUpgradeReconcileWorkflow if expected_workflow is PinnedResumptionWorkflow else ReconcileWorkflow
    assert config["workflows"] == [ResumeExperimentParent, expected_workflow, reconcile]
    assert config.get("deployment_config") == (given if expected_config == "given" else expected_config)


async def test_a_worker_whose_deployment_config_disagrees_with_the_settings_is_refused(
    temporal_env: WorkflowEnvironment, redis_url: str
) -> None:
    with pytest.raises(ValueError, match=r"deployment_config \(xmc\.b8, use_worker_versioning=True\) disagrees"):
        Worker(
            temporal_env.client,
            task_queue="q",
            plugins=[ResumptionPlugin(Settings(redis_url=redis_url, deployment_name="xmc", build_id="b7"))],
            deployment_config=WorkerDeploymentConfig(
                version=WorkerDeploymentVersion("xmc", "b8"), use_worker_versioning=True
            ),
        )


async def test_the_plugin_on_both_the_client_and_the_worker_is_one_line_naming_it(
    temporal_env: WorkflowEnvironment, redis_url: str
) -> None:
    """Issue 26, row 8 (docs/embedding.md: not both): one line naming the plugin, before the SDK's
    "More than one activity named acquire_claim"."""
    settings = Settings(redis_url=redis_url)
    client = await Client.connect(
        temporal_env.client.service_client.config.target_host, plugins=[ResumptionPlugin(settings)]
    )
    # the SDK warns first, then the plugin refuses
    with pytest.warns(UserWarning, match="same plugin type"), pytest.raises(ValueError) as twice:
        Worker(client, task_queue="q", plugins=[ResumptionPlugin(settings)])
    assert str(twice.value) == (
        "xmc_resumption.ResumptionPlugin is given twice to this worker (to Client.connect and to the Worker, "
        "or beside the resumption's own activities): give it to one of them"
    )
    with pytest.raises(ValueError, match=r"^xmc_resumption\.ResumptionPlugin is given twice"):
        Worker(temporal_env.client, task_queue="q", plugins=[ResumptionPlugin(settings), ResumptionPlugin(settings)])


@pytest.mark.parametrize(
    ("given", "expected"), [(None, GRACEFUL_SHUTDOWN), (timedelta(seconds=3), timedelta(seconds=3))]
)
async def test_a_worker_left_at_the_sdks_zero_graceful_shutdown_gets_the_plugins(
    temporal_env: WorkflowEnvironment, redis_url: str, task_queue: str, given: timedelta | None, expected: timedelta
) -> None:
    """The SDK's default cancels a running publish at SIGTERM at once; a worker's own setting is kept."""
    worker = Worker(
        temporal_env.client,
        task_queue=task_queue,
        plugins=[ResumptionPlugin(Settings(redis_url=redis_url))],
        **({"graceful_shutdown_timeout": given} if given else {}),
    )
    assert worker.config(active_config=True).get("graceful_shutdown_timeout") == expected


@pytest.mark.parametrize(
    ("given", "expected"), [({}, DEFAULT_WORKFLOW_TASKS), ({"max_concurrent_workflow_tasks": 3}, 3)]
)
async def test_the_standalone_worker_runs_the_workflow_tasks_at_once_the_settings_say(
    temporal_env: WorkflowEnvironment,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    given: dict[str, int],
    expected: int,
) -> None:
    """``python -m worker`` runs 10 workflow tasks at once, not the SDK's 100 (docs/scale.md); the setting is kept."""
    monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_env.client.service_client.config.target_host)
    worker = await build_worker(Settings(redis_url=redis_url, **given))
    assert worker.config(active_config=True).get("max_concurrent_workflow_tasks") == expected


def test_the_workflow_tasks_at_once_are_bounded() -> None:
    for bad in (1, MAX_WORKFLOW_TASKS + 1):  # 1: the SDK's core refuses it with a workflow cache
        with pytest.raises(ValidationError, match="max_concurrent_workflow_tasks"):
            Settings(max_concurrent_workflow_tasks=bad)
