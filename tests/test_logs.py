"""The worker's structured logs: a real ``python -m worker`` process on the dev server replays a few
held tasks through a throttle wait, and its stderr is read back line by line as JSON; the SDK
core's own warnings (a Temporal gone away) are JSON lines too."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import (
    GROUP,
    STREAM,
    consume,
    fill_backlog,
    hold_tasks,
    start,
    throttled,
    wait_for,
    worker_polling,
)
from xmc_resumption.services import local_temporal
from xmc_resumption.workflows.models import Outcome

pytestmark = [pytest.mark.real_server, pytest.mark.slow]


def _worker_env(address: str, redis_url: str, task_queue: str, log_format: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "XMC_"))}
    return env | {
        "TEMPORAL_ADDRESS": address,
        "XMC_REDIS_URL": redis_url,
        "XMC_TASK_QUEUE": task_queue,
        "XMC_LOG_FORMAT": log_format,
    }


def _records(log: Path) -> list[dict[str, Any]]:
    """Every non-empty line of ``log`` parsed as one JSON object (a line that is not JSON fails)."""
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines, "the worker logged nothing"
    return [json.loads(line) for line in lines]


@asynccontextmanager
async def _worker(
    temporal_env: WorkflowEnvironment, redis_url: str, task_queue: str, log_format: str, log: Path
) -> AsyncIterator[subprocess.Popen[bytes]]:
    """``python -m worker`` logging to ``log`` in ``log_format``, polling when the block starts;
    stopped by SIGTERM at its end (its exit code is then the process's ``returncode``)."""
    address = temporal_env.client.service_client.config.target_host
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "worker"],
            env=_worker_env(address, redis_url, task_queue, log_format),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            await worker_polling(temporal_env.client, task_queue)
            yield worker
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)


async def test_worker_logs_one_json_object_a_line_with_the_extra_fields(
    temporal_env, redis, redis_url, task_queue, tmp_path
) -> None:
    log = tmp_path / "worker.log"
    async with _worker(temporal_env, redis_url, task_queue, "json", log) as worker:
        e = f"E{uuid.uuid4().hex[:6]}"
        names = await hold_tasks(redis, e, 30)
        await fill_backlog(redis, 10)  # at the threshold: the first turn waits
        handle = await start(temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=10,
                             batch_size=10, throttle_seconds=0.5)  # fmt: skip
        await wait_for(handle, throttled)  # then the consumer drains what holds it back
        stop, seen = asyncio.Event(), []
        drain = asyncio.create_task(consume(redis, "c1", stop, seen))
        result = await asyncio.wait_for(handle.result(), 60)
        stop.set()
        await drain
    assert worker.returncode == 0
    assert result.outcome is Outcome.COMPLETED and result.replayed == len(names)
    records = _records(log)
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records), records[0]

    waits = [r for r in records if r["message"] == "throttled"]
    assert len(waits) == result.throttles >= 1
    first = waits[0]
    assert first["experiment_id"] == e
    assert first["seconds"] == 0.5  # the pause duration, as a number
    assert first["reason"].startswith("backlog 10 >= 10"), first["reason"]
    assert first["temporal_workflow"]["workflow_id"] == handle.id  # the SDK's context, as an object
    assert first["level"] == "INFO" and first["logger"] == "temporalio.workflow"

    (began,) = [r for r in records if r["message"] == "resumption started"]
    assert (began["experiment_id"], began["token"], began["held"]) == (e, result.token, len(names))
    (claimed,) = [r for r in records if r["message"] == "claim taken"]  # an activity's record
    assert (claimed["token"], claimed["temporal_activity"]["activity_type"]) == (result.token, "acquire_claim")

    (end,) = [r for r in records if r["message"] == "resumption ended"]
    assert (end["experiment_id"], end["outcome"], end["replayed"]) == (e, "completed", len(names))
    assert len(await redis.xrange(STREAM)) == 10 + len(names)
    assert (await redis.xpending(STREAM, GROUP))["pending"] == 0


async def test_text_format_keeps_one_plain_line_a_record(temporal_env, redis_url, task_queue, tmp_path) -> None:
    log = tmp_path / "worker.log"
    async with _worker(temporal_env, redis_url, task_queue, "text", log) as worker:
        pass
    assert worker.returncode == 0
    lines = log.read_text().splitlines()
    assert any(line.endswith(f"INFO xmc.worker worker polling task queue {task_queue}") for line in lines), lines
    assert not any(line.startswith("{") for line in lines), lines


async def test_the_sdk_cores_warnings_are_json_lines_too(redis_url, tmp_path) -> None:
    """The SDK core (Rust) warns when its polls fail: a worker whose Temporal goes away logs those
    warnings through Python logging (``settings.sdk_runtime``), so every line it prints is still one
    JSON object, none ANSI-coloured (they were printed by the core itself, coloured)."""
    log, task_queue = tmp_path / "worker.log", f"xmc-test-{uuid.uuid4().hex[:8]}"
    with local_temporal(port=None, ui_port=None) as address, open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "worker"],
            env=_worker_env(address, redis_url, task_queue, "json"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        await _until(lambda: f"worker polling task queue {task_queue}" in log.read_text(), 30)
    # the server is gone (the block stopped it): the core's polls fail, are retried, and it warns
    try:
        await _until(lambda: "temporalio.core" in log.read_text(), 60)
    finally:
        worker.send_signal(signal.SIGTERM)
        await asyncio.to_thread(worker.wait, 60)
    text = log.read_text()
    assert "\x1b[" not in text  # no ANSI escape
    records = _records(log)  # every line parses as one JSON object
    core = [r for r in records if r["logger"].startswith("temporalio.core")]
    assert core and all(r["level"] == "WARNING" for r in core), core[:3]
    assert any("poll_" in r["message"] and "retried" in r["message"] for r in core), core[:3]
    assert all("temporal_log" not in r for r in core)


async def _until(ok: Callable[[], bool], timeout: float) -> None:
    """Wait until ``ok()``; raises TimeoutError after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not ok():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"not within {timeout:g}s")
        await asyncio.sleep(0.2)
