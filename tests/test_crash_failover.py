"""A crash failover with a delayed replica, at the Redis layer (issue 23): scripts called directly.

The harness (``tests.support.failover``): a primary and a replica with the docs' settings, the
replica's replication link held by a proxy so that it lags by exactly the writes made since, the
primary killed with SIGKILL, the replica promoted and the clients' stable address moved to it. What
the primary acknowledged while the link was held is lost, and a consumer may have read it.

Without replica acknowledgements Redis loses acknowledged writes; the tests show that it does, and
that nothing of it is silent: tokens never repeat, every task moved again is marked and counted,
an undone completion is found. With them (``XMC_REPLICA_ACKS``) nothing acknowledged is lost and
no acknowledged move is redone.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.support.failover import ACKS, HELD_ACKS, CrashFailover, crash_failover
from tests.support.helpers import GROUP, RUNNER, STREAM, start, wait_for
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.client import XmcClient, XmcSyncClient
from xmc_resumption.client.retries import RETRIES
from xmc_resumption.errors import validation_message
from xmc_resumption.redisclient import failover, fencing, held, publish
from xmc_resumption.redisclient.connection import (
    MAX_REPLICA_ACK_TIMEOUT_MS,
    ReplicaAcks,
    replica_acks,
    require_replica_acks,
)
from xmc_resumption.redisclient.errors import ReplicaAckError
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.readings import MissingGroupPolicy
from xmc_resumption.redisclient.results import ExperimentState, PublishResult, PublishStatus
from xmc_resumption.redisclient.scripts import source
from xmc_resumption.settings import Settings
from xmc_resumption.workflows.models import Outcome
from xmc_resumption.workflows.resumption import ResumptionWorkflow


@pytest_asyncio.fixture
async def servers(tmp_path: Path) -> AsyncIterator[CrashFailover]:
    async with crash_failover(tmp_path) as made:
        yield made


def task(name: str) -> dict[bytes, bytes]:
    return {b"task": name.encode()}


async def hold(client: Redis, keys: ExperimentKeys, names: list[str]) -> list[str]:
    """Pause the experiment and enqueue ``names``, each its own idempotency key; their held entry IDs."""
    await held.pause(client, keys)
    done = await held.enqueue_tasks(client, keys, [task(n) for n in names], names)
    assert {d.destination for d in done} == {"held"}
    return [d.entry_id for d in done]


async def publish_once(
    client: Redis, keys: ExperimentKeys, token: int, seq: int, batch: int, told: PublishResult | None = None
) -> PublishResult:
    """One publish script; ``told``: the last reply the caller got, whose moves it passes back."""
    return await publish.publish_batch(
        client,
        keys,
        GROUP,
        publish.PublishParams(
            token=token,
            seq=seq,
            batch_size=batch,
            threshold=10_000,
            owner="me",
            lease_ms=60_000,
            missing_group=MissingGroupPolicy.ERROR,
            moved_through=told.last_moved_id if told else "",
            replayed=told.replayed if told else None,
        ),
    )


async def read_all(client: Redis, consumer: str = "c1") -> list[dict[bytes, bytes]]:
    """Everything the group has not delivered yet, read and acknowledged by ``consumer``: field maps."""
    seen = []
    while reply := await client.xreadgroup(GROUP, consumer, {STREAM: ">"}, count=100):
        entries = [(entry_id, fields) for _, batch in reply for entry_id, fields in batch]
        seen += [fields for _, fields in entries]
        await client.xack(STREAM, GROUP, *[entry_id for entry_id, _ in entries])
    return seen


def names_of(entries: list[dict[bytes, bytes]]) -> list[str]:
    return [fields[b"task"].decode() for fields in entries]


async def stream_names(client: Redis) -> list[str]:
    return names_of([fields for _, fields in await client.xrange(STREAM)])


async def test_without_replica_acks_acknowledged_enqueues_are_lost(servers: CrashFailover) -> None:
    """The loss window is exact: every enqueue the primary acknowledged while the link was held is gone."""
    keys = ExperimentKeys(STREAM, "L1")
    client = servers.client()
    await hold(client, keys, [f"t{i}" for i in range(10)])
    await servers.in_sync()
    servers.hold()
    acknowledged = await held.enqueue_tasks(client, keys, [task(f"late{i}") for i in range(7)])
    assert [d.destination for d in acknowledged] == ["held"] * 7
    await servers.crash()
    await client.aclose()

    client = servers.client()
    kept = names_of([fields for _, fields in await client.xrange(keys.held)])
    assert kept == [f"t{i}" for i in range(10)]  # the 7 acknowledged enqueues are lost
    await client.aclose()


async def test_a_token_handed_out_after_a_crash_failover_is_above_every_token_before(servers: CrashFailover) -> None:
    """The promoted replica's fence counter lost its last increments (an acquire, a release, another
    acquire); the next acquire's token is above all three, so a late script of any earlier holder is
    fenced, where INCR alone would hand out the lost tokens again."""
    keys = ExperimentKeys(STREAM, "T1")
    client = servers.client()
    await hold(client, keys, ["a", "b"])
    first = await fencing.acquire_claim(client, keys, "run-1", 60_000)
    await servers.in_sync()
    servers.hold()
    second = await fencing.acquire_claim(client, keys, "run-2", 60_000)
    released = await fencing.release_claim(client, keys, second.token, back_to_paused=True, outcome="completed")
    third = await fencing.acquire_claim(client, keys, "run-3", 60_000)
    issued = [first.token, second.token, third.token]
    assert issued == sorted(issued) and len(set(issued)) == 3 and released.token == second.token
    await servers.crash()
    await client.aclose()

    client = servers.client()
    assert await fencing.current_token(client, keys) == first.token  # the counter lost 3 increments
    fourth = await fencing.acquire_claim(client, keys, "run-4", 60_000)
    assert fourth.token > max(issued) + 1  # above every token and the released one's revocation
    for token in issued:
        late = await fencing.check_claim(client, keys, token, "late", 60_000)
        assert (late.fenced, late.fence_lost) == (True, False)
        stale = await publish_once(client, keys, token, seq=1, batch=10)
        assert (stale.status, stale.moved) == (PublishStatus.FENCED, 0)
    await client.aclose()


@pytest.mark.parametrize("told", [False, True], ids=["caller-passes-nothing", "caller-passes-what-it-was-told"])
async def test_a_replay_that_goes_on_after_a_crash_failover_marks_and_counts_every_task_moved_again(
    servers: CrashFailover, told: bool
) -> None:
    """30 held tasks; 10 moves reach the replica, then 15 the consumer reads from the primary alone.
    The run goes on on the promoted replica with its token: Redis holds those 15 again. A caller that
    passes what it was told gets them marked and counted, exactly the tasks the consumer saw twice;
    one that passes nothing gets the old, silent duplicates."""
    keys = ExperimentKeys(STREAM, "R1")
    client = servers.client()
    names = [f"t{i}" for i in range(30)]
    held_ids = await hold(client, keys, names)
    await client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    grant = await fencing.acquire_claim(client, keys, "me", 60_000)
    first = await publish_once(client, keys, grant.token, 1, 10)
    seen = await read_all(client)
    await servers.in_sync()
    servers.hold()
    second = await publish_once(client, keys, grant.token, 2, 10, first)
    third = await publish_once(client, keys, grant.token, 3, 5, second)
    assert (third.replayed, third.last_moved_id, third.redelivered) == (25, held_ids[24], 0)
    seen += await read_all(client)  # the consumer reads the 15 moves the replica never gets
    assert names_of(seen) == names[:25]
    await servers.crash()
    await client.aclose()

    client = servers.client()
    after = await publish_once(client, keys, grant.token, 4, 100, third if told else None)
    seen += await read_all(client)
    assert (after.status, after.moved, after.remaining) == (PublishStatus.COMPLETED, 20, 0)
    assert await stream_names(client) == names  # on the new primary, every task once, in order
    twice = sorted((n for n, c in Counter(names_of(seen)).items() if c == 2), key=names.index)
    assert twice == names[10:25]  # the consumer got these 15 twice
    marked = [fields for fields in seen if failover.redelivery_of(fields)]
    if told:
        assert (after.redelivered, after.redelivered_total, after.behind) == (15, 15, 15)
        assert names_of(marked) == twice  # each task moved again is marked, and only those
        assert [failover.redelivery_of(f) for f in marked] == [
            failover.Redelivery("R1", held_id) for held_id in held_ids[10:25]
        ]
        assert all(
            fields[failover.REDELIVERY_FIELD] == b"R1 " + h.encode()
            for fields, h in zip(marked, held_ids[10:25], strict=True)
        )
    else:
        assert (after.redelivered, after.behind, marked) == (0, 0, [])  # silent: what the issue saw
    assert after.replayed == 30  # the new primary's count: 10 it had, 20 moved now
    await client.aclose()


@pytest.mark.parametrize("lost", ["the-whole-resumption", "its-moves"])
async def test_a_completion_undone_by_a_crash_failover_is_found_and_told(servers: CrashFailover, lost: str) -> None:
    """A resumption completes (every task moved, the claim released), and the promoted replica holds
    its tasks again: paused with no claim and no fence counter when the claim was lost too
    (``the-whole-resumption``, what the issue saw), or resuming under the lost run's token. A
    claim or a fleet look-up given the completion's last moved ID says so; the publish marks them."""
    keys = ExperimentKeys(STREAM, "U1")
    client = servers.client()
    names = [f"t{i}" for i in range(12)]
    held_ids = await hold(client, keys, names)
    await client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    await servers.in_sync()
    if lost == "the-whole-resumption":
        servers.hold()
    grant = await fencing.acquire_claim(client, keys, "run-1", 60_000)
    if lost == "its-moves":
        await servers.in_sync()
        servers.hold()
    done = await publish_once(client, keys, grant.token, 1, 100)
    assert (done.status, done.last_moved_id) == (PublishStatus.COMPLETED, held_ids[-1])
    await fencing.release_claim(client, keys, grant.token, back_to_paused=False, outcome="completed")
    assert names_of(await read_all(client)) == names
    await servers.crash()
    await client.aclose()

    client = servers.client()
    again = await failover.held_again(client, keys, done.last_moved_id)
    expected_state = ExperimentState.PAUSED if lost == "the-whole-resumption" else ExperimentState.RESUMING
    assert (again.held_again, again.held, again.state) == (12, 12, expected_state)
    assert again.token == (0 if lost == "the-whole-resumption" else grant.token)
    other = ExperimentKeys(STREAM, "U2")  # completed, and Redis agrees: nothing held
    undone = await failover.undone_completions(client, STREAM, {"U2": held_ids[0], "U1": done.last_moved_id})
    assert [u.experiment_id for u in undone] == ["U1"]
    assert (await failover.held_again(client, other, "")).held_again == 0

    reclaim = await fencing.acquire_claim(client, keys, "run-2", 60_000, moved_through=done.last_moved_id)
    assert (reclaim.held_again, reclaim.held_again_capped) == (12, False)
    assert reclaim.token > grant.token
    redone = await publish_once(client, keys, reclaim.token, 1, 100, done.model_copy(update={"replayed": 0}))
    assert (redone.moved, redone.redelivered, redone.status) == (12, 12, PublishStatus.COMPLETED)
    assert [failover.redelivery_of(f) for f in await read_all(client)] == [
        failover.Redelivery("U1", held_id) for held_id in held_ids
    ]
    await client.aclose()


async def test_held_again_counts_up_to_its_cap(servers: CrashFailover) -> None:
    keys = ExperimentKeys(STREAM, "C1")
    client = servers.client()
    await held.pause(client, keys)
    done = await held.enqueue_tasks(client, keys, [task(f"t{i}") for i in range(failover.HELD_AGAIN_CAP)])
    done += await held.enqueue_tasks(client, keys, [task("last")])
    last = done[-1].entry_id
    found = await failover.held_again(client, keys, last)
    assert (found.held_again, found.held_again_capped, found.held) == (failover.HELD_AGAIN_CAP, True, 1001)
    exact = await failover.held_again(client, keys, done[-2].entry_id)
    assert (exact.held_again, exact.held_again_capped) == (failover.HELD_AGAIN_CAP, False)
    grant = await fencing.acquire_claim(client, keys, "me", 60_000, moved_through=last)
    assert (grant.held_again, grant.held_again_capped) == (failover.HELD_AGAIN_CAP, True)
    await client.aclose()


@pytest.mark.parametrize("bad", ["x", "1-2-3", "01-1", "1-", "18446744073709551616-0", "1 -1"])
async def test_a_moved_through_that_is_no_entry_id_is_refused_alike_in_lua_and_python(
    servers: CrashFailover, bad: str
) -> None:
    keys = ExperimentKeys(STREAM, "V1")
    client = servers.client()
    with pytest.raises(ValueError, match="moved_through must be a stream entry ID"):
        failover.validate_entry_id("moved_through", bad)
    with pytest.raises(ResponseError, match=r"^XMCARG moved_through \(ARGV\[1\]\) must be a stream entry ID"):
        await client.eval(source("held_again"), 3, keys.held, keys.state, keys.fence, bad)
    await client.aclose()


def test_later_id_and_the_redelivery_mark() -> None:
    assert failover.later_id("", "5-1") == "5-1"
    assert failover.later_id("10-0", "9-99") == "10-0"  # compared as numbers, not as text
    assert failover.later_id("7-10", "7-9") == "7-10"
    with pytest.raises(ValueError, match="must be a stream entry ID"):
        failover.later_id("7", "7-1")
    assert failover.redelivery_of({b"task": b"x"}) is None
    assert failover.redelivery_of({"xmc-redelivery": "E9 1-2"}) == failover.Redelivery("E9", "1-2")
    assert failover.REDELIVERY_FIELD == b"xmc-redelivery"


# --- the acknowledged mode -----------------------------------------------------------------------


async def repl_offset(server: Redis) -> int:
    """The primary's replication offset: it grows with every write it propagates."""
    return int((await server.info("replication"))["master_repl_offset"])


def acknowledged(*clients: Redis, held: bool = False) -> Redis:
    """``clients`` in the acknowledged mode (``HELD_ACKS`` while the link is held); the first."""
    for client in clients:
        require_replica_acks(client, HELD_ACKS if held else ACKS)
    return clients[0]


async def test_with_replica_acks_nothing_acknowledged_is_lost_and_no_acknowledged_move_is_redone(
    servers: CrashFailover,
) -> None:
    """The same crash with ``XMC_REPLICA_ACKS=1``: the enqueue and the publish made while the link
    is held are never acknowledged (``ReplicaAckError``); their retries, after the failover, land
    on the new primary. Every acknowledged enqueue reaches the stream once; no acknowledged move is
    made again (nothing is marked); the consumer saw twice only what it read from the old primary
    of a move that was never acknowledged: the documented limit."""
    keys = ExperimentKeys(STREAM, "A1")
    client = acknowledged(servers.client())
    names = [f"t{i}" for i in range(10)]
    held_ids = await hold(client, keys, names)
    await client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    grant = await fencing.acquire_claim(client, keys, "me", 60_000)
    first = await publish_once(client, keys, grant.token, 1, 4)
    seen = await read_all(client)
    assert names_of(seen) == names[:4]

    servers.hold()
    acknowledged(client, held=True)
    late = [f"late{i}" for i in range(5)]
    with pytest.raises(ReplicaAckError, match=r"enqueue: 0 of 1 replica\(s\) acknowledged"):
        await held.enqueue_tasks(client, keys, [task(n) for n in late], late)
    with pytest.raises(ReplicaAckError, match=r"publish: 0 of 1"):
        await publish_once(client, keys, grant.token, 2, 4, first)
    exposed = await read_all(client)  # read from the old primary: a move never acknowledged
    assert names_of(exposed) == names[4:8]
    await servers.crash()
    await client.aclose()
    await servers.rejoin()  # the old primary comes back as the new one's replica

    client = acknowledged(servers.client())
    retried = await held.enqueue_tasks(client, keys, [task(n) for n in late], late)  # the producer's retry
    assert [d.duplicate for d in retried] == [False] * 5  # the new primary never had them
    results, told, seq = [], first, 2
    while not results or results[-1].status is not PublishStatus.COMPLETED:
        results.append(await publish_once(client, keys, grant.token, seq, 4, told))
        told, seq = results[-1], seq + 1
    seen += exposed + await read_all(client)
    everything = names + late
    assert await stream_names(client) == everything  # every acknowledged enqueue, once, in order
    assert sum(r.redelivered for r in results) == 0 and all(r.behind == 0 for r in results)
    counts = Counter(names_of(seen))
    assert sorted(n for n, c in counts.items() if c > 1) == sorted(names[4:8])  # the documented limit only
    assert set(counts) == set(everything)
    assert not [f for f in seen if failover.redelivery_of(f)]
    assert held_ids  # (the acknowledged moves, t0..t3, stayed where they were: once in the stream)
    await client.aclose()


async def test_a_retry_returns_the_first_answer_and_waits_for_the_replicas_again(servers: CrashFailover) -> None:
    """A publish, an enqueue, an acquire and a release whose replicas did not acknowledge: asked again
    on another connection, each still waits, and fails while the link is held; once the replica has
    everything, each returns its first answer. An answer from the record writes (the fence counter,
    the idempotency record, rewritten with their own values), so that the WAIT covers the write it
    reports also on a server that counts a connection's own writes only (WAIT's documented contract;
    Redis 7.0 counts every write before the connection's last command)."""
    keys = ExperimentKeys(STREAM, "W1")
    first_client, retry_client = acknowledged(servers.client()), acknowledged(servers.client())
    held_ids = await hold(first_client, keys, ["t0", "t1"])
    held_ids += [d.entry_id for d in await held.enqueue_tasks(retry_client, keys, [task("t2")], ["t2"])]
    await first_client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    grant = await fencing.acquire_claim(first_client, keys, "me", 60_000, "req-1")

    calls = [
        (
            lambda c: publish_once(c, keys, grant.token, 1, 2),
            lambda c: held.enqueue_tasks(c, keys, [task("t3")], ["t3"]),
        ),
        (lambda c: fencing.acquire_claim(c, keys, "other", 60_000, "req-2"),),
    ]
    for group in calls:
        servers.hold()
        acknowledged(first_client, retry_client, held=True)
        for client in (first_client, retry_client):
            for call in group:
                with pytest.raises(ReplicaAckError):
                    await call(client)
        servers.release()
        acknowledged(first_client, retry_client)
        if group is calls[0]:
            offset = await repl_offset(servers.primary)
            again = await publish_once(retry_client, keys, grant.token, 1, 2)
            assert (again.repeated, again.moved, again.last_moved_id) == (True, 2, held_ids[1])
            assert await repl_offset(servers.primary) > offset  # the recorded answer wrote
            offset = await repl_offset(servers.primary)
            [enqueued] = await held.enqueue_tasks(retry_client, keys, [task("t3")], ["t3"])
            assert await repl_offset(servers.primary) > offset
            tasks_held = await retry_client.xrange(keys.held)
            assert [fields[b"task"] for _, fields in tasks_held] == [b"t2", b"t3"]  # t3 once
            assert enqueued.entry_id == tasks_held[-1][0].decode()
    offset = await repl_offset(servers.primary)
    newer = await fencing.acquire_claim(retry_client, keys, "other", 60_000, "req-2")
    assert newer.repeated and newer.token > grant.token
    assert await repl_offset(servers.primary) > offset

    servers.hold()
    acknowledged(first_client, retry_client, held=True)
    with pytest.raises(ReplicaAckError):
        await fencing.release_claim(first_client, keys, newer.token, back_to_paused=True, outcome="paused")
    with pytest.raises(ReplicaAckError):
        await fencing.release_claim(retry_client, keys, newer.token, back_to_paused=True, outcome="paused")
    servers.release()
    acknowledged(retry_client)
    release = await fencing.release_claim(retry_client, keys, newer.token, back_to_paused=True, outcome="paused")
    assert (release.token, release.repeated, release.outcome) == (newer.token, True, "paused")
    # what the retries acknowledged is on the replica
    assert await servers.replica.get(keys.state) == b"paused"
    assert await servers.replica.xlen(STREAM) == 2
    await first_client.aclose()
    await retry_client.aclose()


async def test_the_scripts_that_need_no_acknowledgement_do_not_wait(servers: CrashFailover) -> None:
    """The check of a turn and the fleet's look-up write nothing that must survive: they answer
    while the replica is held; a client without the mode never waits."""
    keys = ExperimentKeys(STREAM, "N1")
    client = acknowledged(servers.client())
    await hold(client, keys, ["t0"])
    grant = await fencing.acquire_claim(client, keys, "me", 60_000)
    servers.hold()
    assert not (await fencing.check_claim(client, keys, grant.token, "me", 60_000)).fenced
    assert (await failover.held_again(client, keys, "")).held == 1
    plain = servers.client()
    assert replica_acks(plain) is None and replica_acks(client) == ACKS
    await held.enqueue_tasks(plain, keys, [task("t1")])
    require_replica_acks(client, None)
    await held.enqueue_tasks(client, keys, [task("t2")])
    servers.release()
    await client.aclose()
    await plain.aclose()


async def evalsha_calls(server: Redis) -> int:
    """EVALSHA calls the server ran since its statistics were reset (a NOSCRIPT reply is no run)."""
    stats = (await server.info("commandstats")).get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


@pytest.mark.parametrize("client_kind", ["asyncio", "blocking"])
async def test_producers_retry_an_unacknowledged_keyed_enqueue_and_never_an_unkeyed_one(
    servers: CrashFailover, client_kind: str
) -> None:
    """``XMC_REPLICA_ACKS`` in the producers' clients: while the replica gets nothing, an enqueue whose
    every task has a key is sent 1 + 3 times (each answers as the first, adding nothing again) and
    then raises ``ReplicaAckError``; one without keys is sent once (a retry could add it twice).
    Once the replica is back, the keyed retry answers as the first time and is acknowledged."""
    settings = Settings(redis_url=servers.url, replica_acks=1, replica_ack_timeout_ms=100)  # the link is held
    keys = ExperimentKeys(STREAM, "P1")
    tasks, names = [task("k0"), task("k1")], ["k0", "k1"]
    if client_kind == "asyncio":
        aio = XmcClient.from_settings(settings)

        async def enqueue(idempotency_keys: list[str] | None) -> list[held.Enqueued]:
            return await aio.enqueue_many("P1", tasks, idempotency_keys=idempotency_keys)

        close: Callable[[], Awaitable[None]] = aio.aclose
        producer_redis: object = aio.redis
    else:
        blocking = XmcSyncClient.from_settings(settings)
        producer_redis = blocking.redis

        async def enqueue(idempotency_keys: list[str] | None) -> list[held.Enqueued]:
            return await asyncio.to_thread(blocking.enqueue_many, "P1", tasks, idempotency_keys=idempotency_keys)

        async def close() -> None:
            blocking.close()

    await held.pause(servers.primary, keys)
    await servers.in_sync()
    servers.hold()
    await servers.primary.config_resetstat()
    with pytest.raises(ReplicaAckError, match=r"0 of 1 replica\(s\) acknowledged the write within 100 ms"):
        await enqueue(names)
    assert await evalsha_calls(servers.primary) == 1 + RETRIES
    await servers.primary.config_resetstat()
    with pytest.raises(ReplicaAckError):
        await enqueue(None)
    assert await evalsha_calls(servers.primary) == 1
    assert names_of([f for _, f in await servers.primary.xrange(keys.held)]) == ["k0", "k1", "k0", "k1"]
    servers.release()
    require_replica_acks(producer_redis, ACKS)  # type: ignore[arg-type]  # (100 ms: short on a loaded machine)
    again = await enqueue(names)
    held_ids = [entry_id.decode() for entry_id, _ in await servers.primary.xrange(keys.held)]
    assert [d.entry_id for d in again] == held_ids[:2]  # the first answer
    assert await servers.replica.xlen(keys.held) == 4
    await close()


def test_the_replica_acks_settings_and_their_refusals() -> None:
    assert Settings().replica_acks_required() is None
    on = Settings(replica_acks=2, replica_ack_timeout_ms=250)
    assert on.replica_acks_required() == ReplicaAcks(2, 250)
    assert replica_acks(on.redis()) == ReplicaAcks(2, 250)
    assert replica_acks(on.sync_redis()) == ReplicaAcks(2, 250)
    assert replica_acks(Settings().redis()) is None
    refused = {
        "XMC_REPLICA_ACKS: Input should be less than or equal to 16": {"replica_acks": 17},
        "XMC_REPLICA_ACK_TIMEOUT_MS: Input should be greater than or equal to 1": {
            "replica_acks": 1,
            "replica_ack_timeout_ms": 0,
        },
        "XMC_REPLICA_ACKS is not supported with XMC_REDIS_CLUSTER": {"replica_acks": 1, "redis_cluster": True},
        "XMC_REPLICA_ACK_TIMEOUT_MS (2000) must be below XMC_REDIS_TIMEOUT_SECONDS (2 s)": {
            "replica_acks": 1,
            "replica_ack_timeout_ms": 2000,
            "redis_timeout_seconds": 2,
        },
    }
    for message, fields in refused.items():
        with pytest.raises(ValidationError) as err:
            Settings(**fields)  # type: ignore[arg-type]
        assert message in validation_message(err.value)
    for bad in ((0, 100), (1, 0), (1, MAX_REPLICA_ACK_TIMEOUT_MS + 1), (True, 100)):
        with pytest.raises(ValueError, match="XMC_REPLICA_ACK"):
            ReplicaAcks(*bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not supported with XMC_REDIS_CLUSTER"):
        require_replica_acks(RedisCluster(host="127.0.0.1", port=1), ACKS)


async def test_publish_rounds_count_the_tasks_moved_again_across_their_scripts(redis: Redis) -> None:
    """As on a promoted replica that lost 4 moves: 10 held tasks, the caller told that the first 4
    moved (``moved_through``, ``replayed``). Scripts of 3: the first two move the 4 again, marked;
    the call adds them up, and the replay record keeps the resume's count."""
    keys = ExperimentKeys(STREAM, "PR1")
    held_ids = await hold(redis, keys, [f"t{i}" for i in range(10)])
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    grant = await fencing.acquire_claim(redis, keys, "me", 60_000)
    rounds = await publish.publish_rounds(
        redis,
        keys,
        GROUP,
        publish.PublishParams(
            token=grant.token,
            seq=1,
            batch_size=3,
            max_tasks=None,
            max_scripts=10,
            max_seconds=30,
            threshold=10_000,
            owner="me",
            lease_ms=60_000,
            moved_through=held_ids[3],
            replayed=4,
        ),
    )
    assert (rounds.scripts, rounds.moved, rounds.fresh_redelivered) == (4, 10, 4)
    assert (rounds.first.redelivered, rounds.first.behind, rounds.last_moved_id) == (3, 4, held_ids[-1])
    assert rounds.last is not None and rounds.last.redelivered_total == 4 and rounds.last.status == "completed"
    marked = [failover.redelivery_of(fields) for _, fields in await redis.xrange(STREAM)]
    assert marked == [failover.Redelivery("PR1", i) for i in held_ids[:4]] + [None] * 6
    with pytest.raises(ValueError, match=r"replayed must be 0\.\.2\^53"):
        await publish_once(redis, keys, grant.token, 9, 1, rounds.first.model_copy(update={"replayed": -1}))


async def test_a_replay_with_replica_acks_waits_while_the_replica_lags_then_completes(
    temporal_env: WorkflowEnvironment, servers: CrashFailover, task_queue: str
) -> None:
    """The workflow on a worker whose client requires one replica's acknowledgement: while the
    replica gets nothing, no claim or publish counts as done (the run waits out the Redis fault,
    naming it); once the replica is back, the run completes, every task once, on the replica too."""
    keys = ExperimentKeys(STREAM, "WA1")
    names = [f"t{i}" for i in range(20)]
    await hold(servers.primary, keys, names)
    await servers.primary.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    client = acknowledged(servers.client())
    servers.hold()
    async with Worker(
        temporal_env.client,
        task_queue=task_queue,
        workflows=[ResumptionWorkflow],
        activities=ResumptionActivities(client).all(),
        workflow_runner=RUNNER,
    ):
        handle = await start(temporal_env.client, task_queue, experiment_id="WA1", max_backlog_threshold=100)
        waiting = await wait_for(handle, lambda p: p.redis_waits > 0, timeout=60)
        assert "replica(s) acknowledged the write" in (waiting.last_error or "")
        assert waiting.replayed == 0
        servers.release()
        result = await asyncio.wait_for(handle.result(), 60)
    assert (result.outcome, result.replayed, result.remaining) == (Outcome.COMPLETED, 20, 0)
    assert await stream_names(servers.primary) == names
    await servers.in_sync()
    assert await stream_names(servers.replica) == names
    await client.aclose()
