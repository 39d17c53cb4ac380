"""The producers' side of ``xmc_resumption.client`` against a real redis-server: pause, enqueue one
and many (one script call), idempotency keys (a reply really lost by a proxy, then retried), the
record's bounds, the enqueue script's refusals before any write, and the blocking client."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
import redis as sync_redis
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from tests.support.proxy import LosingProxy, losing_proxy
from tests.support.secure import ROOT
from xmc_resumption.client import Enqueued, EnqueueInterruptedError, XmcClient, XmcSyncClient
from xmc_resumption.redisclient import held
from xmc_resumption.redisclient.deadletter import MAX_TASK_FIELDS
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.scripts import run_script, source
from xmc_resumption.settings import Settings

STREAM = "xmc-tasks-stream"


def run_module_code(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with this interpreter as a script of the user's, with only ``env`` (plus PATH)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **env}
    )


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


@pytest_asyncio.fixture
async def client(redis: Redis, redis_url: str) -> AsyncIterator[XmcClient]:
    """An ``XmcClient`` made from settings (redis-py's own retries off), on an emptied database."""
    async with XmcClient.from_settings(Settings(redis_url=redis_url)) as made:
        yield made


@pytest.fixture
def sync_client(redis: Redis, redis_url: str) -> Iterator[XmcSyncClient]:
    with XmcSyncClient.from_settings(Settings(redis_url=redis_url)) as made:
        yield made


async def calls_of(redis: Redis, command: str) -> int:
    """How often the server ran ``command`` since the last ``CONFIG RESETSTAT``."""
    stats = await redis.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_enqueue_many_is_one_script_call_and_keeps_order(client: XmcClient, redis: Redis) -> None:
    keys = ExperimentKeys(STREAM, "C1")
    running = await client.enqueue("C1", {"task": "r0"})
    assert (running.destination, running.duplicate) == ("stream", False)
    await client.pause("C1")
    assert await redis.get(keys.state) == b"paused"
    await redis.config_resetstat()
    done = await client.enqueue_many("C1", [{"task": f"t{i}", "n": i} for i in range(500)])
    assert await calls_of(redis, "evalsha") == 1 and await calls_of(redis, "xadd") == 500
    assert [d.destination for d in done] == ["held"] * 500 and not any(d.duplicate for d in done)
    entries = await redis.xrange(keys.held)
    assert [eid.decode() for eid, _ in entries] == [d.entry_id for d in done]
    assert [f[b"task"] for _, f in entries] == [f"t{i}".encode() for i in range(500)]
    assert entries[7][1] == {b"task": b"t7", b"n": b"7"}
    assert await redis.xlen(keys.stream) == 1


async def test_an_idempotency_key_adds_a_task_once(client: XmcClient, redis: Redis) -> None:
    keys = ExperimentKeys(STREAM, "C2")
    await client.pause("C2")
    first = await client.enqueue("C2", {"task": "a"}, idempotency_key="order-1")
    again = await client.enqueue("C2", {"task": "a"}, idempotency_key="order-1")
    assert first == Enqueued("held", first.entry_id, False)
    assert again == Enqueued("held", first.entry_id, True)
    # in one batch: a key seen before, a new key twice, no key twice (both added)
    batch = await client.enqueue_many(
        "C2",
        [{"task": "a"}, {"task": "b"}, {"task": "b"}, {"task": "c"}, {"task": "c"}],
        idempotency_keys=["order-1", b"order-2", "order-2", None, ""],
    )
    assert [(b.destination, b.duplicate) for b in batch] == [
        ("held", True), ("held", False), ("held", True), ("held", False), ("held", False),
    ]  # fmt: skip
    assert batch[0].entry_id == first.entry_id and batch[2].entry_id == batch[1].entry_id
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == [b"a", b"b", b"c", b"c"]
    # the record: key -> '<destination> <entry ID> <request ID>', with the record's TTL
    recorded = (await redis.hget(keys.idempotency, "order-1") or b"").decode()
    assert re.fullmatch(rf"held {first.entry_id} [0-9a-f]{{32}}/0", recorded), recorded
    assert 86_000_000 < await redis.pttl(keys.idempotency) <= held.IDEMPOTENCY_TTL_MS
    # a key is the experiment's: another experiment's same key is another task
    other = await client.enqueue("C3", {"task": "a"}, idempotency_key="order-1")
    assert (other.destination, other.duplicate) == ("stream", False)


async def test_a_duplicate_reports_where_the_task_first_went(client: XmcClient, redis: Redis) -> None:
    first = await client.enqueue("C4", {"task": "a"}, idempotency_key="k")
    await client.pause("C4")  # the retry comes while paused: the task is not held a second time
    again = await client.enqueue("C4", {"task": "a"}, idempotency_key="k")
    assert (again.destination, again.entry_id, again.duplicate) == ("stream", first.entry_id, True)
    assert await redis.xlen(ExperimentKeys(STREAM, "C4").held) == 0


async def test_the_record_is_bounded_by_two_generations(client: XmcClient, redis: Redis) -> None:
    keys = ExperimentKeys(STREAM, "C5")
    n = held.IDEMPOTENCY_RECORD_KEYS
    per_call = held.MAX_ENQUEUE_TASKS
    for start in range(0, 2 * n + 1, per_call):
        count = min(per_call, 2 * n + 1 - start)
        await client.enqueue_many(
            "C5",
            [{"t": str(i)} for i in range(start, start + count)],
            idempotency_keys=[f"k{i}" for i in range(start, start + count)],
        )
    # k0..k9999 filled the first generation, k10000..k19999 the second; k20000 pushed the first out
    assert (await redis.hlen(keys.idempotency), await redis.hlen(keys.idempotency_previous)) == (1, n)
    assert await redis.pttl(keys.idempotency_previous) > 0
    kept = await client.enqueue("C5", {"t": "again"}, idempotency_key=f"k{n}")
    forgotten = await client.enqueue("C5", {"t": "again"}, idempotency_key=f"k{n - 1}")
    assert kept.duplicate and not forgotten.duplicate
    assert await redis.xlen(keys.stream) == 2 * n + 2


async def test_arguments_are_checked_before_any_write(client: XmcClient, redis: Redis) -> None:
    keys = ExperimentKeys(STREAM, "C6")
    await client.pause("C6")
    bad = [
        (["0"], 'XMCARG the number of tasks (ARGV[1]) must be 1..1000, got "0"'),
        (["1001"], "XMCARG the number of tasks (ARGV[1]) must be 1..1000"),
        (["x"], "XMCARG the number of tasks"),
        (["2", "", "", "1", "f", "v"], "XMCARG task 2 of 2: missing its idempotency key or field count"),
        (["1"], "XMCARG the request ID (ARGV[2]) must be 0..128 bytes, got none"),
        (["1", "r" * 129, "", "1", "f", "v"], "XMCARG the request ID (ARGV[2]) must be 0..128 bytes, got 129 bytes"),
        (["1", "r", "", "0"], 'XMCARG task 1: the field count must be 1..3995, got "0"'),
        (["1", "r", "", "3996"], "XMCARG task 1: the field count must be 1..3995"),
        (["1", "r", "", "2", "f", "v", "g"], "XMCARG task 1: 2 fields need 4 values, got 3"),
        (["1", "r", "", "1", "f", "v", "extra"], "XMCARG 1 arguments after the last of 1 tasks"),
        (["1", "r", "k" * 257, "1", "f", "v"], "XMCARG task 1: an idempotency key has at most 256 bytes, got 257"),
        # a valid first task does not get written when the second is malformed
        (["2", "r", "k1", "1", "f", "v", "", "two"], "XMCARG task 2: the field count must be 1..3995"),
    ]
    for args, expected in bad:
        with pytest.raises(ResponseError) as err:
            await run_script(redis, "enqueue", keys.enqueue_keys, args)
        assert str(err.value).startswith(expected), (args, str(err.value))
    assert await redis.exists(keys.held, keys.stream, keys.idempotency) == 0


async def test_keys_of_the_wrong_type_and_a_corrupt_record_are_refused(client: XmcClient, redis: Redis) -> None:
    keys = ExperimentKeys(STREAM, "C7")
    await client.pause("C7")
    await redis.set(keys.idempotency_previous, "garbage")
    with pytest.raises(
        ResponseError, match=re.escape(f"WRONGTYPE {keys.idempotency_previous} is a string, expected a hash")
    ):
        await client.enqueue("C7", {"task": "a"})
    await redis.delete(keys.idempotency_previous)
    await redis.hset(keys.idempotency, "k", "not an entry")
    with pytest.raises(ResponseError, match=r'XMCCORRUPT the idempotency record of .* holds "not an entry"'):
        await client.enqueue_many("C7", [{"task": "a"}, {"task": "b"}], idempotency_keys=[None, "k"])
    assert await redis.xlen(keys.held) == 0  # task 1, without a key, was not written either
    await redis.hset(keys.idempotency, "k", "held 1-1x")  # no space before a request ID
    with pytest.raises(ResponseError, match=r'XMCCORRUPT the idempotency record of .* holds "held 1-1x"'):
        await client.enqueue("C7", {"task": "a"}, idempotency_key="k")
    # a record of a call without a request ID is read: a duplicate for any request
    await redis.hset(keys.idempotency, "k", "held 1-1")
    assert await client.enqueue("C7", {"task": "a"}, idempotency_key="k") == Enqueued("held", "1-1", True)


def test_tasks_are_checked_in_python_before_a_call() -> None:
    with pytest.raises(ValueError, match=r"1\.\.1000 tasks, got 0"):
        held.enqueue_args([])
    with pytest.raises(ValueError, match=r"1\.\.1000 tasks, got 1001"):
        held.enqueue_args([{"f": "v"}] * 1001)
    with pytest.raises(ValueError, match="2 idempotency keys for 1 tasks"):
        held.enqueue_args([{"f": "v"}], ["a", "b"])
    with pytest.raises(ValueError, match="task 0: an idempotency key has at most 256 bytes, got 257"):
        held.enqueue_args([{"f": "v"}], ["é" * 128 + "x"])
    with pytest.raises(ValueError, match="task 1: a task needs at least one field"):
        held.enqueue_args([{"f": "v"}, {}])
    with pytest.raises(ValueError, match=f"more than {MAX_TASK_FIELDS}"):
        held.enqueue_args([{f"f{i}": "v" for i in range(MAX_TASK_FIELDS + 1)}])
    with pytest.raises(ValueError, match="at most 67108864 bytes"):
        held.enqueue_args([{"f": b"x" * (64 * 1024 * 1024)}])
    with pytest.raises(TypeError, match="cannot be a bool"):
        held.enqueue_args([{"f": True}])
    with pytest.raises(TypeError, match="task 0: a field name is str or bytes, got int 7"):
        held.enqueue_args([{7: "v"}])
    with pytest.raises(ValueError, match="a request ID has at most 128 bytes, got 129"):
        held.enqueue_args([{"f": "v"}], request_id=b"r" * 129)
    assert held.enqueue_args([{"f": 1, b"g": 2.5}], ["k"]) == [b"1", b"", b"k", b"2", b"f", b"1", b"g", b"2.5"]


def test_the_python_limits_are_the_scripts() -> None:
    text = source("enqueue")
    assert "local XMC_MAX_TASKS = 1000\n" in text and "local XMC_RECORD_KEYS = 10000\n" in text
    assert (held.MAX_ENQUEUE_TASKS, held.IDEMPOTENCY_RECORD_KEYS, held.IDEMPOTENCY_TTL_MS) == (1000, 10_000, 86_400_000)
    assert (held.MAX_IDEMPOTENCY_KEY_BYTES, held.MAX_ENQUEUE_BYTES) == (256, 64 * 1024 * 1024)


# --- a lost reply ----------------------------------------------------------------------------------


@pytest.fixture
def proxy(redis_url: str) -> Iterator[LosingProxy]:
    with losing_proxy(port_of(redis_url)) as made:
        yield made


async def test_a_retry_after_a_lost_reply_adds_the_task_once(redis: Redis, redis_url: str, proxy: LosingProxy) -> None:
    """The proxy forwards the enqueue to Redis, which runs it, and drops the reply with the
    connection. The client retries the keyed enqueue: the reply is the first entry ID, not a
    duplicate (the retry's request ID is the lost send's: this call added it), and the held stream
    holds the task once. Without a key, the client does not retry: the caller sees the error and
    the task is in Redis (a blind retry would have added it twice)."""
    keys = ExperimentKeys(STREAM, "L1")
    url = redis_url.replace(str(port_of(redis_url)), str(proxy.port))
    async with XmcClient.from_settings(Settings(redis_url=url)) as client:
        await client.pause("L1")
        await client.enqueue("L0", {"task": "warm"})  # loads the script: the lost call is its EVALSHA
        proxy.lose(b"EVALSHA")
        done = await client.enqueue("L1", {"task": "once"}, idempotency_key="req-1")
        assert proxy.lost == 1
        [(first_id, fields)] = await redis.xrange(keys.held)
        assert done == Enqueued("held", first_id.decode(), False) and fields == {b"task": b"once"}
        # another call with the same key did not add it: a duplicate
        assert await client.enqueue("L1", {"task": "once"}, idempotency_key="req-1") == done._replace(duplicate=True)

        proxy.lose(b"EVALSHA")
        with pytest.raises(RedisConnectionError):
            await client.enqueue("L1", {"task": "unkeyed"})
        assert proxy.lost == 2
        assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == [b"once", b"unkeyed"]

        # a batch with a key on every task is retried whole; every task lands once, added by this call
        proxy.lose(b"EVALSHA")
        batch = await client.enqueue_many(
            "L1", [{"task": "b1"}, {"task": "b2"}, {"task": "b1"}], idempotency_keys=["b-1", "b-2", "b-1"]
        )
        assert proxy.lost == 3 and [b.duplicate for b in batch] == [False, False, True]
        assert batch[2].entry_id == batch[0].entry_id
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == [b"once", b"unkeyed", b"b1", b"b2"]


async def test_a_batch_mixing_keyed_and_unkeyed_tasks_is_not_sent_again(
    redis: Redis, redis_url: str, proxy: LosingProxy
) -> None:
    """A lost reply to a batch with one unkeyed task: the client raises instead of sending the
    batch again (a resend would add the unkeyed task twice); each task is in Redis once."""
    keys = ExperimentKeys(STREAM, "L4")
    url = redis_url.replace(str(port_of(redis_url)), str(proxy.port))
    async with XmcClient.from_settings(Settings(redis_url=url)) as client:
        await client.pause("L4")
        await client.enqueue("L0", {"task": "warm"})
        for order in (["k-1", None], [None, "k-2"]):
            proxy.lose(b"EVALSHA")
            with pytest.raises(RedisConnectionError):
                await client.enqueue_many("L4", [{"task": "a"}, {"task": "b"}], idempotency_keys=order)
    assert proxy.lost == 2
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == [b"a", b"b", b"a", b"b"]


async def test_any_number_of_tasks_go_in_atomic_chunks(client: XmcClient, redis: Redis) -> None:
    keys = ExperimentKeys(STREAM, "L6")
    await client.pause("L6")
    await redis.config_resetstat()
    done = await client.enqueue_many("L6", [{"task": f"t{i}"} for i in range(2_345)])
    assert await calls_of(redis, "evalsha") == 3  # 1,000 + 1,000 + 345
    assert [eid.decode() for eid, _ in await redis.xrange(keys.held)] == [d.entry_id for d in done]
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == [f"t{i}".encode() for i in range(2_345)]
    calls = held.enqueue_calls([{"f": "v"}] * 2_001, ["k"] * 2_000 + [None], request_id="job")
    assert [(c.tasks, c.safe, c.args[1]) for c in calls] == [
        (1000, True, b"job/0"),
        (1000, True, b"job/1"),
        (1, False, b"job/2"),
    ]
    # bytes bound a chunk too: three tasks of 40 MiB go in three calls (64 MiB a call)
    big = held.enqueue_calls([{"f": b"x" * (40 << 20)}] * 3)
    assert [c.tasks for c in big] == [1, 1, 1]
    assert all(sum(map(len, c.args)) <= held.MAX_ENQUEUE_BYTES for c in big)
    with pytest.raises(ValueError, match="task 0: holds"):
        held.enqueue_calls([{"f": b"x" * held.MAX_ENQUEUE_BYTES}])
    with pytest.raises(ValueError, match="task 2: a task needs at least one field"):  # all checked first
        await client.enqueue_many("L6", [{"f": "v"}] * 2 + [{}])
    with pytest.raises(ValueError, match=r"a request ID has 1\.\.64 bytes, got 65"):
        await client.enqueue("L6", {"f": "v"}, request_id="r" * 65)
    assert await redis.xlen(keys.held) == 2_345


async def test_a_failure_between_chunks_says_what_was_done_and_a_retry_tells_the_truth(
    redis: Redis, redis_url: str, proxy: LosingProxy
) -> None:
    """The second of three chunks loses its reply, and its three retries too: the first chunk's
    answers come with the error; the second ran (in Redis), the third was not sent. The same call
    again, with the same request ID, adds each task once and answers every task as added by it."""
    keys = ExperimentKeys(STREAM, "L5")
    tasks: list[dict[str, str]] = [{"task": f"t{i}"} for i in range(2_500)]
    tasks[1_500]["mark"] = "chunk-two"  # the proxy loses the replies of the call carrying it
    ids = [f"k{i}" for i in range(2_500)]
    url = redis_url.replace(str(port_of(redis_url)), str(proxy.port))
    async with XmcClient.from_settings(Settings(redis_url=url)) as client:
        await client.pause("L5")
        await client.enqueue("L0", {"task": "warm"})
        proxy.lose(b"CHUNK-TWO", times=4)  # the first send and the client's 3 retries
        with pytest.raises(EnqueueInterruptedError) as interrupted:
            await client.enqueue_many("L5", tasks, idempotency_keys=ids, request_id="job-7")
        assert proxy.lost == 4 and isinstance(interrupted.value.__cause__, RedisConnectionError)
        first = interrupted.value.enqueued
        assert (len(first), interrupted.value.total) == (1_000, 2_500) and not any(d.duplicate for d in first)
        assert await redis.xlen(keys.held) == 2_000
        again = await client.enqueue_many("L5", tasks, idempotency_keys=ids, request_id="job-7")
        assert not any(d.duplicate for d in again) and again[:1_000] == first
        assert [eid.decode() for eid, _ in await redis.xrange(keys.held)] == [d.entry_id for d in again]
        # another request with the same keys added nothing: duplicates
        other = await client.enqueue_many("L5", tasks[:3], idempotency_keys=ids[:3])
        assert [d.duplicate for d in other] == [True] * 3


async def test_redis_pys_own_retry_duplicates_a_task_without_a_key(
    redis: Redis, redis_url: str, proxy: LosingProxy
) -> None:
    """Why ``from_settings`` turns redis-py's retries off: a client made by ``Redis(host, port)``
    (redis-py's default: 10 retries; ``from_url``'s: none) sends the enqueue again on a new
    connection after the lost reply, and the task is added twice. With a key it is added once, and
    the resend (the same arguments: the same request ID) answers that this call added it."""
    keys = ExperimentKeys(STREAM, "L2")
    plain = Redis(host="127.0.0.1", port=proxy.port)
    try:
        client = XmcClient(plain, retries=0)
        await client.enqueue("L0", {"task": "warm"})
        proxy.lose(b"EVALSHA")
        await client.enqueue("L2", {"task": "twice"})
        proxy.lose(b"EVALSHA")
        keyed = await client.enqueue("L2", {"task": "once"}, idempotency_key="k")
    finally:
        await plain.aclose()
    assert proxy.lost == 2 and not keyed.duplicate
    assert [f[b"task"] for _, f in await redis.xrange(keys.stream)] == [b"warm", b"twice", b"twice", b"once"]


def test_the_sync_client_retries_a_keyed_enqueue_after_a_lost_reply(
    redis_url: str, proxy: LosingProxy, sync_client: XmcSyncClient
) -> None:
    url = redis_url.replace(str(port_of(redis_url)), str(proxy.port))
    keys = ExperimentKeys(STREAM, "L3")
    with XmcSyncClient.from_settings(Settings(redis_url=url)) as client:
        client.pause("L3")
        client.enqueue("L0", {"task": "warm"})
        proxy.lose(b"EVALSHA")
        done = client.enqueue("L3", {"task": "once"}, idempotency_key="req-1")
        assert proxy.lost == 1 and not done.duplicate  # this call added it
        proxy.lose(b"EVALSHA")
        with pytest.raises(RedisConnectionError):
            client.enqueue("L3", {"task": "unkeyed"})
        proxy.lose(b"EVALSHA")
        with pytest.raises(RedisConnectionError):
            client.enqueue_many("L3", [{"task": "keyed"}, {"task": "mixed"}], idempotency_keys=["req-2", None])
        assert proxy.lost == 3
    direct = sync_redis.Redis.from_url(redis_url)
    try:
        entries = direct.xrange(keys.held)
    finally:
        direct.close()
    assert [f[b"task"] for _, f in entries] == [b"once", b"unkeyed", b"keyed", b"mixed"]  # type: ignore[union-attr]
    assert done.entry_id == entries[0][0].decode()  # type: ignore[index]


# --- the blocking client ---------------------------------------------------------------------------


async def test_the_sync_client_pauses_enqueues_and_reads_status(redis: Redis, sync_client: XmcSyncClient) -> None:
    keys = ExperimentKeys(STREAM, "S1")
    assert sync_client.enqueue("S1", {"task": "r"}).destination == "stream"
    sync_client.pause("S1")
    done = sync_client.enqueue_many("S1", [{"task": f"t{i}"} for i in range(3)], idempotency_keys=["a", "b", "c"])
    assert [d.destination for d in done] == ["held"] * 3
    assert sync_client.enqueue("S1", {"task": "t0"}, idempotency_key="a") == Enqueued("held", done[0].entry_id, True)
    assert [f[b"task"] for _, f in await redis.xrange(keys.held)] == [b"t0", b"t1", b"t2"]
    # an operator call runs on the client's own event loop: Redis's side only here
    status = sync_client.status("S1", run=False)
    assert (status.state, status.held, status.exists, status.run) == ("paused", 3, True, None)
    rows, truncated = sync_client.held()
    assert [(r.experiment_id, r.condition, r.held) for r in rows] == [("S1", "paused", 3)] and not truncated


def test_a_sync_client_without_operator_access_says_so(redis_url: str) -> None:
    plain = sync_redis.Redis.from_url(redis_url)
    try:
        client = XmcSyncClient(plain)
        client.pause("S2")
        with pytest.raises(RuntimeError, match="made without operator access: use from_settings"):
            client.status("S2")
        client.close()  # leaves a client it did not make open
        assert plain.ping()
    finally:
        plain.close()


async def test_the_async_client_reads_status_and_held(client: XmcClient, redis: Redis) -> None:
    await client.pause("A1")
    await client.enqueue_many("A1", [{"task": "x"}, {"task": "y"}])
    status = await client.status("A1", run=False)
    assert (status.state, status.held, status.claim, status.fence, status.backlog.threshold) == (
        "paused", 2, {}, 0, 500,
    )  # fmt: skip
    assert status.redis_memory.policy == "noeviction"
    rows, _ = await client.held(limit=10)
    assert [(r.experiment_id, r.condition) for r in rows] == [("A1", "paused")]
    with pytest.raises(ValueError, match="experiment_id 'a b'"):
        await client.pause("a b")


def docs_example(heading: str, language: str) -> str:
    """The first ``language`` code block after ``heading`` in docs/producers.md."""
    doc = (ROOT / "docs" / "producers.md").read_text()
    after = doc[doc.index(f"\n{heading}\n") :]
    return after[
        after.index(f"```{language}\n") + len(language) + 4 : after.index("\n```", after.index(f"```{language}\n"))
    ]


async def test_the_docs_python_producer_runs(redis: Redis, redis_url: str) -> None:
    code = docs_example("## A producer in Python", "python")
    proc = run_module_code(code, XMC_REDIS_URL=redis_url)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["held False", "True True", "2500 2500"]
    keys = ExperimentKeys(STREAM, "exp-42")
    assert await redis.get(keys.state) == b"paused" and await redis.xlen(keys.held) == 2501
    assert await redis.hlen(keys.idempotency) == 2501


# --- the two clients offer the same calls ----------------------------------------------------------

ASYNC_ONLY = {
    "aclose": "XmcSyncClient.close",
    "temporal": "the Temporal client itself, which is asyncio only",
}
"""``XmcClient``'s public methods the blocking client has not, each with why."""

ASYNC_ONLY_PARAMETERS = {
    ("from_settings", "temporal"): "a Temporal client belongs to the event loop it was made on",
}


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(getattr(cls, name))
        for name in dir(cls)
        if not name.startswith("_") and callable(getattr(cls, name))
    }


def test_the_sync_client_offers_what_the_async_client_offers() -> None:
    """Every public method of ``XmcClient`` is on ``XmcSyncClient`` with the same parameters (names,
    kinds, defaults), but for those listed with their reason."""
    aio, sync = public_methods(XmcClient), public_methods(XmcSyncClient)
    gaps = []
    for name, signature in aio.items():
        if name in ASYNC_ONLY:
            continue
        if name not in sync:
            gaps.append(f"{name}: missing")
            continue
        theirs = sync[name].parameters
        for param in signature.parameters.values():
            other = theirs.get(param.name)
            if (name, param.name) in ASYNC_ONLY_PARAMETERS:
                continue
            if other is None or (other.kind, other.default) != (param.kind, param.default):
                gaps.append(f"{name}({param.name}): {other} in the blocking client, {param} in the asyncio one")
    assert gaps == []
    assert {"plan", "resume_many", "check_resumable", "enqueue_many", "status"} <= set(sync)


# --- tasks as applications build them --------------------------------------------------------------

APPLICATION = """
from xmc_resumption.client import Enqueued, Task, XmcClient, XmcSyncClient


def order_task(order_id: str) -> dict[str, str]:
    return {"order": order_id, "action": "recompute"}


def produce(xmc: XmcSyncClient, orders: list[str]) -> int:
    tasks = [order_task(o) for o in orders]
    one = xmc.enqueue("E1", order_task("o1"), idempotency_key="o1")
    many = xmc.enqueue_many("E1", tasks, idempotency_keys=orders, request_id="batch-7")
    counted: list[dict[str, str | int]] = [{"order": "o2", "n": 2}]
    raw: dict[bytes, bytes] = {b"order": b"o3"}
    xmc.enqueue_many("E1", [*counted, raw])
    literal: list[Task] = [{"task": f"t{i}", "n": i} for i in range(3)]
    xmc.enqueue_many("E1", literal)
    return sum(not d.duplicate for d in [one, *many])


async def produce_async(xmc: XmcClient, tasks: tuple[dict[str, float], ...]) -> list[Enqueued]:
    return await xmc.enqueue_many("E1", tasks)
"""


@pytest.mark.slow
def test_tasks_as_applications_build_them_pass_mypy_strict(tmp_path: Path) -> None:
    """An application's ``dict[str, str]`` (and ``dict[bytes, bytes]``, a tuple of ``dict[str,
    float]``) built elsewhere is a ``Task`` for ``mypy --strict``."""
    (tmp_path / "app.py").write_text(APPLICATION)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--follow-imports=silent", "app.py"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("Success: no issues found in 1 source file")
