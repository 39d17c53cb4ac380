"""Upgrades without patches on the dev server: a replay started on one Worker Deployment Version goes
on under the next once that one is current, pinned to its version within a run and moved at its
continue-as-new; and a run bounded in time (``max_run_seconds``) as well as in turns."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import ContinueAsNewVersioningBehavior, EventType, VersioningBehavior
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    Replayer,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from tests.support.helpers import (
    GROUP,
    STREAM,
    chain_histories,
    consume,
    hold_tasks,
    resumption_worker,
    running_worker,
    start,
    stream_tasks,
    throttled,
    wait_for,
)
from xmc_resumption.plugin import ResumptionPlugin
from xmc_resumption.services import installed_binary
from xmc_resumption.settings import Settings
from xmc_resumption.workflows.models import Outcome

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

RELEASE_MEMO = "xmc-test-release"
"""The memo key release B's worker writes at the start of every run it executes."""


class _ReleaseB(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        workflow.upsert_memo({RELEASE_MEMO: "B"})
        return await super().execute_workflow(input)


class ReleaseB(Interceptor):
    """Release B in miniature: the product plus a command release A never issues (a memo upsert as each
    run begins). Run on A's history, B's code would not replay; pinned, no run ever moves between them."""

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _ReleaseB


def temporal_cli(env: WorkflowEnvironment, *args: str) -> subprocess.CompletedProcess[str]:
    """``temporal ARGS`` against the test's dev server, as an operator types it."""
    address = env.client.service_client.config.target_host
    return subprocess.run(
        [installed_binary("temporal"), "--address", address, *args], capture_output=True, text=True, timeout=30
    )


async def make_current(env: WorkflowEnvironment, deployment: str, build_id: str, timeout: float = 30) -> None:
    """``temporal worker deployment set-current-version``, as docs/operating.md says, retried until the
    version's workers have polled (the server refuses a version it has not seen poll)."""
    deadline = time.monotonic() + timeout
    while True:
        ran = await asyncio.to_thread(
            temporal_cli,
            env,
            *("worker", "deployment", "set-current-version", "--yes"),
            *("--deployment-name", deployment, "--build-id", build_id),
        )
        if ran.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{deployment}.{build_id} never became current: {ran.stderr}")
        await asyncio.sleep(0.2)


def describe_version(env: WorkflowEnvironment, deployment: str, build_id: str) -> dict[str, Any]:
    """``temporal worker deployment describe-version -o json``."""
    ran = temporal_cli(
        env,
        *("worker", "deployment", "describe-version", "-o", "json"),
        *("--deployment-name", deployment, "--build-id", build_id),
    )
    assert ran.returncode == 0, ran.stderr
    return dict(json.loads(ran.stdout))


def task_builds(history: WorkflowHistory) -> set[tuple[str, str, int]]:
    """(deployment, build ID, versioning behavior) of every workflow task completed in ``history``."""
    return {
        (a.deployment_version.deployment_name, a.deployment_version.build_id, a.versioning_behavior)
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        for a in [e.workflow_task_completed_event_attributes]
    }


def continued_as_new(history: WorkflowHistory) -> Any:
    """The attributes of the run's continue-as-new event (its last)."""
    last = history.events[-1]
    assert last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW, last
    return last.workflow_execution_continued_as_new_event_attributes


async def until(read: Any, ok: Any, timeout: float, what: str) -> Any:
    """Call ``read()`` (in a thread) until ``ok(value)``; the value, or AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ok(value := await asyncio.to_thread(read)):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {value}")
        await asyncio.sleep(0.2)
    return value


async def test_a_replay_started_on_build_a_goes_on_under_build_b_once_b_is_current(
    temporal_env: WorkflowEnvironment, redis, redis_url: str, task_queue: str, tmp_path
) -> None:
    """A worker process of build A (``XMC_DEPLOYMENT_NAME``, ``XMC_BUILD_ID``), current, starts the
    replay; it publishes and waits on a full backlog. Build B's worker (the plugin, in process) is
    deployed and made current: the run continues as new at its next turn and the next run runs on
    B from its first workflow task, B's own commands included; A is drained and stops."""
    deployment, e = f"xmc-{uuid.uuid4().hex[:6]}", f"V{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 60)
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    log = tmp_path / "worker-a.log"
    stop, seen = asyncio.Event(), []
    b_settings = Settings(redis_url=redis_url, task_queue=task_queue, deployment_name=deployment, build_id="B")
    with running_worker(
        temporal_env, redis_url, task_queue, log, XMC_DEPLOYMENT_NAME=deployment, XMC_BUILD_ID="A"
    ) as worker_a:
        await make_current(temporal_env, deployment, "A")
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            batch_size=5,
            throttle_policy="fixed",
            throttle_seconds=0.5,
        )
        # no consumer yet: the first run publishes the threshold's worth on A and waits
        await wait_for(handle, lambda p: throttled(p) and p.replayed == 5, timeout=30)
        async with Worker(
            temporal_env.client,
            task_queue=task_queue,
            plugins=[ResumptionPlugin(b_settings)],
            interceptors=[ReleaseB()],
        ):
            await make_current(temporal_env, deployment, "B")
            consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=5))
            try:
                result = await asyncio.wait_for(handle.result(), 60)
            finally:
                stop.set()
                await consumer
            description = await handle.describe()
        drained = await until(
            lambda: describe_version(temporal_env, deployment, "A"),
            lambda doc: (doc.get("drainageInfo") or {}).get("drainageStatus") == "drained",
            30,
            "build A never reported drained",
        )
        worker_a.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker_a.wait, 20) == 0

    assert (result.outcome, result.replayed, result.remaining, result.runs) == (Outcome.COMPLETED, 60, 0, 2)
    assert await stream_tasks(redis) == names  # every task once, in order
    assert seen == names
    first, second = await chain_histories(temporal_env.client, handle)
    pinned = VersioningBehavior.VERSIONING_BEHAVIOR_PINNED
    assert task_builds(first) == {(deployment, "A", pinned)}
    assert task_builds(second) == {(deployment, "B", pinned)}
    assert continued_as_new(first).input  # the carry went on
    # each release replays its own run and not the other's: only pinning lets B go on without a patch
    release_a = Replayer(workflows=[], plugins=[ResumptionPlugin(Settings(redis_url=redis_url))])
    release_b = Replayer(
        workflows=[], plugins=[ResumptionPlugin(Settings(redis_url=redis_url))], interceptors=[ReleaseB()]
    )
    await release_a.replay_workflow(first)
    await release_b.replay_workflow(second)
    for replayer, history in ((release_b, first), (release_a, second)):
        with pytest.raises(workflow.NondeterminismError):
            await replayer.replay_workflow(history)
    assert await description.memo_value(RELEASE_MEMO) == "B"
    info = description.raw_description.workflow_execution_info.versioning_info
    assert (info.behavior, info.deployment_version.build_id) == (pinned, "B")
    assert info.continue_as_new_initial_versioning_behavior == (
        ContinueAsNewVersioningBehavior.CONTINUE_AS_NEW_VERSIONING_BEHAVIOR_AUTO_UPGRADE
    )
    assert (drained["deploymentName"], drained["BuildID"]) == (deployment, "A")
    assert f"worker polling task queue {task_queue} as Worker Deployment Version {deployment}.A" in log.read_text()


async def test_a_run_continues_as_new_once_it_has_lasted_max_run_seconds(
    temporal_env: WorkflowEnvironment, redis, redis_url: str, task_queue: str
) -> None:
    """An unversioned worker, a replay waiting on a full backlog: its turns never reach ``turns_per_run``,
    so only the time bound ends the first run, no earlier than ``max_run_seconds`` of workflow time."""
    e = f"T{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 20)
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    stop, seen = asyncio.Event(), []
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            throttle_policy="fixed",
            throttle_seconds=0.5,
            max_run_seconds=2.0,
        )
        await wait_for(handle, lambda p: p.runs >= 2, timeout=30)
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=5))
        try:
            result = await asyncio.wait_for(handle.result(), 60)
        finally:
            stop.set()
            await consumer
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.COMPLETED, 20, 0)
    assert await stream_tasks(redis) == names
    first = (await chain_histories(temporal_env.client, handle))[0]
    assert continued_as_new(first).input  # the carry went on
    lasted = first.events[-1].event_time.ToDatetime() - first.events[0].event_time.ToDatetime()
    assert lasted >= timedelta(seconds=2)
    # unversioned: no behavior declared (a server refuses one from such a worker), the auto-upgrade ignored
    assert task_builds(first) == {("", "", VersioningBehavior.VERSIONING_BEHAVIOR_UNSPECIFIED)}
