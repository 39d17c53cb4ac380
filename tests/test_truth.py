"""What the replay reports agrees with Redis whatever happens to its workflow tasks (issue 16, items
1-3): a turn run again after its own release (a lost workflow-task completion,
temporalio/temporal#5921), a reset to the first workflow task, a pause that lands just after
continue-as-new. The outcome, ``replayed``, ``remaining`` and the metrics are read against Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)

from tests.support.helpers import (
    GROUP,
    STREAM,
    consume,
    fill_backlog,
    hold_tasks,
    scrape,
    start,
    stream_tasks,
    wait_for,
)
from tests.test_e2e import running_worker, temporal_workflow_cli
from xmc_resumption.activities.requests import (
    AcquireRequest,
    CheckRequest,
    ExperimentRef,
    PublishRequest,
    ReleaseRequest,
)
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams
from xmc_resumption.redisclient.results import ExperimentState, PublishStatus
from xmc_resumption.services import free_port
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.models import Outcome, ResumptionInput
from xmc_resumption.workflows.resumption import ResumptionWorkflow


def held_by(tasks: list[bytes], experiment_id: str) -> list[bytes]:
    return [t for t in tasks if t.startswith(f"{experiment_id}-".encode())]


async def test_a_turn_run_again_after_its_release_reports_the_release_and_counts_nothing_twice(redis: Redis) -> None:
    """A workflow task that drained and released is lost; its turn runs again with the same token:
    the check and the publishes see the token's own release (outcome completed, replayed 30, not
    ``fenced``), the release returns its record, and the metrics count 30 tasks and one outcome."""
    port = free_port()
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{port}")))
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_type="ResumptionWorkflow", task_queue="q1", is_local=True)
    acts = ResumptionActivities(redis, meter=runtime.metric_meter)
    ref = ExperimentRef(experiment_id="E1", stream=STREAM, consumer_group=GROUP)
    keys = ExperimentKeys(STREAM, "E1")
    names = await hold_tasks(redis, "E1", 30)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    grant = await env.run(acts.acquire_claim, AcquireRequest(ref=ref, owner="w", lease_ms=60_000, request_id="r"))
    assert (grant.replayed, grant.held) == (0, 30)
    token = grant.token

    def publish(seq: int) -> Any:
        params = PublishParams(token=token, seq=seq, batch_size=10, threshold=100, owner="w", lease_ms=60_000)
        return env.run(acts.publish_rounds, PublishRequest(ref=ref, params=params))

    release = ReleaseRequest(ref=ref, token=token, owner="w", outcome="completed")
    statuses = [(r.status, r.moved, r.replayed, r.remaining) for r in [(await publish(s)).final for s in (1, 2, 3)]]
    assert statuses == [
        (PublishStatus.PUBLISHED, 10, 10, 20),
        (PublishStatus.PUBLISHED, 10, 20, 10),
        (PublishStatus.COMPLETED, 10, 30, 0),
    ]
    first = await env.run(acts.release_claim, release)
    assert (first.token, first.outcome, first.replayed, first.remaining, first.repeated) == (
        token,
        "completed",
        30,
        0,
        False,
    )
    # the lost task's turn, run again from its start: acquire (same request), check, publish, release
    again = await env.run(acts.acquire_claim, AcquireRequest(ref=ref, owner="w", lease_ms=60_000, request_id="r"))
    assert (again.token, again.repeated) == (token, True)
    check = await env.run(acts.check_claim, CheckRequest(ref=ref, token=token, owner="w", lease_ms=60_000))
    assert check.fenced and check.released is not None
    assert (check.released.outcome, check.released.replayed, check.released.remaining) == ("completed", 30, 0)
    for seq in (1, 3, 4):  # a recorded seq, the last one, a new one: fenced by its own release
        rerun = (await publish(seq)).final
        assert (rerun.status, rerun.moved, rerun.outcome, rerun.replayed) == (
            PublishStatus.RELEASED,
            0,
            "completed",
            30,
        )
    repeated = await env.run(acts.release_claim, release)
    assert (repeated.token, repeated.outcome, repeated.replayed, repeated.repeated) == (token, "completed", 30, True)
    assert held_by(await stream_tasks(redis), "E1") == names
    assert await held.get_state(redis, keys) is ExperimentState.RUNNING
    labels = {"stream": STREAM, "consumer_group": GROUP, "task_queue": "q1"}
    scraped = scrape(port)
    assert scraped["xmc_resumption_replayed_tasks_total", labels] == 30
    assert scraped["xmc_resumption_outcomes_total", {**labels, "outcome": "completed"}] == 1


async def test_a_repeated_publish_counts_nothing_in_the_metric(redis: Redis) -> None:
    """A publish retried with the same seq (its reply lost) returns the recorded result marked
    ``repeated``, and the metric counts its tasks once."""
    port = free_port()
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{port}")))
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_type="ResumptionWorkflow", task_queue="q2", is_local=True)
    acts = ResumptionActivities(redis, meter=runtime.metric_meter)
    ref = ExperimentRef(experiment_id="E2", stream=STREAM, consumer_group=GROUP)
    await hold_tasks(redis, "E2", 30)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    grant = await env.run(acts.acquire_claim, AcquireRequest(ref=ref, owner="w", lease_ms=60_000, request_id="r"))
    params = PublishParams(token=grant.token, seq=1, batch_size=10, threshold=100, owner="w", lease_ms=60_000)
    req = PublishRequest(ref=ref, params=params)
    first, second = await env.run(acts.publish_rounds, req), await env.run(acts.publish_rounds, req)
    assert (first.moved, first.first.repeated, second.moved, second.first.repeated) == (10, False, 10, True)
    assert await redis.xlen(STREAM) == 10
    assert (
        scrape(port)[
            "xmc_resumption_replayed_tasks_total", {"stream": STREAM, "consumer_group": GROUP, "task_queue": "q2"}
        ]
        == 10
    )


@pytest.mark.real_server
@pytest.mark.slow
async def test_a_workflow_task_lost_after_its_release_ends_with_the_recorded_outcome(
    temporal_env, redis, redis_url, task_queue, tmp_path
) -> None:
    """The workflow task that drained 30 tasks and released the claim is lost: its worker is
    killed before completing it (``tests/support/lost_completion_worker.py``), so the server times it out
    and another worker runs it again from its start, against Redis (the local activities of the
    lost task run again). The run ends ``completed, replayed 30, remaining 0``, the release's
    record, not ``fenced`` by its own revoked token; nothing is released or moved twice."""
    e = f"E{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, 30)
    await fill_backlog(redis, 0)
    address = temporal_env.client.service_client.config.target_host
    lost = subprocess.Popen(
        [sys.executable, "-m", "tests.support.lost_completion_worker", address, redis_url, task_queue],
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        handle = await temporal_env.client.start_workflow(
            ResumptionWorkflow.run,
            ResumptionInput(experiment_id=e, batch_size=10, max_backlog_threshold=100),
            id=f"resumption-{e}",
            task_queue=task_queue,
            task_timeout=timedelta(seconds=3),
        )
        for _ in range(1000):
            if await redis.llen(keys.released):
                break
            await asyncio.sleep(0.02)
    finally:
        lost.kill()
        lost.wait()
    events = [event.event_type async for event in handle.fetch_history_events()]
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED not in events  # the task that drained is lost
    # drained and released: the release bumped the fence one past the run's token
    (record,) = await redis.lrange(keys.released, 0, -1)
    token = int(record.split()[0])
    assert await redis.xlen(keys.held) == 0 and await fencing.current_token(redis, keys) == token + 1
    port = free_port()
    with running_worker(temporal_env, redis_url, task_queue, tmp_path / "worker.log", port):
        result = await asyncio.wait_for(handle.result(), 30)
        scraped = scrape(port)
    # the worker that ran the task again moved nothing and released nothing: it counts neither
    labels = {"stream": STREAM, "consumer_group": GROUP, "task_queue": task_queue}
    assert scraped["xmc_resumption_replayed_tasks_total", labels] == 0
    completed = ("xmc_resumption_outcomes_total", frozenset({**labels, "outcome": "completed"}.items()))
    assert completed not in scraped.values
    assert (result.outcome, result.replayed, result.remaining, result.token) == (Outcome.COMPLETED, 30, 0, token)
    assert held_by(await stream_tasks(redis), e) == names
    # released once: the second release was its record
    assert await fencing.current_token(redis, keys) == token + 1
    assert await redis.lrange(keys.released, 0, -1) == [f"{token} completed 30 0".encode()]


GATE = {"open": False}
"""Opened by the test: a continued run's first step waits for it (``Gate``)."""


class Gate(Interceptor):
    """A continued run starts its ``run`` only once ``GATE`` is open, so an Update sent meanwhile is
    handled before the run's first step: a pause that lands just after continue-as-new."""

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        return _GateInbound


class _GateInbound(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        if workflow.info().continued_run_id:
            await workflow.wait_condition(lambda: GATE["open"])
        return await self.next.execute_workflow(input)


async def test_a_pause_just_after_continue_as_new_reports_the_held_tasks(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """``turns_per_run`` 1, the backlog at the threshold: the run continues as new after its first
    turn, and the pause Update reaches the new run before its first step. The result's
    ``remaining`` is the held tasks Redis holds (not 0), the experiment is paused again."""
    e = f"E{uuid.uuid4().hex[:6]}"
    await hold_tasks(redis, e, 40)
    await fill_backlog(redis, 5)
    GATE["open"] = False
    worker_redis = Redis.from_url(redis_url, decode_responses=False)
    async with Worker(
        temporal_env.client,
        task_queue=task_queue,
        workflows=[ResumptionWorkflow],
        activities=ResumptionActivities(worker_redis).all(),
        interceptors=[Gate()],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            throttle_seconds=1,
            turns_per_run=1,
        )
        for _ in range(200):
            if (await handle.describe()).run_id != handle.first_execution_run_id:
                break
            await asyncio.sleep(0.05)
        latest = temporal_env.client.get_workflow_handle_for(ResumptionWorkflow.run, handle.id)
        GATE["open"] = True
        await latest.execute_update(ResumptionWorkflow.pause)
        result = await latest.result()
        shown = (await latest.describe()).typed_search_attributes  # what xmc list shows
    await worker_redis.aclose()
    assert (result.outcome, result.runs, result.replayed) == (Outcome.PAUSED, 2, 0)
    assert result.remaining == await redis.xlen(ExperimentKeys(STREAM, e).held) == 40
    assert (shown.get(fleet.REMAINING), shown.get(fleet.PHASE)) == (40, "paused")
    assert await held.get_state(redis, ExperimentKeys(STREAM, e)) is ExperimentState.PAUSED


@pytest.mark.real_server
@pytest.mark.slow
async def test_a_reset_to_the_first_workflow_task_counts_the_whole_resume(
    temporal_env, redis, redis_url, task_queue, tmp_path
) -> None:
    """Half-way, ``temporal workflow reset --type FirstWorkflowTask``: the reset run takes a new
    claim on the resume in progress, and its result counts every task the resume moved (200 of
    200, not what the new claim moved); the metric counts each task once."""
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 200)
    await fill_backlog(redis, 0)
    port = free_port()
    stop, seen = asyncio.Event(), []
    with running_worker(temporal_env, redis_url, task_queue, tmp_path / "worker.log", port):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=60,
            batch_size=20,
            throttle_seconds=0.5,
        )
        first = await wait_for(handle, lambda p: p.replayed == 60 and p.phase.value == "throttled", timeout=30)
        reset = temporal_workflow_cli(
            temporal_env,
            "reset",
            "--workflow-id",
            handle.id,
            "--type",
            "FirstWorkflowTask",
            "--reason",
            "test",
            "--yes",
        )
        assert reset.returncode == 0, reset.stderr
        latest = temporal_env.client.get_workflow_handle_for(ResumptionWorkflow.run, handle.id)
        after = await wait_for(latest, lambda p: p.token > first.token, timeout=30)
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=20))
        result = await asyncio.wait_for(latest.result(), 40)
        stop.set()
        await consumer
        await asyncio.sleep(1.5)  # the exporter's next collection
        scraped = scrape(port)
    assert after.replayed == 60  # the resume's count, at the reset run's claim
    assert (result.outcome, result.replayed, result.remaining, result.token) == (Outcome.COMPLETED, 200, 0, after.token)
    assert held_by(await stream_tasks(redis), e) == names
    labels = {"stream": STREAM, "consumer_group": GROUP, "task_queue": task_queue}
    assert scraped["xmc_resumption_replayed_tasks_total", labels] == 200
    assert scraped["xmc_resumption_outcomes_total", {**labels, "outcome": "completed"}] == 1
    assert not await redis.exists(ExperimentKeys(STREAM, e).replay)  # the resume ended: its count dropped


@pytest.mark.real_server
@pytest.mark.slow
async def test_soak_updates_pause_resume_reset_and_worker_restarts_agree_with_redis(
    temporal_env, redis, redis_url, task_queue, tmp_path
) -> None:
    """The soak's kind, bounded: one replay of 400 held tasks driven through a burst of 30 Updates
    and continue-as-new, a pause and a new resume, a reset to the first workflow task, and two
    worker SIGKILLs. Each result's outcome, ``replayed`` and ``remaining`` agree with Redis, the
    metrics of the three workers sum to each task once, and every task reached the consumers
    exactly once and in order. (A worker is killed while nothing can move, the consumers being
    stopped at the threshold, so its last scrape holds all it counted.)"""
    e = f"E{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(redis, e, 400)
    await fill_backlog(redis, 0)
    seen: list[bytes] = []
    counted: dict[str, float] = {}
    labels = {"stream": STREAM, "consumer_group": GROUP, "task_queue": task_queue}

    def metric(port: int, name: str, **extra: str) -> float:
        try:
            return scrape(port)[name, {**labels, **extra}]
        except KeyError:
            return 0.0

    def take(port: int, worker: str) -> None:
        counted[worker] = metric(port, "xmc_resumption_replayed_tasks_total")
        counted[worker + " paused"] = metric(port, "xmc_resumption_outcomes_total", outcome="paused")
        counted[worker + " completed"] = metric(port, "xmc_resumption_outcomes_total", outcome="completed")

    async def at_rest(handle: Any) -> Any:
        """The consumers stopped, the group's backlog in Redis at the threshold: nothing can move.
        Returns the progress once it shows the resume's count in Redis, throttled."""
        progress = None
        for _ in range(200):
            [group] = await redis.xinfo_groups(STREAM)
            moved = int(await redis.hget(keys.replay, "moved") or -1)
            if group["lag"] + group["pending"] == 40:
                progress = await handle.query(ResumptionWorkflow.progress)
                if progress.phase.value == "throttled" and progress.replayed == moved:
                    return progress
            await asyncio.sleep(0.1)
        raise AssertionError(f"the replay did not come to rest at the threshold: {progress!r}, {group}, {moved}")

    settings = dict(
        max_backlog_threshold=40, batch_size=20, throttle_seconds=0.3, turns_per_run=4, throttle_policy="fixed"
    )  # durable waits, where the replay comes to rest between the chaos steps
    ports = [free_port() for _ in range(3)]
    with running_worker(temporal_env, redis_url, task_queue, tmp_path / "w1.log", ports[0]) as w1:
        stop = asyncio.Event()
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=10, rate=80))
        handle = await start(temporal_env.client, task_queue, experiment_id=e, **settings)
        latest = temporal_env.client.get_workflow_handle_for(ResumptionWorkflow.run, handle.id)
        await wait_for(latest, lambda p: p.replayed >= 60, timeout=20)
        stop.set()
        await consumer
        # 30 Updates at once, each waking the wait for a turn, continuing as new every 4 turns
        burst = [latest.execute_update(ResumptionWorkflow.set_batch_size, 10 + i % 2 * 10) for i in range(30)]
        settled = await asyncio.gather(*burst, return_exceptions=True)
        await at_rest(latest)
        await latest.execute_update(ResumptionWorkflow.pause)
        paused = await latest.result()
        take(ports[0], "w1")
        w1.kill()
    assert [r for r in settled if isinstance(r, BaseException)] == []
    assert paused.outcome is Outcome.PAUSED and paused.runs > 1
    assert paused.remaining == await redis.xlen(keys.held) == 400 - paused.replayed
    assert held_by(await stream_tasks(redis), e) == names[: paused.replayed]
    assert await held.get_state(redis, keys) is ExperimentState.PAUSED
    with running_worker(temporal_env, redis_url, task_queue, tmp_path / "w2.log", ports[1]) as w2:
        stop = asyncio.Event()
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=10, rate=80))
        second = await start(temporal_env.client, task_queue, experiment_id=e, **settings)
        current = temporal_env.client.get_workflow_handle_for(ResumptionWorkflow.run, second.id)  # the latest run
        await wait_for(current, lambda p: p.replayed >= 40, timeout=20)
        stop.set()
        await consumer
        before = await at_rest(current)
        reset_from = (await current.describe()).run_id
        assert (
            40 <= before.replayed == len(held_by(await stream_tasks(redis), e)) - paused.replayed
        )  # this resume's count
        reset = temporal_workflow_cli(
            temporal_env,
            "reset",
            "--workflow-id",
            second.id,
            "--type",
            "FirstWorkflowTask",
            "--reason",
            "soak",
            "--yes",
        )
        assert reset.returncode == 0, reset.stderr
        latest = temporal_env.client.get_workflow_handle_for(ResumptionWorkflow.run, second.id)
        for _ in range(100):  # the reset run (of the run then current: a continued one keeps its claim)
            if (await latest.describe()).run_id != reset_from:
                break
            await asyncio.sleep(0.1)
        after = await at_rest(latest)
        assert after.replayed == before.replayed  # the reset run's claim keeps the resume's count
        take(ports[1], "w2")
        w2.kill()
    with running_worker(temporal_env, redis_url, task_queue, tmp_path / "w3.log", ports[2]):
        stop = asyncio.Event()
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=10, rate=80))
        done = await asyncio.wait_for(latest.result(), 40)
        stop.set()
        await consumer
        take(ports[2], "w3")
    assert (done.outcome, done.replayed, done.remaining) == (Outcome.COMPLETED, 400 - paused.replayed, 0)
    assert held_by(await stream_tasks(redis), e) == names  # every task once, in order
    assert sorted(held_by(seen, e)) == sorted(names)  # delivered to the consumers once each
    assert counted["w1"] + counted["w2"] + counted["w3"] == 400
    assert (counted["w1 paused"], counted["w2 paused"] + counted["w3 paused"]) == (1, 0)
    assert counted["w1 completed"] + counted["w2 completed"] + counted["w3 completed"] == 1
    assert not await redis.exists(keys.replay, keys.claim)
