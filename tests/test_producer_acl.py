"""The producers' Redis ACL rule, ``deploy/redis-acl-producer.conf``: a real redis-server loads it;
the producer's calls (pause, enqueue one and many, idempotency keys, the record's rotation, the
script loaded again after a flush) pass, through both clients; everything else is refused, the
worker's scripts and the commands a producer never needs included."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, ResponseError

from tests.support.secure import PRODUCER_ACL_FILE, PRODUCER_USER, ROOT, SECRET, producer_acl_redis
from xmc_resumption.client import XmcClient, XmcSyncClient
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.keys import ExperimentKeys, as_text
from xmc_resumption.settings import Settings

STREAM = "xmc-tasks-stream"
KEYS = ExperimentKeys(STREAM, "P1")


@pytest.fixture(scope="module")
def acl_urls() -> Iterator[tuple[str, str]]:
    """(admin URL, producer URL) of a redis-server that loaded the producers' ACL file."""
    with producer_acl_redis() as urls:
        yield urls


@pytest_asyncio.fixture
async def admin(acl_urls: tuple[str, str]) -> AsyncIterator[Redis]:
    client = Redis.from_url(acl_urls[0])
    await client.flushall()
    await client.script_flush()
    await client.execute_command("ACL", "LOG", "RESET")
    yield client
    await client.aclose()


async def refusals(admin: Redis) -> list[str]:
    """What the ACL log recorded as refused to the producer (``CLIENT SETINFO``, which redis-py
    sends on connect and whose refusal it ignores, left out)."""
    return [
        as_text(e["object"])
        for e in await admin.acl_log()
        if as_text(e["username"]) == PRODUCER_USER and as_text(e["object"]) != "client|setinfo"
    ]


def file_rule() -> list[str]:
    [line] = [ln for ln in PRODUCER_ACL_FILE.read_text().splitlines() if ln.startswith(f"user {PRODUCER_USER} ")]
    return [t for t in line.split()[2:] if t not in ("on", "off")]


def test_the_docs_line_is_the_files_rule() -> None:
    """The ``ACL SETUSER`` line docs/producers.md gives grants exactly the file's rule, which holds
    no secret and starts off."""
    doc = (ROOT / "docs" / "producers.md").read_text()
    [line] = [ln for ln in doc.splitlines() if ln.startswith(f"ACL SETUSER {PRODUCER_USER} ")]
    assert [t for t in line.split()[3:] if t not in ("on", "off") and not t.startswith(">")] == file_rule()
    text = PRODUCER_ACL_FILE.read_text()
    assert " off " in text and ">" not in text and "nopass" not in text and "#" not in text
    for forbidden in ("+@all", "allkeys", "~*", "+eval ", "+del", "+get ", "+xrange", "+xreadgroup"):
        assert forbidden not in " ".join(file_rule()) + " ", forbidden


async def test_the_producers_calls_pass(admin: Redis, acl_urls: tuple[str, str]) -> None:
    url = acl_urls[1]
    async with XmcClient.from_settings(Settings(redis_url=url)) as client:
        assert (await client.enqueue("P1", {"task": "r"})).destination == "stream"  # NOSCRIPT, SCRIPT LOAD
        await client.pause("P1")
        first = await client.enqueue("P1", {"task": "h0"}, idempotency_key="k0")
        assert (await client.enqueue("P1", {"task": "h0"}, idempotency_key="k0")).entry_id == first.entry_id
        n, per_call = held.IDEMPOTENCY_RECORD_KEYS, held.MAX_ENQUEUE_TASKS
        for start in range(1, n + 2, per_call):  # past one generation: the record is renamed
            count = min(per_call, n + 2 - start)
            await client.enqueue_many(
                "P1",
                [{"task": f"h{i}"} for i in range(start, start + count)],
                idempotency_keys=[f"k{i}" for i in range(start, start + count)],
            )
    assert await admin.hlen(KEYS.idempotency_previous) == n
    await admin.script_flush()  # as after a restart: the blocking client loads the script again
    with XmcSyncClient.from_settings(Settings(redis_url=url)) as sync:
        sync.pause("P1")
        done = sync.enqueue_many("P1", [{"task": "s0"}, {"task": "h0"}], idempotency_keys=["s0", "k0"])
        assert [(d.destination, d.duplicate) for d in done] == [("held", False), ("held", True)]
    assert await admin.xlen(KEYS.held) == n + 3 and await admin.xlen(STREAM) == 1
    assert await refusals(admin) == []
    # XMC_REPLICA_ACKS: WAIT after each enqueue (no replica here to wait for)
    assert await admin.execute_command("ACL", "DRYRUN", PRODUCER_USER, "WAIT", "1", "1000") == b"OK"


@pytest.mark.parametrize(
    "command",
    [
        ["SET", KEYS.held, "x"],  # SET only on a state key
        ["SET", KEYS.fence, "9"],
        ["XADD", KEYS.state, "*", "f", "v"],  # XADD only to the stream and held streams
        ["XADD", KEYS.dead, "*", "f", "v"],
        ["XADD", "another-stream", "*", "f", "v"],
        ["XADD", "{another-stream}:experiment:E:held", "*", "f", "v"],
        ["HSET", KEYS.claim, "token", "1"],  # hashes: the idempotency record's only
        ["HSET", KEYS.publish, "seq", "1"],
        ["RENAME", KEYS.held, KEYS.idempotency],
        ["GET", KEYS.state],
        ["DEL", KEYS.state],
        ["XRANGE", KEYS.held, "-", "+"],
        ["XDEL", KEYS.held, "1-1"],
        ["XLEN", STREAM],
        ["XREADGROUP", "GROUP", "g", "c", "STREAMS", STREAM, ">"],
        ["XGROUP", "CREATE", STREAM, "g", "$", "MKSTREAM"],
        ["INCR", KEYS.fence],
        ["EVAL", "return 1", "0"],
        ["FLUSHALL"],
        ["KEYS", "*"],
        ["SCAN", "0"],
        ["CONFIG", "GET", "maxmemory-policy"],
        ["INFO", "memory"],
        ["ACL", "LIST"],
    ],
)
async def test_everything_else_is_refused(admin: Redis, acl_urls: tuple[str, str], command: list[str]) -> None:
    producer = Redis.from_url(acl_urls[1])
    try:
        with pytest.raises(NoPermissionError, match="no permissions"):
            await producer.execute_command(*command)
    finally:
        await producer.aclose()
    assert await refusals(admin) != []


async def test_the_workers_scripts_are_refused_to_a_producer(admin: Redis, acl_urls: tuple[str, str]) -> None:
    producer = Redis.from_url(acl_urls[1])
    try:
        await held.pause(producer, KEYS)
        await held.enqueue_task(producer, KEYS, {"task": "t"})
        with pytest.raises((NoPermissionError, ResponseError), match=r"(no permissions|can.t access)"):
            await fencing.acquire_claim(producer, KEYS, "me", 60_000)
    finally:
        await producer.aclose()
    assert await admin.get(KEYS.state) == b"paused" and await admin.exists(KEYS.fence, KEYS.claim) == 0
    assert SECRET not in str(await admin.acl_log())
