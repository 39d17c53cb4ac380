"""Shared test helpers: a worker for the resumption on a test environment, held tasks, consumers,
and readers of a run's history (its Redis calls in order, with their results)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    ListOpenWorkflowExecutionsRequest,
    RegisterNamespaceRequest,
)
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle, WorkflowHistory
from temporalio.exceptions import CancelledError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.consumer import run_consumer
from xmc_resumption.plugin import sandbox_passthrough
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.search_attributes import missing_on
from xmc_resumption.services import free_port
from xmc_resumption.workflows import fleet
from xmc_resumption.workflows.models import Phase, Progress, ResumptionInput
from xmc_resumption.workflows.resumption import ResumptionWorkflow

STREAM = "xmc-tasks-stream"
GROUP = "xmc-workers"


RUNNER = sandbox_passthrough(SandboxedWorkflowRunner())
"""The stand-alone worker's workflow runner (the plugin's ``SANDBOX_PASSTHROUGH``): a test worker
without it imports redis-py again inside the sandbox, which the SDK warns about."""


@asynccontextmanager
async def resumption_worker(client: Client, task_queue: str, redis_url: str) -> AsyncIterator[Worker]:
    """Run a worker with the workflow and its activities (its own Redis client) while in the block."""
    redis = Redis.from_url(redis_url, decode_responses=False)
    mark = len(STARTED)
    try:
        async with Worker(
            client,
            task_queue=task_queue,
            workflows=[ResumptionWorkflow],
            activities=ResumptionActivities(redis).all(),
            workflow_runner=RUNNER,
        ) as worker:
            yield worker
    finally:
        await redis.aclose()
    await assert_runs_replay(client, [h for q, h in STARTED[mark:] if q == task_queue])


STARTED: list[tuple[str, WorkflowHandle]] = []
"""Every run ``start`` started in this process, with its task queue: ``resumption_worker`` replays them at its end."""


async def start(client: Client, task_queue: str, **fields: object) -> WorkflowHandle:
    """Start ``ResumptionWorkflow`` with ``ResumptionInput(**fields)`` under the conventional ID."""
    inp = ResumptionInput.model_validate(fields)
    handle = await client.start_workflow(
        ResumptionWorkflow.run, inp, id=f"resumption-{inp.experiment_id}", task_queue=task_queue
    )
    STARTED.append((task_queue, handle))
    return handle


async def assert_runs_replay(client: Client, handles: list[WorkflowHandle]) -> None:
    """Every run of ``handles`` (each continue-as-new chain) replays on the current workflow code.

    A run and its replay can differ where the workflow reads time or history length after a local activity that
    completed with its workflow task (docs/development.md, "Temporal facts"): every test run is checked, not only
    those a query of an evicted run would catch.
    """
    if not handles:
        return
    histories = [h for handle in handles for h in await chain_histories(client, handle)]

    async def each() -> AsyncIterator[WorkflowHistory]:
        for history in histories:
            yield history

    replayer = Replayer(workflows=[ResumptionWorkflow], data_converter=client.data_converter, workflow_runner=RUNNER)
    async with replayer.workflow_replay_iterator(each()) as results:
        failures = [f"{r.history.workflow_id}: {r.replay_failure}" async for r in results if r.replay_failure]
    assert not failures, failures


async def hold_tasks(redis: Redis, experiment_id: str, n: int, start: int = 0) -> list[bytes]:
    """Pause the experiment and hold tasks t<start>..t<start+n-1>; returns their names."""
    keys = ExperimentKeys(STREAM, experiment_id)
    await held.pause(redis, keys)
    names = [f"{experiment_id}-t{i}".encode() for i in range(start, start + n)]
    for name in names:
        await held.enqueue_task(redis, keys, {b"task": name})
    return names


async def token_floor(redis: Redis) -> int:
    """The floor a claim's fencing token takes now: Redis's clock in microseconds, times 1,000
    (``lua/tokens.lua``'s ``xmc_token_floor``)."""
    seconds, micros = await redis.time()
    return int(f"{seconds}{micros:06d}000")


async def issued_tokens(redis: Redis, keys: ExperimentKeys) -> list[int]:
    """The fencing tokens the experiment's last 16 claims were given, newest first (its acquire log)."""
    return [int(entry.rsplit(b":", 1)[1]) for entry in await redis.lrange(keys.acquire_log, 0, -1)]


async def fill_backlog(redis: Redis, n: int) -> None:
    """Create the group at the stream's end and add ``n`` undelivered entries that are not held tasks."""
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    for i in range(n):
        await redis.xadd(STREAM, {b"task": f"other-{i}".encode()})


async def stream_tasks(redis: Redis) -> list[bytes]:
    """The ``task`` field of every entry in the task stream, in order."""
    return [fields[b"task"] for _, fields in await redis.xrange(STREAM)]


async def wait_for(handle: WorkflowHandle, ok: Callable[[Progress], bool], timeout: float = 20) -> Progress:
    """Poll the ``progress`` query until ``ok(progress)``; raises TimeoutError after ``timeout``.

    Only "not answered yet" is waited out: the server's WorkflowNotReady (no workflow task
    completed), or a query still unanswered after 5 s (the server holds it while a workflow task is
    open, e.g. during a local activity's retries). Any other failure of the query (no such
    workflow, a run closed before its first task, a failing query handler) or of ``ok`` is raised
    at once, and so is the run's end (failed, completed, ...) before ``ok``."""
    deadline = time.monotonic() + timeout
    for polls in itertools.count(1):
        try:
            progress = await asyncio.wait_for(
                handle.query(ResumptionWorkflow.progress), min(5.0, max(0.1, deadline - time.monotonic()))
            )
        except TimeoutError:
            pass
        except RPCError as err:
            if err.status is not RPCStatusCode.FAILED_PRECONDITION:  # WorkflowNotReady
                raise
        else:
            if ok(progress):
                return progress
            if polls % 10 == 0 and (status := (await handle.describe()).status) is not WorkflowExecutionStatus.RUNNING:
                raise AssertionError(f"the run ended ({status.name}) before progress reached the state: {progress}")
        if time.monotonic() > deadline:
            raise TimeoutError("progress never reached the expected state")
        await asyncio.sleep(0.05)
    raise AssertionError("unreachable")


async def worker_polling(client: Client, task_queue: str, timeout: float = 20) -> None:
    """Wait until a worker polls ``task_queue`` for workflow tasks (the server lists its poller)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    deadline = time.monotonic() + timeout
    while not (await client.workflow_service.describe_task_queue(request)).pollers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no worker polled {task_queue} within {timeout:g}s")
        await asyncio.sleep(0.05)


async def cancelled(handle: WorkflowHandle) -> None:
    """Cancel the run and wait for its end while the worker still runs: a run left with a workflow
    task nobody polls holds the time-skipping server's clock for every later test (``open_workflows``)."""
    await handle.cancel()
    try:
        await asyncio.wait_for(handle.result(), 60)
    except WorkflowFailureError as err:
        assert isinstance(err.cause, CancelledError), err.cause
    else:
        raise AssertionError("the run ended without its cancellation")


async def open_workflows(client: Client) -> list[str]:
    """The IDs of the workflows open on ``client``'s namespace (``ListOpenWorkflowExecutions``, which the
    time-skipping test server serves; it has no visibility queries)."""
    service, found, token = client.workflow_service, [], b""
    while True:
        page = await service.list_open_workflow_executions(
            ListOpenWorkflowExecutionsRequest(namespace=client.namespace, maximum_page_size=1000, next_page_token=token)
        )
        found += [e.execution.workflow_id for e in page.executions]
        token = page.next_page_token
        if not token:
            return found


async def bare_namespace(client: Client) -> Client:
    """A new namespace on ``client``'s server without the fleet view's search attributes, once the
    server serves it (a new namespace takes a moment); returns a client of it (same converter)."""
    namespace = f"bare-{uuid.uuid4().hex[:6]}"
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(namespace=namespace, workflow_execution_retention_period=timedelta(days=1))
    )
    bare = await Client.connect(
        client.service_client.config.target_host, namespace=namespace, data_converter=client.data_converter
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            assert await missing_on(bare) == [k.name for k in fleet.ALL]
            return bare
        except RPCError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


Call = tuple[str, Any]
"""One Redis call or durable wait of a run, from its history: (activity type, its result as JSON)
or ("timer", seconds)."""


def history_calls(history: WorkflowHistory) -> list[Call]:
    """Every local activity, regular activity (a call past the workflow task's budget,
    ``workflows/calls.py``) and durable timer of one run's history, in order (a regular activity
    where it completed; one that failed for good shows with result None). A ``publish_rounds`` call reads as the
    ``publish_batch`` results of its first script and, when more ran, its last (every script between them
    published and left headroom); the last carries the call's ``rounds`` (its scripts, tasks moved)."""
    calls: list[Call] = []
    scheduled: dict[int, str] = {}
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = e.activity_task_completed_event_attributes
            payloads = done.result.payloads
            _add_call(calls, scheduled[done.scheduled_event_id], json.loads(payloads[0].data) if payloads else None)
        elif e.event_type in (EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT):
            attributes = (
                e.activity_task_failed_event_attributes
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
                else e.activity_task_timed_out_event_attributes
            )
            calls.append((scheduled[attributes.scheduled_event_id], None))
        elif e.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            calls.append(
                ("timer", e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds())
            )
        elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            details = e.marker_recorded_event_attributes.details
            if "data" not in details:
                continue  # a patch marker
            data = json.loads(details["data"].payloads[0].data)
            result = details["result"].payloads[0].data if "result" in details else b"null"
            _add_call(calls, data["activity_type"], json.loads(result))
    return calls


def _add_call(calls: list[Call], kind: str, result: Any) -> None:
    if kind != "publish_rounds" or result is None:
        calls.append((kind, result))
        return
    scripts = [result["first"]] + ([result["last"]] if result["last"] else [])
    totals = {"scripts": result["scripts"], "moved": result["moved"]}
    calls += [("publish_batch", r) for r in scripts[:-1]] + [("publish_batch", scripts[-1] | {"rounds": totals})]


async def redis_calls(handle: WorkflowHandle) -> list[Call]:
    """``history_calls`` of the run ``handle`` points at (the last run, unless it names one)."""
    return history_calls(await handle.fetch_history())


async def chain_histories(client: Client, handle: WorkflowHandle) -> list[WorkflowHistory]:
    """The history of every run of a resumption, first to last, following continue-as-new."""
    histories: list[WorkflowHistory] = []
    run_id: str | None = handle.first_execution_run_id or handle.result_run_id
    while run_id:
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        histories.append(history)
        last = history.events[-1]
        run_id = (
            last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
            else None
        )
    return histories


def assert_checked_after_every_wait(calls: list[Call]) -> None:
    """After every wait (a timer or a poll) the next Redis call is the pause and fencing check (or
    the release, when the wait ended the run); a queued poll goes on as the durable wait for its turn."""
    for (kind, result), (after, _) in itertools.pairwise(calls):
        if kind == "wait_for_drain" and result["queued"]:
            assert after == "timer", f"{after} right after a queued poll"  # queued: the durable wait for its turn
        elif kind in ("timer", "wait_for_drain"):
            assert after in ("check_claim", "release_claim"), f"{after} right after a wait"


def assert_waited_at_the_threshold(calls: list[Call]) -> None:
    """A publish that found no headroom (throttled) is followed by a wait (or, when a stall ended the run, the
    release), never by a publish; a stalled replay reads its idle consumers (``idle_consumers``) just before the
    wait."""
    for (kind, reading), (after, _) in itertools.pairwise([c for c in calls if c[0] != "idle_consumers"]):
        if kind == "publish_batch" and reading["status"] == "throttled":
            assert after in ("timer", "wait_for_drain", "release_claim"), f"{after} after {reading}"
    for (kind, _), (after, _) in itertools.pairwise(calls):
        if kind == "idle_consumers":
            assert after in ("timer", "wait_for_drain", "release_claim"), f"{after} after idle_consumers"


def assert_never_over(calls: list[Call], threshold: int) -> None:
    """No publish took the backlog past the threshold: the script's own result says what it
    measured before its move (atomically with it) and how much it moved."""
    publishes = [r for kind, r in calls if kind == "publish_batch"]
    assert publishes
    for r in publishes:
        assert r["backlog"] + r["moved"] <= threshold, r


def throttled(progress: Progress) -> bool:
    return progress.phase is Phase.THROTTLED


async def consume(
    redis: Redis, name: str, stop: asyncio.Event, out: list[bytes], per_read: int = 10, rate: float | None = None
) -> None:
    """A task worker on ``STREAM`` in ``GROUP``: see ``xmc.consumer.run_consumer``."""
    await run_consumer(redis, STREAM, GROUP, name, stop, out, count=per_read, rate=rate)


@asynccontextmanager
async def redis_outage(redis: Redis) -> AsyncIterator[None]:
    """Redis refuses every client but the test's own: authentication required, connections dropped."""
    await redis.config_set("requirepass", "outage")
    try:
        await redis.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        yield
    finally:
        await redis.config_set("requirepass", "")


class Scraped:
    """A worker's ``/metrics`` parsed by prometheus-client: ``scraped[name, labels]`` is the value
    of the ``xmc_*`` sample with exactly those labels, once the SDK's own (namespace,
    service_name, workflow_type) are left out; KeyError when there is none."""

    DROPPED = frozenset({"namespace", "service_name", "workflow_type"})

    def __init__(self, text: str) -> None:
        self.values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith("xmc_"):
                    labels = frozenset((k, v) for k, v in s.labels.items() if k not in self.DROPPED)
                    self.values[(s.name, labels)] = s.value

    def __getitem__(self, key: tuple[str, dict[str, str]]) -> float:
        name, labels = key
        return self.values[(name, frozenset(labels.items()))]


def scrape(port: int) -> Scraped:
    """The worker's ``/metrics`` on 127.0.0.1:``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return Scraped(response.read().decode())


@dataclass
class Throttled:
    experiment_id: str
    keys: ExperimentKeys
    names: list[bytes]
    handle: WorkflowHandle


@asynccontextmanager
async def throttled_replay(
    env: WorkflowEnvironment, task_queue: str, redis: Redis, redis_url: str
) -> AsyncIterator[Throttled]:
    """10 held tasks behind a backlog of 5 at threshold 5: the run is in its first throttle wait
    (``fixed``: 10 s), its worker running, when the block starts."""
    e = f"E{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(redis, e, 10)
    await fill_backlog(redis, 5)
    async with resumption_worker(env.client, task_queue, redis_url):
        handle = await start(env.client, task_queue, experiment_id=e, max_backlog_threshold=5, throttle_policy="fixed")
        await wait_for(handle, throttled)
        yield Throttled(e, ExperimentKeys(STREAM, e), names, handle)


ROOT = Path(__file__).resolve().parents[2]


def run_module(
    module: str, *args: str, timeout: float = 30, cwd: Path = ROOT, **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` in ``cwd`` as an operator runs it, with only ``env`` (plus PATH)
    in its environment; output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", **env},
    )


@contextmanager
def running_worker(
    temporal_env: WorkflowEnvironment,
    redis_url: str,
    task_queue: str,
    log_path: Path,
    metrics_port: int | None = None,
    **settings: str,
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m worker`` configured only through the environment, as an operator runs it, with
    ``settings`` (``XMC_*`` variables) besides Temporal's address, Redis and the task queue; killed
    at the end of the block if still running."""
    env = {
        **({"XMC_METRICS_BIND": f"127.0.0.1:{metrics_port}"} if metrics_port else {}),
        **os.environ,
        "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": "default",
        "XMC_REDIS_URL": redis_url,
        "XMC_TASK_QUEUE": task_queue,
        **settings,
    }
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def xmc_process(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m xmc args`` as an operator runs it, against ``redis_url`` and no Temporal (a
    refused port: the commands that need none must not touch it)."""
    return run_module(
        "xmc_resumption", *args, timeout=60, XMC_REDIS_URL=redis_url, TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}"
    )
