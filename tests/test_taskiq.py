"""Issue 14, item 7: the replay against a real third-party consumer, taskiq-redis's
``RedisStreamBroker`` (``taskiq worker`` processes, unmodified; tests/support/taskiq_app.py). It creates its
consumer group at ``$`` when it starts, and reclaims another consumer's pending entries only after
a read that returned entries: the two edges of issue 14 (a group created after the resume, a
consumer that dies holding entries)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from redis.asyncio import Redis
from taskiq.formatters.json_formatter import JSONFormatter
from taskiq.message import TaskiqMessage
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import ROOT, STREAM, resumption_worker, run_module, start, wait_for
from tests.test_e2e import running_worker
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.workflows.models import Outcome, Phase
from xmc_resumption.workflows.text import details_markdown

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

TASKIQ_GROUP = "taskiq"
EXECUTED = "taskiq-test:executed"


def message(task_name: str, n: int) -> bytes:
    """A taskiq message as ``RedisStreamBroker.kick`` writes it (the ``data`` field's value)."""
    task = TaskiqMessage(task_id=uuid.uuid4().hex, task_name=task_name, labels={}, labels_types={}, args=[n], kwargs={})
    return JSONFormatter().dumps(task).message


async def hold_taskiq_tasks(redis: Redis, experiment_id: str, task_name: str, n: int) -> None:
    """Pause the experiment and hold ``n`` taskiq tasks ``task_name(i)``, as a producer would."""
    keys = ExperimentKeys(STREAM, experiment_id)
    await held.pause(redis, keys)
    for i in range(n):
        await held.enqueue_task(redis, keys, {b"data": message(task_name, i)})


@contextmanager
def taskiq_worker(redis_url: str, log: Path, consumer: str | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``taskiq worker tests.support.taskiq_app:broker``, one worker process running one task at a time,
    acknowledging once a task has run; in its own process group, killed (SIGKILL) at the end."""
    env = {**os.environ, "XMC_TASKIQ_REDIS_URL": redis_url}
    if consumer:
        env["XMC_TASKIQ_CONSUMER"] = consumer
    taskiq = Path(sys.executable).parent / "taskiq"
    args = [str(taskiq), "worker", "tests.support.taskiq_app:broker", "--workers", "1", "--max-async-tasks", "1"]
    args += ["--ack-type", "when_executed"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            kill_group(proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s process group (the taskiq main process and its worker process)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def until(check, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.05)


async def test_consumers_started_after_the_resume_execute_every_task_once_in_order(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str, tmp_path: Path
) -> None:
    """The issue's first case: the consumers start about 1 s after the resume and create their group
    at ``$``. The seed's rule (a missing group is backlog 0) moved every task before the group
    existed and the group saw none (0 of 2,000). With the default policy (``wait``) the replay
    waits for the group, and every task runs exactly once, in order."""
    e = f"TQ{uuid.uuid4().hex[:6]}"
    n = 300
    await hold_taskiq_tasks(redis, e, "record", n)
    with running_worker(temporal_env, redis_url, task_queue, tmp_path / "worker.log"):
        handle = await start(
            temporal_env.client,
            task_queue,
            experiment_id=e,
            consumer_group=TASKIQ_GROUP,
            max_backlog_threshold=50,
            batch_size=50,
            throttle_seconds=1,
        )
        waiting = await wait_for(handle, lambda p: p.phase is Phase.WAITING_FOR_GROUP, timeout=30)
        assert waiting.replayed == 0 and not await redis.exists(STREAM)
        await asyncio.sleep(1.0)
        with taskiq_worker(redis_url, tmp_path / "taskiq.log"):
            result = await asyncio.wait_for(handle.result(), 120)
            await until(lambda: _executed(redis, n))
            # nothing ran twice: nothing is left pending nor undelivered, and the count holds
            await asyncio.sleep(0.5)
            pending = await redis.xpending(STREAM, TASKIQ_GROUP)
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.COMPLETED, n, 0)
    assert [int(x) for x in await redis.lrange(EXECUTED, 0, -1)] == list(range(n))
    assert pending["pending"] == 0 and await redis.xlen(STREAM) == n


async def _executed(redis: Redis, n: int) -> bool:
    return int(await redis.llen(EXECUTED)) >= n


async def test_a_consumer_killed_holding_pending_entries_is_named_in_the_stall(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str, tmp_path: Path
) -> None:
    """The issue's third case: a taskiq consumer reads the replay's 20 tasks (threshold 20) and is
    killed (SIGKILL) while holding them; taskiq reclaims only after a read that returned entries, so
    nobody drains them. The replay stalls, and the stall reason, the UI's details and ``xmc
    status`` name the group, the consumer and its count; ``max_stall_seconds`` ends it ``stalled``,
    the 40 tasks never delivered still held."""
    e = f"TQ{uuid.uuid4().hex[:6]}"
    await hold_taskiq_tasks(redis, e, "hang", 60)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        with taskiq_worker(redis_url, tmp_path / "taskiq.log", consumer="worker-a") as proc:
            await until(lambda: _group_exists(redis))
            handle = await start(
                temporal_env.client,
                task_queue,
                experiment_id=e,
                consumer_group=TASKIQ_GROUP,
                max_backlog_threshold=20,
                batch_size=20,
                throttle_seconds=1,
                stall_window_seconds=2,
                max_stall_seconds=30,
            )
            await until(lambda: _pending(redis, 20))
            kill_group(proc)
        progress = await wait_for(handle, lambda p: p.stalled and bool(p.idle_consumers), timeout=30)
        assert [(c.group, c.consumer, c.pending) for c in progress.idle_consumers] == [(TASKIQ_GROUP, "worker-a", 20)]
        assert progress.stall_reason is not None
        assert (
            "pending entries held by idle consumers: taskiq/worker-a holds 20 pending, idle " in progress.stall_reason
        )
        assert progress.stall_reason.startswith("backlog 20 of group taskiq (pending 20) not going down")
        assert "taskiq/worker-a holds 20 pending" in details_markdown(progress)
        env = {
            "XMC_REDIS_URL": redis_url,
            "XMC_TASK_QUEUE": task_queue,
            "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
        }
        status_args = ("status", e, "--group", TASKIQ_GROUP, "--idle-seconds", "1")
        # in a thread: the worker runs on this event loop while the command asks it for progress
        text = await asyncio.to_thread(run_module, "xmc_resumption", *status_args, **env)
        doc = await asyncio.to_thread(run_module, "xmc_resumption", *status_args, "--json", **env)
        result = await asyncio.wait_for(handle.result(), 60)
    assert text.returncode == 0, text.stderr
    assert "idle consumers holding pending entries: taskiq/worker-a holds 20, idle " in text.stdout
    assert "STALLED" in text.stdout and "taskiq/worker-a holds 20 pending" in text.stdout
    status = json.loads(doc.stdout)
    assert [(c["group"], c["consumer"], c["pending"]) for c in status["idle_consumers"]] == [
        (TASKIQ_GROUP, "worker-a", 20)
    ]
    assert status["backlog"]["limiting_group"] == TASKIQ_GROUP and status["backlog"]["pending"] == 20
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.STALLED, 20, 40)
    assert await held.get_state(redis, ExperimentKeys(STREAM, e)) == "paused"


async def _group_exists(redis: Redis) -> bool:
    try:
        return any(g["name"] == TASKIQ_GROUP.encode() for g in await redis.xinfo_groups(STREAM))
    except Exception:
        return False


async def _pending(redis: Redis, n: int) -> bool:
    try:
        return int((await redis.xpending(STREAM, TASKIQ_GROUP))["pending"]) >= n
    except Exception:
        return False
