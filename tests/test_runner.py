"""The runner and the one way to reach Temporal, as an embedder uses them: the application of
docs/embedding.md (its own ``workflows`` and ``activities``, ``ResumptionPlugin`` on a client
connected with ``temporal_connect_config()``, ``run_worker`` and ``setup_logging``), written from the
page as it is and run in its own process. With ``TEMPORAL_NAMESPACE`` set it polls that namespace
(not ``default``) and replays there; sent SIGTERM while a replay waits, it exits 0 within its bound
and the replay is handed over: a second worker finishes it, every task once and in order."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from redis.asyncio import Redis
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest, RegisterNamespaceRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import GROUP, STREAM, consume, fill_backlog, hold_tasks, stream_tasks, throttled, wait_for
from tests.test_wheel import APP_TASK_QUEUE, app_env, write_app
from xmc_resumption import search_attributes
from xmc_resumption.runner import SHUTDOWN_LIMIT_SECONDS, run_worker
from xmc_resumption.services import free_port

pytestmark = [pytest.mark.real_server, pytest.mark.slow]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs' example application, written from docs/embedding.md."""
    where = tmp_path_factory.mktemp("app")
    files = write_app(where)
    assert "run_worker(make_worker)" in files["worker.py"] and "**temporal_connect_config()" in files["worker.py"]
    return where


@contextmanager
def app_worker(app: Path, address: str, redis_url: str, log: Path, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python worker.py`` of the application, configured through the environment only (this
    checkout's interpreter; tests/test_wheel.py runs it where only the wheel is installed)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "worker.py"],
            cwd=app,
            env=app_env(
                TEMPORAL_ADDRESS=address, XMC_REDIS_URL=redis_url, METRICS_BIND=f"127.0.0.1:{free_port()}", **env
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def pollers(client: Client, task_queue: str) -> list[str]:
    """The identities of the workers that polled ``task_queue`` lately (the server keeps them for minutes)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    return [p.identity for p in (await client.workflow_service.describe_task_queue(request)).pollers]


async def until_polled(client: Client, task_queue: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait (bounded) until a worker polls ``task_queue`` in ``client``'s namespace."""
    for _ in range(400):
        if await pollers(client, task_queue):
            return
        assert proc.poll() is None, log.read_text()
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no worker polled {task_queue} in namespace {client.namespace}: {log.read_text()}")


async def new_namespace(client: Client) -> Client:
    """A namespace of its own on the dev server, with the search attributes, once it is served."""
    namespace = f"experiments-{uuid.uuid4().hex[:6]}"
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(namespace=namespace, workflow_execution_retention_period=timedelta(days=1))
    )
    made = await Client.connect(
        client.service_client.config.target_host, namespace=namespace, data_converter=client.data_converter
    )
    for _ in range(100):
        try:
            await search_attributes.register(made)
            return made
        except RPCError:  # the namespace is not served yet
            await asyncio.sleep(0.2)
    raise TimeoutError(f"namespace {namespace} was not served")


async def test_the_documented_worker_polls_the_namespace_envconfig_names(
    app: Path, temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, tmp_path: Path
) -> None:
    default = temporal_env.client
    ns = await new_namespace(default)
    address = default.service_client.config.target_host
    log = tmp_path / "worker.log"
    with app_worker(app, address, redis_url, log, TEMPORAL_NAMESPACE=ns.namespace) as proc:
        await until_polled(ns, APP_TASK_QUEUE, proc, log)
        # the SDK's identity is "<pid>@<host>"; other tests' workers may have polled `default` lately
        assert any(i.startswith(f"{proc.pid}@") for i in await pollers(ns, APP_TASK_QUEUE))
        assert not any(i.startswith(f"{proc.pid}@") for i in await pollers(default, APP_TASK_QUEUE))
        e = f"E{uuid.uuid4().hex[:6]}"
        names = await hold_tasks(redis, e, 20)
        await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        said = await asyncio.wait_for(
            ns.execute_workflow("ResumeExperiment", e, id=f"platform-{e}", task_queue=APP_TASK_QUEUE, result_type=str),
            60,
        )
        assert said == f"{e}: completed, 20 tasks replayed"
        assert await stream_tasks(redis) == names
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=SHUTDOWN_LIMIT_SECONDS + 10) == 0
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(line["logger"] == "xmc.worker" and line["message"] == "stopping worker" for line in lines), lines
    assert any(line.get("experiment_id") == e for line in lines)  # setup_logging: the resumption's fields
    assert "Traceback" not in log.read_text()


async def test_sigterm_during_a_replay_exits_0_and_another_worker_finishes_it(
    app: Path, temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, tmp_path: Path
) -> None:
    client = temporal_env.client
    address = client.service_client.config.target_host
    log = tmp_path / "worker.log"
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 20)
    await fill_backlog(redis, 500)  # at the default threshold, nobody draining: the replay waits
    with app_worker(app, address, redis_url, log) as first:
        await until_polled(client, APP_TASK_QUEUE, first, log)
        parent = await client.start_workflow(
            "ResumeExperiment", e, id=f"platform-{e}", task_queue=APP_TASK_QUEUE, result_type=str
        )
        child = client.get_workflow_handle(f"resumption-{e}")
        for _ in range(200):  # the parent starts it
            try:
                await child.describe()
                break
            except RPCError:
                await asyncio.sleep(0.05)
        await wait_for(child, throttled, timeout=60)
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=SHUTDOWN_LIMIT_SECONDS + 10) == 0, log.read_text()
    assert (await child.describe()).status is WorkflowExecutionStatus.RUNNING  # handed over, not lost
    assert await redis.xlen(STREAM) == 500  # nothing published while nobody drained
    stop, seen = asyncio.Event(), []
    with app_worker(app, address, redis_url, log):
        consumer = asyncio.create_task(consume(redis, "c1", stop, seen, per_read=100))
        said = await asyncio.wait_for(parent.result(), 120)
        stop.set()
        await consumer
    assert said == f"{e}: completed, 20 tasks replayed"
    assert (await stream_tasks(redis))[500:] == names and seen[500:] == names
    assert "Traceback" not in log.read_text()


def test_run_worker_refuses_a_shutdown_bound_that_is_no_positive_number() -> None:
    async def never() -> None:
        raise AssertionError("not called")

    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="shutdown_limit must be a positive number of seconds"):
            run_worker(never, shutdown_limit=bad)  # type: ignore[arg-type]
