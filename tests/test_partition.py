"""A worker cut off from Redis hands its replay on (issue 23 item 4).

Two workers on one task queue, each reaching the session's redis-server through its own TCP proxy on
loopback (``LosingProxy``), with the worker's Redis settings (``Settings.redis``, no client retries, as the plugin
builds it). The replay starts on worker A, which keeps its workflow (sticky); then A's proxy drops
every byte (a partition: Temporal still reachable). The first local call that fails shows the fault
in the progress and goes on as a regular activity, which worker B takes: B moves tasks within the
claim's lease plus 10 s (a bounded wait on that condition). Healed, the replay completes, every task
once and in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import TimeoutError as RedisTimeoutError
from temporalio.activity import ActivityCancellationDetails
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import TimeoutError as AttemptTimeout
from temporalio.exceptions import TimeoutType
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from tests.support.failover import until
from tests.support.helpers import GROUP, RUNNER, STREAM, consume, hold_tasks, start, stream_tasks, wait_for
from tests.support.proxy import losing_proxy
from tests.test_cli import Xmc, xmc_fixture  # noqa: F401  (the fixture)
from xmc_resumption.activities.requests import AcquireRequest, ExperimentRef
from xmc_resumption.activities.resumption import UNREACHED_SECONDS, Reachability, ResumptionActivities
from xmc_resumption.client.views import cut_off
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.settings import Settings
from xmc_resumption.workflows.calls import CONNECTION_FAULTS, HAND_OFF_SECONDS, HandOff, connection_fault
from xmc_resumption.workflows.models import Outcome
from xmc_resumption.workflows.resumption import ResumptionWorkflow

LEASE_SECONDS = 8.0


async def _gone(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)


def worker_client(port: int) -> Redis:
    """A worker's Redis client through ``port``: the plugin's settings (timeouts, no client retries)."""
    return Settings(redis_url=f"redis://127.0.0.1:{port}/0").redis(retries=0)  # type: ignore[return-value]


@pytest.mark.real_server
@pytest.mark.slow
async def test_a_worker_cut_off_from_redis_hands_its_replay_to_one_that_reaches_it(
    temporal_env: WorkflowEnvironment, redis: Redis, redis_url: str, task_queue: str, xmc: Xmc
) -> None:
    """A alone, then cut: the fault shows, the claim's lease lapses, and ``xmc status`` says the run is alive
    and cut off, not orphaned. B starts: it moves tasks within the lease plus 10 s."""
    e = "P1"
    temporal = temporal_env.client.service_client.config.target_host
    names = await hold_tasks(redis, e, 600)
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    stop, seen = asyncio.Event(), []
    consumer = asyncio.ensure_future(consume(redis, "c1", stop, seen, per_read=10, rate=40))
    port = redis.connection_pool.connection_kwargs["port"]
    with losing_proxy(port) as to_a, losing_proxy(port) as to_b:
        client_a, client_b = worker_client(to_a.port), worker_client(to_b.port)
        # worker B in a process of its own would have its own Temporal client: so it has here
        own = await Client.connect(
            temporal_env.client.service_client.config.target_host, data_converter=pydantic_data_converter
        )
        workers = [
            Worker(
                temporal,
                task_queue=task_queue,
                workflows=[ResumptionWorkflow],
                activities=ResumptionActivities(client).all(),
                workflow_runner=RUNNER,
                identity=name,
            )
            for name, client, temporal in (("worker-a", client_a, temporal_env.client), ("worker-b", client_b, own))
        ]
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(workers[0])
            handle = await start(
                temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=20,
                claim_lease_seconds=LEASE_SECONDS, throttle_seconds=2.0, redis_retry_seconds=2.0,
            )  # fmt: skip
            await wait_for(handle, lambda p: p.replayed >= 60, timeout=60)  # the run lives on worker A now
            to_a.cut()
            shown = await wait_for(handle, lambda p: p.redis_handoffs > 0, timeout=30)
            assert shown.last_error and ("Timeout" in shown.last_error or "onnect" in shown.last_error), shown
            keys = ExperimentKeys(STREAM, e)
            await until(lambda: _gone(redis, keys.claim), timeout=LEASE_SECONDS + 30, what="the lease lapsing")
            ran = await asyncio.to_thread(xmc, "status", e, "--json", temporal=temporal)
            doc = json.loads(ran.stdout)
            assert (doc["state"], doc["orphaned"], doc["cut_off"], doc["run"]["status"]) == (
                "resuming", False, True, "running"
            ), ran  # fmt: skip
            text = (await asyncio.to_thread(xmc, "status", e, temporal=temporal)).stdout
            assert text.startswith(f"{e} on {STREAM}: resuming (running, its worker cannot reach Redis"), text
            await stack.enter_async_context(workers[1])
            at_b = (await handle.query(ResumptionWorkflow.progress)).replayed
            # worker B moves tasks (the promise: within the claim's lease plus 10 s of its start; a bound here that a
            # loaded machine cannot break, the time printed for the record)
            t0 = time.monotonic()
            moved = await wait_for(handle, lambda p: p.replayed > at_b, timeout=120)
            print(f"worker B moved tasks {time.monotonic() - t0:.1f}s after its start (lease {LEASE_SECONDS:g}s)")
            assert moved.remaining is not None and moved.remaining < len(names) - at_b
            history = await handle.fetch_history()
            by_b = [
                ev for ev in history.events
                if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
                and ev.activity_task_started_event_attributes.identity == "worker-b"
            ]  # fmt: skip
            assert by_b, "no activity ran on worker B"
            to_a.heal()
            result = await asyncio.wait_for(handle.result(), 120)
        for client in (client_a, client_b):
            await client.aclose()
    stop.set()
    await consumer
    assert (result.outcome, result.replayed, result.remaining, result.redelivered) == (
        Outcome.COMPLETED, len(names), 0, 0
    )  # fmt: skip
    assert await stream_tasks(redis) == names  # every task once, in order
    assert sorted(seen) == sorted(names)


def test_only_a_connection_fault_hands_the_calls_on() -> None:
    """``connection_fault`` reads the cause's type; ``HandOff`` tells the workflow once per fault and once back."""
    from temporalio.exceptions import ApplicationError

    told: list[str] = []
    hand_off = HandOff(on_fault=lambda err: told.append(f"fault {err}"), on_back=lambda: told.append("back"))
    for kind in CONNECTION_FAULTS:
        assert connection_fault(ApplicationError("x", type=kind))
    assert not connection_fault(ApplicationError("x", type="ReplicaAckError"))
    for timeout, faulted in ((TimeoutType.START_TO_CLOSE, True), (TimeoutType.SCHEDULE_TO_START, False)):
        attempt = AttemptTimeout("Activity timed out", type=timeout, last_heartbeat_details=[])
        failed = RuntimeError("Local Activity timed out")  # the call's failure, its cause the attempt's timeout
        failed.__cause__ = attempt
        assert connection_fault(failed) is faulted, timeout
    assert not connection_fault(ValueError("x"))
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    hand_off.succeeded(local=True)  # nothing handed on yet: nothing to tell
    assert not hand_off.handed_on(t0)
    hand_off.fault(ApplicationError("Timeout reading from socket", type="TimeoutError"), t0)
    hand_off.succeeded(local=False)  # a regular activity succeeded, on some worker: told once
    hand_off.succeeded(local=False)
    assert hand_off.handed_on(t0 + timedelta(seconds=HAND_OFF_SECONDS - 1))
    assert not hand_off.handed_on(t0 + timedelta(seconds=HAND_OFF_SECONDS))  # then a local attempt tries again
    assert hand_off.remote
    hand_off.succeeded(local=True)
    assert (hand_off.remote, told) == (False, ["fault TimeoutError: Timeout reading from socket", "back"])


def test_an_orphan_whose_run_is_alive_is_cut_off_instead() -> None:
    """``runs.cut_off``: orphaned only with no run alive in Temporal."""
    assert cut_off(True, {"status": "running"}) == {"orphaned": False, "cut_off": True}
    assert cut_off(True, {"status": "completed"}) == {"orphaned": True, "cut_off": False}
    assert cut_off(True, {"error": "cannot reach Temporal"}) == {"orphaned": True, "cut_off": False}
    assert cut_off(True, None) == {"orphaned": True, "cut_off": False}
    assert cut_off(None, {"status": "running"}) == {"orphaned": None, "cut_off": False}
    assert cut_off(False, {"status": "running"}) == {"orphaned": False, "cut_off": False}


@pytest.mark.slow
async def test_a_worker_that_saw_a_connection_fault_probes_redis_before_its_calls(redis: Redis) -> None:
    """``Reachability``: no probe before any fault; after one, a PING bounded by 0.5 s, then calls failing at once
    for a second after a probe failed; a probe answered ends the window."""
    with losing_proxy(redis.connection_pool.connection_kwargs["port"]) as proxy:
        client = worker_client(proxy.port)
        reach = Reachability()
        await reach.probe(client)  # nothing seen: nothing sent
        assert await client.ping()
        proxy.cut()
        reach.fault()
        with pytest.raises(RedisTimeoutError, match=r"did not answer a PING within 0\.5s"):
            await reach.probe(client)
        assert reach.unreached_at is not None
        with pytest.raises(RedisTimeoutError, match=r"within 0\.5s"):  # within UNREACHED_SECONDS: no PING sent
            await reach.probe(client)
        proxy.heal()
        await asyncio.sleep(UNREACHED_SECONDS)
        await reach.probe(client)
        assert (reach.faulted_at, reach.unreached_at) == (None, None)
        await client.aclose()


@pytest.mark.slow
async def test_an_attempt_past_its_start_to_close_makes_the_worker_probe_redis(redis: Redis) -> None:
    """A call cut off from Redis by a long socket timeout, cancelled as timed out: the next call probes Redis
    and fails within the probe's bound, not after the socket timeout."""
    with losing_proxy(redis.connection_pool.connection_kwargs["port"]) as proxy:
        client = Settings(redis_url=f"redis://127.0.0.1:{proxy.port}/0", redis_timeout_seconds=300).redis(retries=0)
        acts = ResumptionActivities(client)  # type: ignore[arg-type]
        assert await client.ping()
        proxy.cut()
        req = AcquireRequest(
            ref=ExperimentRef(experiment_id="T1", stream=STREAM, consumer_group=GROUP),
            owner="w", lease_ms=8000, request_id="r1",
        )  # fmt: skip
        env = ActivityEnvironment()
        attempt = asyncio.ensure_future(env.run(acts.acquire_claim, req))
        await asyncio.sleep(0.5)  # the call sent its script and waits for the reply
        env.cancel(ActivityCancellationDetails(timed_out=True))
        with pytest.raises(asyncio.CancelledError):
            await attempt
        assert acts.reach.faulted_at is not None
        with pytest.raises(RedisTimeoutError, match=r"did not answer a PING within 0\.5s"):
            await asyncio.wait_for(ActivityEnvironment().run(acts.acquire_claim, req), 30)
        proxy.heal()
        await client.aclose()


def test_a_new_connection_waits_the_connect_timeout_at_most() -> None:
    """``XMC_REDIS_CONNECT_TIMEOUT_SECONDS``: 2 s by default, never above the socket timeout, finite and positive."""
    assert Settings()._client_kwargs()["socket_connect_timeout"] == 2.0
    assert Settings(redis_connect_timeout_seconds=0.5)._client_kwargs()["socket_connect_timeout"] == 0.5
    assert Settings(redis_timeout_seconds=1.0)._client_kwargs()["socket_connect_timeout"] == 1.0
    for bad in (0, -1, float("inf"), 301):
        with pytest.raises(ValidationError, match="redis_connect_timeout_seconds"):
            Settings(redis_connect_timeout_seconds=bad)
