"""The operators' side of ``xmc_resumption.client`` against the dev server and a real redis-server:
``resume`` and ``resume_many`` make ``xmc resume``'s checks before anything starts and return
handles; ``stop``, ``configure``, ``status`` and ``list_resumptions``; the blocking client's
operator calls on its own event loop."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from pydantic import ValidationError
from redis.asyncio import Redis
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import (
    GROUP,
    ROOT,
    STREAM,
    fill_backlog,
    hold_tasks,
    resumption_worker,
    stream_tasks,
    wait_for,
)
from xmc_resumption.client import FleetRow, NothingToResumeError, ResumeError, XmcClient, XmcSyncClient
from xmc_resumption.errors import OperatorError
from xmc_resumption.settings import Settings
from xmc_resumption.workflows.control import ControlChange
from xmc_resumption.workflows.models import Phase, ResumptionInput

pytestmark = [pytest.mark.real_server, pytest.mark.slow]


def ids(prefix: str, n: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"{prefix}{tag}-{i}" for i in range(n)]


@pytest_asyncio.fixture
async def client(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str
) -> AsyncIterator[XmcClient]:
    async with XmcClient.from_settings(
        Settings(redis_url=redis_url, task_queue=task_queue), temporal=temporal_env.client
    ) as made:
        yield made


async def terminate(client: Client, *experiments: str) -> None:
    for e in experiments:
        try:
            await client.get_workflow_handle(f"resumption-{e}").terminate("test over")
        except RPCError as err:
            if err.status is not RPCStatusCode.NOT_FOUND:
                raise


async def not_started(client: Client, experiment: str) -> bool:
    try:
        await client.get_workflow_handle(f"resumption-{experiment}").describe()
    except RPCError as err:
        return err.status is RPCStatusCode.NOT_FOUND
    return False


async def test_resume_checks_every_experiment_before_it_starts_any(
    client: XmcClient, temporal_env: WorkflowEnvironment, redis: Redis, task_queue: str
) -> None:
    """No worker polls: the runs stay open, so a second start of one finds it running."""
    a, b, c, d, e = ids("K", 5)
    for experiment in (a, c, d, e):
        await hold_tasks(redis, experiment, 3)
    try:
        with pytest.raises(
            NothingToResumeError,
            match=rf"experiment {b} has no key on xmc-tasks-stream \(never paused here: .*\): nothing to resume",
        ):
            await client.resume_many([a, b])
        assert await not_started(temporal_env.client, a)  # a refusal starts none
        with pytest.raises(ValidationError, match="batch_size"):
            await client.resume(a, batch_size=0)
        await redis.config_set("maxmemory-policy", "allkeys-lru")
        try:
            with pytest.raises(OperatorError, match="maxmemory-policy allkeys-lru"):
                await client.resume(a)
        finally:
            await redis.config_set("maxmemory-policy", "noeviction")
        assert await not_started(temporal_env.client, a)

        handles = await client.resume_many([a, c, a], batch_size=7)  # given twice: started once
        assert [h.id for h in handles] == [f"resumption-{a}", f"resumption-{c}"]
        for h in handles:
            desc = await h.describe()
            assert (desc.status, desc.task_queue) == (WorkflowExecutionStatus.RUNNING, task_queue)
        with pytest.raises(WorkflowAlreadyStartedError):
            await client.resume(a)
        with pytest.raises(ResumeError) as err:
            await client.resume_many([a, d])
        assert [h.id for h in err.value.started] == [f"resumption-{d}"]
        assert isinstance(err.value.failures[a], WorkflowAlreadyStartedError)
        assert str(err.value).startswith(
            f"1 of 2 resumptions started; {a}: a resumption is already running: resumption-{a}"
        )

        forced = await client.resume(b, force=True)  # nothing held, but forced
        other = await client.resume(ResumptionInput(experiment_id=e, batch_size=3), task_queue=f"{task_queue}-2")
        assert (await other.describe()).task_queue == f"{task_queue}-2"
        assert forced.id == f"resumption-{b}"
        with pytest.raises(TypeError, match="not both"):
            await client.resume(ResumptionInput(experiment_id=e), batch_size=3)
    finally:
        await terminate(temporal_env.client, a, b, c, d, e)


async def test_resume_stop_configure_status_and_list(
    client: XmcClient, temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str
) -> None:
    done, stopped = ids("R", 2)
    names = await hold_tasks(redis, done, 20)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        # no group yet: under 'zero' the stream's entries (fewer than the threshold) are the backlog
        handle = await client.resume(done, missing_group="zero")
        result = await handle.result()
        assert (result.outcome.value, result.replayed, result.remaining) == ("completed", 20, 0)
        assert await stream_tasks(redis) == names

        await hold_tasks(redis, stopped, 30)
        await fill_backlog(redis, 5)  # no consumer ever reads: throttled at threshold 5
        throttled = await client.resume(stopped, max_backlog_threshold=5, throttle_seconds=1)
        await wait_for(throttled, lambda p: p.phase is Phase.THROTTLED)
        effective = await client.configure(stopped, ControlChange(batch_size=2))
        assert (effective.batch_size, effective.max_backlog_threshold, effective.stopping) == (2, 5, False)
        with pytest.raises(OperatorError, match=r"rejected the change: .*claim_lease_seconds"):
            await client.configure(stopped, ControlChange(throttle_seconds=500))
        status = await client.status(stopped)
        assert (status.state, status.held) == ("resuming", 30)
        # the run's claim holds the last token issued (tokens start above Redis's clock, not at 1)
        assert status.fence == int(status.claim["token"]) > 0
        assert status.run is not None and status.run["status"] == "running"
        stopping = await client.stop(stopped)
        assert stopping.settings.stopping and stopping.handle.id == f"resumption-{stopped}"
        assert (await stopping.handle.result()).outcome.value == "paused"
        with pytest.raises(OperatorError, match=f"no resumption of {stopped} runs: resumption-{stopped} ended"):
            await client.stop(stopped)

    status = await client.status(done)
    assert (status.state, status.held, status.run and status.run["status"]) == ("running", 0, "completed")
    deadline = time.monotonic() + 15
    rows: list[FleetRow] = []
    while not any(r.remaining == 0 for r in rows) and time.monotonic() < deadline:  # visibility lags
        rows = await client.list_resumptions(experiment_id=done)
        await asyncio.sleep(0.3)
    assert [(r.workflow_id, r.status, r.outcome, r.replayed, r.remaining) for r in rows] == [
        (f"resumption-{done}", "completed", "completed", 20, 0)
    ]
    with pytest.raises(ValueError, match="limit must be"):
        await client.list_resumptions(limit=0)


async def test_the_sync_client_resumes_and_waits_on_its_own_event_loop(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The blocking client connects to Temporal through envconfig, like ``xmc``; its calls run in a
    thread here because the test's worker runs on the test's event loop."""
    [experiment] = ids("Y", 1)
    monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_env.client.service_client.config.target_host)
    sync = XmcSyncClient.from_settings(Settings(redis_url=redis_url, task_queue=task_queue))
    try:
        await asyncio.to_thread(sync.pause, experiment)
        await asyncio.to_thread(sync.enqueue_many, experiment, [{"task": f"t{i}"} for i in range(10)])
        await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)  # the consumers' group
        # plan, then resume many: the blocking client has both
        plan = await asyncio.to_thread(sync.plan, experiment, sample_seconds=0.2, max_backlog_threshold=50)
        assert (plan.experiment_id, plan.held, plan.threshold, plan.refusals) == (experiment, 10, 50, [])
        with pytest.raises(NothingToResumeError, match="has no key on xmc-tasks-stream"):
            await asyncio.to_thread(sync.check_resumable, [ResumptionInput(experiment_id=f"{experiment}-none")])
        await asyncio.to_thread(sync.check_resumable, [ResumptionInput(experiment_id=experiment)])
        async with resumption_worker(temporal_env.client, task_queue, redis_url):
            [handle] = await asyncio.to_thread(sync.resume_many, [experiment])
            result = await asyncio.to_thread(sync.result, handle)
        assert (result.outcome.value, result.replayed) == ("completed", 10)
        status = await asyncio.to_thread(sync.status, experiment)
        assert status.run is not None and status.run["status"] == "completed"
        await hold_tasks(redis, experiment, 1)
        with pytest.raises(OperatorError, match=f"no resumption of {experiment} runs"):
            await asyncio.to_thread(sync.stop, experiment)
        with pytest.raises(OperatorError, match=f"no resumption of {experiment} runs"):
            await asyncio.to_thread(sync.configure, experiment, ControlChange(batch_size=2))
        rows = await asyncio.to_thread(sync.list_resumptions, experiment_id=experiment)
        assert all(r.experiment_id in (experiment, None) for r in rows)
        started = await asyncio.to_thread(sync.resume, experiment)  # 1 task held again
        assert started.id == f"resumption-{experiment}"
    finally:
        await asyncio.to_thread(sync.close)
        await terminate(temporal_env.client, experiment)
    assert [f[b"task"] for _, f in await redis.xrange("xmc-tasks-stream")] == [f"t{i}".encode() for i in range(10)]


async def test_the_docs_plan_then_resume_many_script_runs(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str
) -> None:
    """docs/producers.md's sync "plan, then resume many" script, run as it is in its own process."""
    doc = (ROOT / "docs" / "producers.md").read_text()
    after = doc[doc.index("Plan, then resume many, in sync code:") :]
    code = after[after.index("```python\n") + 10 : after.index("\n```", after.index("```python\n"))]
    for e in ("exp-1", "exp-2"):
        await hold_tasks(redis, e, 5)
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "XMC_REDIS_URL": redis_url,
        "XMC_TASK_QUEUE": task_queue,
        "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
    }
    try:
        async with resumption_worker(temporal_env.client, task_queue, redis_url):
            proc = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
            )
    finally:
        await terminate(temporal_env.client, "exp-1", "exp-2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["resumption-exp-1 completed", "resumption-exp-2 completed"]
    assert len(await stream_tasks(redis)) == 10
