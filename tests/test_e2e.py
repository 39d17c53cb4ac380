"""End to end: the dev server, the worker in its own process (``python -m worker``), a real
redis-server; started from the Temporal CLI and as a child of another workflow."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.support.helpers import (
    GROUP,
    STREAM,
    consume,
    fill_backlog,
    hold_tasks,
    issued_tokens,
    running_worker,
    scrape,
    start,
    stream_tasks,
    worker_polling,
)
from tests.support.parent import ResumeExperimentParent
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.services import free_port, installed_binary
from xmc_resumption.worker import SHUTDOWN_LIMIT_SECONDS
from xmc_resumption.workflows.models import Outcome, ResumptionInput, ResumptionResult
from xmc_resumption.workflows.resumption import ResumptionWorkflow

pytestmark = [pytest.mark.real_server, pytest.mark.slow]


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def worker_process(temporal_env, redis_url, task_queue, tmp_path, metrics_port) -> Iterator[subprocess.Popen[bytes]]:
    """One worker process for the test (see ``running_worker``)."""
    with running_worker(temporal_env, redis_url, task_queue, tmp_path / "worker.log", metrics_port) as proc:
        yield proc


def temporal_workflow_cli(env: WorkflowEnvironment, *args: str) -> subprocess.CompletedProcess[str]:
    """``temporal workflow ARGS`` against the test's dev server, as an operator types it."""
    address = env.client.service_client.config.target_host
    return subprocess.run(
        [installed_binary("temporal"), "--address", address, "workflow", *args],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


async def test_started_from_the_temporal_cli(temporal_env, redis, task_queue, worker_process, metrics_port) -> None:
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 300)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=20, rate=300))
    payload = {"experiment_id": e, "max_backlog_threshold": 50, "batch_size": 20, "throttle_seconds": 0.5}
    started = temporal_workflow_cli(
        temporal_env, "start", "--type", "ResumptionWorkflow", "--task-queue", task_queue,
        "--workflow-id", f"resumption-{e}", "--input", json.dumps(payload),
        "--static-summary", f"Resume experiment {e}",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    handle = temporal_env.client.get_workflow_handle_for(ResumptionWorkflow.run, f"resumption-{e}")
    result = await asyncio.wait_for(handle.result(), 60)
    queried = temporal_workflow_cli(
        temporal_env, "query", "--workflow-id", f"resumption-{e}", "--type", "progress", "-o", "json"
    )
    stop.set()
    await consumer
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 300)
    assert result.throttles >= 1
    assert await stream_tasks(redis) == names
    assert sorted(seen) == sorted(names)
    assert queried.returncode == 0, queried.stderr
    progress = json.loads(queried.stdout)["queryResult"][0]
    assert (progress["outcome"], progress["replayed"], progress["phase"]) == ("completed", 300, "done")
    assert await (await handle.describe()).static_summary() == f"Resume experiment {e}"
    samples = scrape(metrics_port)
    labels = {"stream": STREAM, "consumer_group": GROUP, "task_queue": task_queue}
    assert samples["xmc_resumption_replayed_tasks_total", labels] == 300
    # the default policy, adaptive
    assert samples["xmc_resumption_throttles_total", {**labels, "policy": "adaptive"}] == result.throttles
    assert samples["xmc_resumption_outcomes_total", {**labels, "outcome": "completed"}] == 1
    assert samples["xmc_resumption_throttle_wait_seconds_count", labels] == result.throttles
    assert samples["xmc_resumption_throttle_wait_seconds_sum", labels] == 0.5 * result.throttles
    # the wait's buckets are in seconds: every 0.5 s wait lands in le=0.5, none in le=0.25
    assert samples["xmc_resumption_throttle_wait_seconds_bucket", {**labels, "le": "0.5"}] == result.throttles
    assert samples["xmc_resumption_throttle_wait_seconds_bucket", {**labels, "le": "0.25"}] == 0
    assert 0 <= samples["xmc_resumption_backlog", labels] <= 50
    # the worker's gauge: every claim released, nothing held left
    assert samples["xmc_resumption_held_remaining", {"stream": STREAM, "consumer_group": GROUP}] == 0
    # one series per stream and group: no experiment label anywhere
    assert not [key for key in samples.values if "experiment_id" in dict(key[1])]


async def test_bad_cli_input_fails_the_run_naming_the_field(temporal_env, redis, task_queue, worker_process) -> None:
    wid = f"resumption-bad-{uuid.uuid4().hex[:6]}"
    started = temporal_workflow_cli(
        temporal_env, "start", "--type", "ResumptionWorkflow", "--task-queue", task_queue,
        "--workflow-id", wid, "--input", '{"experiment_id": "E", "batch_size": "lots"}',
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    handle = temporal_env.client.get_workflow_handle(wid, result_type=ResumptionResult)
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), 30)
    assert "batch_size" in str(failure.value.cause)  # the run failed: its workflow task was not retried for ever
    assert await redis.dbsize() == 0


@pytest.mark.parametrize(
    "inputs",
    [
        ["--input", '{"experiment_id": "E"}', "--input", '{"experiment_id": "F"}'],  # two --input flags
        [],  # none
    ],
    ids=["two-inputs", "no-input"],
)
async def test_the_wrong_number_of_cli_inputs_fails_the_run_at_once(
    temporal_env, redis, task_queue, worker_process, inputs
) -> None:
    """``temporal workflow start`` with two ``--input`` flags or none: the run fails at once, not a
    workflow task retried for ever, and nothing in Redis is touched."""
    wid = f"resumption-args-{uuid.uuid4().hex[:6]}"
    started = temporal_workflow_cli(
        temporal_env, "start", "--type", "ResumptionWorkflow", "--task-queue", task_queue, "--workflow-id", wid, *inputs
    )
    assert started.returncode == 0, started.stderr
    handle = temporal_env.client.get_workflow_handle(wid, result_type=ResumptionResult)
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), 30)
    assert "positional argument" in str(failure.value.cause)  # e.g. "takes 2 positional arguments but 3 were given"
    assert await redis.dbsize() == 0


async def test_started_as_a_child_workflow(temporal_env, redis, task_queue, worker_process) -> None:
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 120)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=20))
    parent_queue = f"{task_queue}-parent"
    async with Worker(temporal_env.client, task_queue=parent_queue, workflows=[ResumeExperimentParent]):
        result = await asyncio.wait_for(
            temporal_env.client.execute_workflow(
                ResumeExperimentParent.run,
                args=[ResumptionInput(experiment_id=e, max_backlog_threshold=40, throttle_seconds=0.3), task_queue],
                id=f"parent-{e}",
                task_queue=parent_queue,
            ),
            60,
        )
    stop.set()
    await consumer
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 120)
    assert await stream_tasks(redis) == names
    child = await temporal_env.client.get_workflow_handle(f"resumption-{e}").describe()
    assert child.parent_id == f"parent-{e}"
    assert await child.static_summary() == f"Resume experiment {e} into {STREAM} (group {GROUP})"
    assert "threshold: 40 entries" in (await child.static_details() or "")
    assert await held.get_state(redis, ExperimentKeys(STREAM, e)) == "running"


async def test_worker_stops_cleanly_on_sigterm(temporal_env, task_queue, worker_process) -> None:
    await worker_polling(temporal_env.client, task_queue)
    assert worker_process.poll() is None
    worker_process.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    while worker_process.poll() is None and time.monotonic() - t0 < 20:
        await asyncio.sleep(0.1)
    assert worker_process.returncode == 0


async def script_calls(redis) -> int:  # type: ignore[no-untyped-def]
    """Lua script calls Redis has served since its statistics were reset."""
    stats = await redis.info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


async def until(read: Callable[[], Awaitable[int]], at_least: int, timeout: float) -> None:
    """Wait until ``await read()`` reaches ``at_least``; raises TimeoutError."""
    deadline = time.monotonic() + timeout
    while (value := await read()) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"reached {value}, not {at_least}, in {timeout} s")
        await asyncio.sleep(0.05)


async def test_sigterm_during_back_to_back_polls_stops_the_worker_and_another_finishes(
    temporal_env, redis, redis_url, task_queue, tmp_path
) -> None:
    """An adaptive replay whose every wait is a poll (``max_wait_seconds`` 2, nobody draining)
    keeps its workflow task open with local activities back to back. SIGTERM still stops the
    worker within its shutdown limit (rc 0); a second worker takes the replay over once the
    workflow task times out, and it completes exactly once, in order, under the same token."""
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 20)
    await fill_backlog(redis, 5)
    await redis.config_resetstat()
    log = tmp_path / "worker.log"
    with running_worker(temporal_env, redis_url, task_queue, log) as first:
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            max_backlog_threshold=5,
            throttle_policy="adaptive",
            max_wait_seconds=2,
        )
        # a poll reads the backlog every 50 ms here (a tenth of its 2 s bound, at most 50 ms):
        # 60 script calls in, the first poll is over and another runs
        await until(lambda: script_calls(redis), 60, timeout=30)
        first.send_signal(signal.SIGTERM)
        # bounded: without its shutdown limit the worker never exits (still blocked after 30 s, runner.py)
        t0 = time.monotonic()
        while first.poll() is None and time.monotonic() - t0 < SHUTDOWN_LIMIT_SECONDS + 30:
            await asyncio.sleep(0.1)
    assert first.returncode == 0, log.read_text()
    assert await redis.xlen(STREAM) == 5  # nothing published while nobody drained
    stop, seen = asyncio.Event(), []
    with running_worker(temporal_env, redis_url, task_queue, log):
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen))
        result = await asyncio.wait_for(handle.result(), 90)
        stop.set()
        await consumer
    assert (result.outcome, result.replayed, result.runs) == (Outcome.COMPLETED, 20, 1)
    assert await issued_tokens(redis, ExperimentKeys(STREAM, e)) == [result.token]  # one token throughout
    assert (await stream_tasks(redis))[5:] == names and seen[5:] == names
