"""A failover behind a stable address (issue 6, item 3), with two real redis-servers.

A managed Redis fails over by promoting a replica and moving its DNS name to it; the old primary
becomes a replica of the new one. Here the stable address is a TCP proxy on a loopback port
(``tests.support.proxy.SwitchableProxy``): new connections go to its current target, connections
opened before the switch stay with the old server (as they do across a DNS change) unless the
switch resets them. A crash failover, which loses writes, is tested in ``test_crash_failover.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytest_asyncio
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError, ReadOnlyError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from tests.support.helpers import (
    GROUP,
    STREAM,
    consume,
    hold_tasks,
    resumption_worker,
    start,
    stream_tasks,
    throttled,
    wait_for,
)
from tests.support.proxy import SwitchableProxy
from xmc_resumption import reconcile as reconcile_module
from xmc_resumption.activities.requests import AcquireRequest, CheckRequest, ExperimentRef, PublishRequest
from xmc_resumption.activities.resumption import Reachability, ResumptionActivities, _classified
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams, publish_batch
from xmc_resumption.redisclient.readings import MissingGroupPolicy
from xmc_resumption.redisclient.results import ExperimentState
from xmc_resumption.services import local_redis
from xmc_resumption.workflows.models import Outcome, Reconciled, ReconcileInput, ResumptionInput
from xmc_resumption.workflows.resumption import ResumptionWorkflow

NO_CLIENT_RETRY = Retry(NoBackoff(), 0)
"""redis-py's own reconnect-and-resend on a connection error is off, so a reset shows as the
activity's error, as it does with redis-py versions that do not retry by default."""


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = 10) -> None:
    """Await ``condition()`` until it is true, polling every 10 ms; TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.01)


@dataclass
class Servers:
    """``a``, the primary behind ``proxy`` at first; ``b``, a standalone server; clients to each."""

    a: Redis
    b: Redis
    a_port: int
    b_port: int
    proxy: SwitchableProxy

    async def nothing_open_to_a(self) -> bool:
        """No connection through the proxy goes to A (the old primary) now."""
        return self.proxy.open_to(self.a_port) == 0

    async def fail_over(self, *, reset: bool = False) -> None:
        """What a managed failover does: B replicates A until it has every write (A's writes paused
        meanwhile), B is promoted, the stable address moves to B, A becomes B's replica (READONLY)."""
        await self.b.execute_command("REPLICAOF", "127.0.0.1", self.a_port)
        await self.a.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
        try:
            a_offset = (await self.a.info("replication"))["master_repl_offset"]

            async def b_has_every_write() -> bool:
                info = await self.b.info("replication")
                return info.get("master_link_status") == "up" and info.get("slave_repl_offset") == a_offset

            await until(b_has_every_write)
            await self.b.execute_command("REPLICAOF", "NO", "ONE")
            self.proxy.switch(self.b_port, reset=reset)
            await self.a.execute_command("REPLICAOF", "127.0.0.1", self.b_port)
        finally:
            await self.a.execute_command("CLIENT", "UNPAUSE")
        assert (await self.a.info("replication"))["role"] == "slave"


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@pytest.fixture
def server_urls(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two redis-servers, started in ``tmp_path``: a replica stores its primary's snapshot as
    ``dump.rdb`` in its working directory, which the next redis-server started there would load."""
    with contextlib.ExitStack() as servers:
        with contextlib.chdir(tmp_path):  # only while they start: the tests' own paths are relative
            a = servers.enter_context(local_redis(log_file=tmp_path / "redis-a.log"))
            b = servers.enter_context(local_redis(log_file=tmp_path / "redis-b.log"))
        yield a, b


@pytest_asyncio.fixture
async def servers(server_urls: tuple[str, str]) -> AsyncIterator[Servers]:
    url_a, url_b = server_urls
    a, b = Redis.from_url(url_a, decode_responses=False), Redis.from_url(url_b, decode_responses=False)
    for server in (a, b):
        await server.config_set("repl-diskless-sync-delay", 0)  # sync at once (Redis 7.0 waits 5 s)
    proxy = SwitchableProxy(_port(url_a))
    await proxy.start()
    yield Servers(a, b, _port(url_a), _port(url_b), proxy)
    await proxy.close()
    await a.aclose()
    await b.aclose()


REF = ExperimentRef(experiment_id="F1", stream=STREAM, consumer_group=GROUP)
KEYS = ExperimentKeys(STREAM, REF.experiment_id)


@pytest.mark.parametrize("reset", [False, True], ids=["readonly", "connection-reset"])
async def test_after_a_failover_one_call_fails_once_and_its_retry_reaches_the_new_primary(
    servers: Servers, reset: bool
) -> None:
    names = await hold_tasks(servers.a, REF.experiment_id, 10)
    client = Redis.from_url(servers.proxy.url, decode_responses=False, retry=NO_CLIENT_RETRY)
    activities, env = ResumptionActivities(client), ActivityEnvironment()
    try:
        grant = await env.run(
            activities.acquire_claim, AcquireRequest(ref=REF, owner="me", lease_ms=60_000, request_id="r1")
        )
        await asyncio.gather(*(client.ping() for _ in range(3)))  # three pooled connections, all to A
        assert servers.proxy.open_to(servers.a_port) == 3

        await servers.fail_over(reset=reset)
        check = CheckRequest(ref=REF, token=grant.token, owner="me", lease_ms=60_000)
        with pytest.raises(RedisConnectionError if reset else ReadOnlyError) as err:
            await env.run(activities.check_claim, check)  # on a connection of before the switch
        assert not isinstance(err.value, ApplicationError)  # Temporal's retry policy retries it

        # the retry, and every call after it (however many connections the pool had), reach B
        checks = await asyncio.gather(*(env.run(activities.check_claim, check) for _ in range(3)))
        assert {(c.fenced, c.current_token, c.state) for c in checks} == {
            (False, grant.token, ExperimentState.RESUMING)
        }
        published = await env.run(
            activities.publish_rounds,
            PublishRequest(
                ref=REF,
                params=PublishParams(
                    token=grant.token,
                    seq=1,
                    batch_size=4,
                    threshold=100,
                    owner="me",
                    lease_ms=60_000,
                    missing_group=MissingGroupPolicy.ZERO,  # no group reads this stream: the stream is the backlog
                ),
            ),
        )
        assert (published.moved, published.final.remaining) == (4, 6)
        assert await stream_tasks(servers.b) == names[:4]
        await until(servers.nothing_open_to_a)  # the pool kept no connection to the old primary
        assert servers.proxy.open_to(servers.b_port) >= 1
    finally:
        await client.aclose()


async def test_a_moved_reply_drops_the_pooled_connections_and_is_retried(servers: Servers) -> None:
    """MOVED (a cluster node that lost the slot) is retryable and, like READONLY, closes the pool's
    connections: the next command runs on a new connection (a new client ID)."""
    client = Redis.from_url(servers.proxy.url, decode_responses=False)
    try:
        before = await client.client_id()
        with pytest.raises(MovedError):
            async with _classified(client, Reachability()):
                raise MovedError("3999 127.0.0.1:6381")
        assert await client.client_id() != before
    finally:
        await client.aclose()


async def test_a_failover_mid_replay_completes_without_restarting_the_worker(
    temporal_env: WorkflowEnvironment, servers: Servers, task_queue: str
) -> None:
    """60 held tasks at threshold 20 with no consumer: the replay publishes 20 and waits. Meanwhile
    A fails over to B behind the worker's address; consumers then drain B, and the same worker
    replays the other 40 into B without a Redis-unavailable wait: every task once, in order."""
    e = "F2"
    names = await hold_tasks(servers.a, e, 60)
    await servers.a.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    async with resumption_worker(temporal_env.client, task_queue, servers.proxy.url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=20, batch_size=7)
        progress = await wait_for(handle, throttled)
        assert (progress.replayed, progress.backlog) == (20, 20)

        await servers.fail_over()
        assert await stream_tasks(servers.b) == names[:20]  # B has every write A took
        stop, seen = asyncio.Event(), []
        consumer = asyncio.create_task(consume(servers.b, "c1", stop, seen))
        result = await asyncio.wait_for(handle.result(), 15)
        stop.set()
        await consumer
        progress = await handle.query(ResumptionWorkflow.progress)
        await until(servers.nothing_open_to_a)  # the worker's pool kept no connection to the old primary

    assert (result.outcome, result.replayed, result.remaining) == (Outcome.COMPLETED, 60, 0)
    assert progress.redis_waits == 0  # each READONLY was mended by the call's own retry
    assert await stream_tasks(servers.b) == names  # every task exactly once, in order
    assert seen == names
    assert await servers.b.xlen(ExperimentKeys(STREAM, e).held) == 0
    assert await held.get_state(servers.b, ExperimentKeys(STREAM, e)) is ExperimentState.RUNNING


async def test_reconcile_skips_a_finding_a_resume_or_pause_made_stale(
    redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between finding the undone completions and starting one, R1 was resumed (claimed) and R2 resumed to the
    end and paused again with a new task: each is skipped, saying why; R3, still undone, is started."""
    found, started = [], []
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    for e in ("R1", "R2", "R3"):
        keys = ExperimentKeys(STREAM, e)
        await held.pause(redis, keys)
        ids = [
            d.entry_id
            for d in await held.enqueue_tasks(redis, keys, [{b"task": f"{e}-{i}".encode()} for i in range(3)])
        ]
        found.append(
            Reconciled(experiment_id=e, workflow_id=f"resumption-{e}", moved_through=ids[-1], held_again=3, held=3,
                       state="paused")
        )  # fmt: skip
    r1, r2 = ExperimentKeys(STREAM, "R1"), ExperimentKeys(STREAM, "R2")
    await fencing.acquire_claim(redis, r1, "resumption-R1", 8_000)
    grant = await fencing.acquire_claim(redis, r2, "resumption-R2", 8_000)
    params = PublishParams(
        token=grant.token, seq=1, batch_size=10, threshold=100, owner="resumption-R2", lease_ms=8_000
    )
    assert (await publish_batch(redis, r2, GROUP, params)).moved == 3
    await fencing.release_claim(redis, r2, grant.token, owner="resumption-R2", back_to_paused=False)
    await held.pause(redis, r2)
    await held.enqueue_tasks(redis, r2, [{b"task": b"R2-new"}])

    async def found_before(*_: object) -> list[Reconciled]:
        return found

    async def completed(_: object, undone: Reconciled) -> ResumptionInput:
        return ResumptionInput(experiment_id=undone.experiment_id, moved_through=undone.moved_through)

    async def start_it(_: object, inp: ResumptionInput, task_queue: str) -> SimpleNamespace:
        started.append(inp.experiment_id)
        return SimpleNamespace(id=f"resumption-{inp.experiment_id}")

    monkeypatch.setattr(reconcile_module, "undone_completions", found_before)
    monkeypatch.setattr(reconcile_module, "completed_input", completed)
    monkeypatch.setattr(reconcile_module, "start_resumption", start_it)
    done = await reconcile_module.reconcile(None, redis, ReconcileInput(stream=STREAM))  # type: ignore[arg-type]
    assert started == ["R3"]
    assert [(r.experiment_id, r.started, r.error) for r in done] == [
        ("R1", None, "skipped: it is resuming now, not paused (resumed or paused since)"),
        ("R2", None, f"skipped: it holds no task at or below {found[1].moved_through} any more (resumed since)"),
        ("R3", "resumption-R3", None),
    ]
