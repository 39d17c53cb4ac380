"""The atomic publish script against a real redis-server: fencing, pause, bound, idempotency,
exactly-once and order under concurrent consumers and racing replayers."""

from __future__ import annotations

import asyncio
import json
import random
import re

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.backlog import COUNT_BYTES, measure_backlog
from xmc_resumption.redisclient.errors import MissingConsumerGroupError
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams, publish_batch
from xmc_resumption.redisclient.readings import MissingGroupPolicy
from xmc_resumption.redisclient.results import ExperimentState, PublishResult, PublishStatus
from xmc_resumption.redisclient.scripts import source

KEYS = ExperimentKeys("xmc-tasks-stream", "E1")
GROUP = "xmc-workers"


async def hold(redis: Redis, n: int, start: int = 0) -> None:
    await held.pause(redis, KEYS)
    for i in range(start, start + n):
        await held.enqueue_task(redis, KEYS, {"task": f"t{i}"})


async def publish(redis: Redis, token: int, seq: int, batch: int = 10, threshold: int = 100, **kw):  # type: ignore[no-untyped-def]
    """``publish_batch`` on ``KEYS`` as owner ``me``; tests that make no group take ``zero`` (the
    stream's entries count as the missing group's backlog)."""
    kw.setdefault("missing_group", MissingGroupPolicy.ZERO)
    return await publish_batch(
        redis,
        KEYS,
        GROUP,
        PublishParams(token=token, seq=seq, batch_size=batch, threshold=threshold, owner="me", lease_ms=60_000, **kw),
    )


async def stream_tasks(redis: Redis) -> list[bytes]:
    return [fields[b"task"] for _, fields in await redis.xrange(KEYS.stream)]


async def test_moves_oldest_first_and_completes(redis: Redis) -> None:
    await hold(redis, 25)
    await redis.xgroup_create(KEYS.stream, GROUP, id="$", mkstream=True)
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    first = await publish(redis, grant.token, 1)
    assert (first.status, first.moved, first.remaining, first.reading.backlog) == (PublishStatus.PUBLISHED, 10, 15, 0)
    second = await publish(redis, grant.token, 2)
    assert (second.moved, second.reading.backlog) == (10, 10)
    third = await publish(redis, grant.token, 3)
    assert (third.status, third.moved, third.remaining) == (PublishStatus.COMPLETED, 5, 0)
    assert await stream_tasks(redis) == [f"t{i}".encode() for i in range(25)]
    assert await held.get_state(redis, KEYS) is ExperimentState.RUNNING
    assert not await redis.exists(KEYS.held)
    assert (await held.enqueue_task(redis, KEYS, {"task": "after"}))[0] == "stream"


async def test_never_takes_the_backlog_past_the_threshold(redis: Redis) -> None:
    await hold(redis, 50)
    await redis.xgroup_create(KEYS.stream, GROUP, id="$", mkstream=True)
    for i in range(3):  # a backlog of 3 that is not the replayer's
        await redis.xadd(KEYS.stream, {"task": f"other{i}"})
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    result = await publish(redis, grant.token, 1, batch=100, threshold=8)
    assert (result.status, result.moved, result.reading.backlog) == (PublishStatus.PUBLISHED, 5, 3)
    result = await publish(redis, grant.token, 2, batch=100, threshold=8)
    assert (result.status, result.moved, result.reading.backlog, result.remaining) == (
        PublishStatus.THROTTLED,
        0,
        8,
        45,
    )
    assert (await measure_backlog(redis, KEYS.stream, GROUP, 8)).backlog == 8


async def test_stale_token_publishes_nothing(redis: Redis) -> None:
    await hold(redis, 5)
    old = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    new = await fencing.acquire_claim(redis, KEYS, "b", 60_000)
    result = await publish(redis, old.token, 1)
    assert (result.status, result.moved, result.remaining) == (PublishStatus.FENCED, 0, 5)
    assert await redis.xlen(KEYS.stream) == 0
    assert (await publish(redis, new.token, 1)).moved == 5


async def test_paused_experiment_publishes_nothing(redis: Redis) -> None:
    await hold(redis, 5)
    grant = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    await held.pause(redis, KEYS)
    result = await publish(redis, grant.token, 1)
    assert (result.status, result.moved, result.remaining) == (PublishStatus.PAUSED, 0, 5)
    assert await redis.xlen(KEYS.stream) == 0


async def test_repeated_seq_returns_the_recorded_result_and_older_seq_moves_nothing(redis: Redis) -> None:
    await hold(redis, 30)
    grant = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    first = await publish(redis, grant.token, 1)
    again = await publish(redis, grant.token, 1)  # a retried activity whose reply was lost
    assert again.repeated and not first.repeated  # the recorded result, marked: it moved nothing now
    assert again.model_copy(update={"repeated": False}) == first and await redis.xlen(KEYS.stream) == 10
    assert (await publish(redis, grant.token, 2)).moved == 10
    zombie = await publish(redis, grant.token, 1)  # an attempt that outlived its timeout
    assert (zombie.status, zombie.moved, zombie.last_seq) == (PublishStatus.STALE, 0, 2)
    assert await stream_tasks(redis) == [f"t{i}".encode() for i in range(20)]


async def test_a_retry_after_the_lease_lapsed_still_returns_the_recorded_result(redis: Redis) -> None:
    await hold(redis, 30)
    grant = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    first = await publish_batch(
        redis,
        KEYS,
        GROUP,
        PublishParams(
            token=grant.token,
            seq=1,
            batch_size=10,
            threshold=100,
            owner="a",
            lease_ms=50,
            missing_group=MissingGroupPolicy.ZERO,
        ),
    )
    await asyncio.sleep(0.1)
    assert not await redis.exists(KEYS.claim)  # the lease lapsed (a worker down longer than the lease)
    again = await publish(redis, grant.token, 1)
    assert again.model_copy(update={"repeated": False}) == first and await redis.xlen(KEYS.stream) == 10
    assert (await publish(redis, grant.token, 1)).moved == 10  # the recorded result, not a new move
    assert await redis.xlen(KEYS.stream) == 10
    assert (await publish(redis, grant.token, 2)).moved == 10  # the next turn goes on
    assert (await fencing.claim_info(redis, KEYS))["token"] == str(grant.token)  # the lease taken again


async def test_a_publish_sets_the_claims_lease(redis: Redis) -> None:
    """A publish that reaches the move sets the claim's lease to the one asked for (a chained
    publish has no check before it to extend the lease): published, throttled, and a lease that had
    lapsed, taken again with an expiry, never without one."""
    await hold(redis, 30)
    await redis.xgroup_create(KEYS.stream, GROUP, id="$", mkstream=True)
    grant = await fencing.acquire_claim(redis, KEYS, "me", 600_000)

    async def publish_with_lease(seq: int, lease_ms: int) -> PublishStatus:
        result = await publish_batch(
            redis,
            KEYS,
            GROUP,
            PublishParams(token=grant.token, seq=seq, batch_size=10, threshold=15, owner="me", lease_ms=lease_ms),
        )
        return result.status

    assert await publish_with_lease(1, 45_000) is PublishStatus.PUBLISHED
    assert 44_000 < await redis.pttl(KEYS.claim) <= 45_000
    assert await publish_with_lease(2, 90_000) is PublishStatus.PUBLISHED
    assert 89_000 < await redis.pttl(KEYS.claim) <= 90_000
    assert await publish_with_lease(3, 20_000) is PublishStatus.THROTTLED
    assert 19_000 < await redis.pttl(KEYS.claim) <= 20_000
    await redis.delete(KEYS.claim)  # the lease lapsed
    assert await publish_with_lease(4, 30_000) is PublishStatus.THROTTLED
    assert 29_000 < await redis.pttl(KEYS.claim) <= 30_000
    assert (await fencing.claim_info(redis, KEYS))["token"] == str(grant.token)


async def test_a_released_token_publishes_nothing(redis: Redis) -> None:
    """A released token moves nothing: its own release is told (``released``, with the recorded
    outcome), a newer claim's takeover is ``fenced``."""
    await hold(redis, 5)
    taken_over = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    grant = await fencing.acquire_claim(redis, KEYS, "b", 60_000)
    await fencing.release_claim(redis, KEYS, grant.token, back_to_paused=True, outcome="paused")
    await redis.set(KEYS.state, "resuming")  # even if something moved the state on
    result = await publish(redis, grant.token, 1)
    assert (result.status, result.moved, result.outcome, result.remaining) == (PublishStatus.RELEASED, 0, "paused", 5)
    older = await publish(redis, taken_over.token, 1)
    assert (older.status, older.moved, older.outcome) == (PublishStatus.FENCED, 0, "")
    assert await redis.xlen(KEYS.stream) == 0


async def test_field_maps_move_byte_for_byte(redis: Redis) -> None:
    await held.pause(redis, KEYS)
    tasks = [{b"task": f"t{i}".encode(), b"blob": bytes([i, 0, 255]) * 50, b"": b"empty field"} for i in range(5)]
    for task in tasks:
        await held.enqueue_task(redis, KEYS, task)
    grant = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    await publish(redis, grant.token, 1)
    assert [fields for _, fields in await redis.xrange(KEYS.stream)] == tasks


async def test_missing_stream_refuses_under_the_error_policy(redis: Redis) -> None:
    await hold(redis, 5)
    grant = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    with pytest.raises(MissingConsumerGroupError):
        await publish(redis, grant.token, 1, missing_group=MissingGroupPolicy.ERROR)
    assert not await redis.exists(KEYS.stream)
    assert await redis.xlen(KEYS.held) == 5


async def test_missing_group_policies(redis: Redis) -> None:
    await hold(redis, 5)
    await redis.xadd(KEYS.stream, {"task": "before"})  # a stream, but no group on it
    grant = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    with pytest.raises(MissingConsumerGroupError):
        await publish(redis, grant.token, 1, missing_group=MissingGroupPolicy.ERROR)
    assert await redis.xlen(KEYS.stream) == 1
    assert (await publish(redis, grant.token, 2)).moved == 5


async def test_wrong_type_task_stream_raises_and_moves_nothing(redis: Redis) -> None:
    await hold(redis, 5)
    await redis.set(KEYS.stream, "oops")
    grant = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    with pytest.raises(ResponseError, match=r"^WRONGTYPE"):
        await publish(redis, grant.token, 1)
    assert await redis.xlen(KEYS.held) == 5


async def test_a_publish_moves_about_its_byte_budget_of_large_tasks(redis: Redis) -> None:
    """Tasks of 100 KiB and a byte budget of 250 KiB: each call moves 3 tasks (the one that reaches
    the budget included), however large the batch; the rest follow, in order, exactly once."""
    await held.pause(redis, KEYS)
    for i in range(8):
        await held.enqueue_task(redis, KEYS, {"task": f"t{i}", "body": b"x" * 100 * 1024})
    await redis.xgroup_create(KEYS.stream, GROUP, id="$", mkstream=True)
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    moves = []
    for seq in range(1, 10):
        result = await publish(redis, grant.token, seq, batch=100, threshold=1000, max_bytes=250 * 1024)
        moves.append((result.status, result.moved))
        await redis.xgroup_setid(KEYS.stream, GROUP, "$")  # consumed: the next count reads no large task
        assert result.moved_bytes >= 100 * 1024 * result.moved
        if result.status is PublishStatus.COMPLETED:
            break
    assert moves == [(PublishStatus.PUBLISHED, 3), (PublishStatus.PUBLISHED, 3), (PublishStatus.COMPLETED, 2)]
    assert await stream_tasks(redis) == [f"t{i}".encode() for i in range(8)]


async def test_a_count_cut_by_the_byte_budget_takes_an_upper_bound(redis: Redis) -> None:
    """Undelivered entries of 64 KiB after a last-delivered-id Redis keeps no count for (entries-read NULL after
    XGROUP SETID): a count of 500 would read 32 MiB; with a budget of 256 KiB the count stops after about
    256 KiB and the stream's length bounds the lag (never below it): past the threshold there is no headroom
    and the publish moves nothing (its own reading is the same rule). A lag Redis knows costs no read at all."""
    await redis.xgroup_create(KEYS.stream, GROUP, id="$", mkstream=True)
    for i in range(21):
        await redis.xadd(KEYS.stream, {"task": f"other-{i}", "body": b"y" * 64 * 1024})
    known = await measure_backlog(redis, KEYS.stream, GROUP, 500, max_bytes=256 * 1024)
    assert (known.lag, known.lag_source, known.lag_bytes, known.headroom) == (21, "behind", 0, 479)
    await redis.xgroup_setid(KEYS.stream, GROUP, (await redis.xrange(KEYS.stream, count=1))[0][0])
    reading = await measure_backlog(redis, KEYS.stream, GROUP, 500, max_bytes=256 * 1024)
    assert (reading.lag, reading.lag_source, reading.exact, reading.headroom) == (21, "bound", False, 479)
    assert 256 * 1024 <= reading.lag_bytes < 5 * 64 * 1024 + 100  # one entry past the budget
    # whatever the byte budget, a script counts at most COUNT_BYTES (256 KiB) of entries
    larger = await measure_backlog(redis, KEYS.stream, GROUP, 500, max_bytes=4 * 1024 * 1024)
    assert (larger.lag, larger.lag_source, larger.headroom) == (21, "bound", 479)
    assert COUNT_BYTES <= larger.lag_bytes < COUNT_BYTES + 64 * 1024 + 100
    past = await measure_backlog(redis, KEYS.stream, GROUP, 3, max_bytes=100 * 1024)
    assert (past.lag, past.lag_source, past.headroom) == (21, "bound", 0)
    await hold(redis, 3)
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    result = await publish(redis, grant.token, 1, batch=10, threshold=3, max_bytes=100 * 1024)
    assert (result.status, result.moved, result.reading.lag, result.reading.headroom) == (
        PublishStatus.THROTTLED,
        0,
        21,
        0,
    )


@pytest.mark.parametrize("bad", [{"seq": 0}, {"batch": 0}, {"threshold": 0}, {"max_bytes": 0}])
async def test_bad_arguments_are_refused(redis: Redis, bad: dict) -> None:
    with pytest.raises(ValueError):
        await publish(redis, 1, **{"seq": 1, **bad})


async def test_exactly_once_in_order_under_consumers_and_racing_replayers(redis: Redis) -> None:
    """Two replayers race (the second takes the claim midway), consumers drain at random, producers
    keep enqueueing while the replay runs; every publish's own result shows the bound held (its
    backlog is measured in the same atomic step as its move)."""
    rng = random.Random(7)
    total_held, threshold = 600, 40
    await hold(redis, total_held)
    await redis.xgroup_create(KEYS.stream, GROUP, id="$", mkstream=True)
    a = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    done = asyncio.Event()
    consumed: list[bytes] = []
    results: list[PublishResult] = []

    async def consumer(name: str) -> None:
        while not done.is_set() or (await measure_backlog(redis, KEYS.stream, GROUP, 10_000)).backlog:
            reply = await redis.xreadgroup(GROUP, name, {KEYS.stream: ">"}, count=rng.randint(1, 7), block=5)
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    consumed.append(fields[b"task"])
                    await redis.xack(KEYS.stream, GROUP, entry_id)
            await asyncio.sleep(rng.random() / 500)

    async def producer() -> None:
        for i in range(total_held, total_held + 100):
            await held.enqueue_task(redis, KEYS, {"task": f"t{i}"})
            await asyncio.sleep(0.001)

    async def replayer(token: int, stop_after: int | None) -> PublishStatus:
        seq = 0
        while True:
            seq += 1
            result = await publish(redis, token, seq, batch=rng.randint(1, 25), threshold=threshold)
            results.append(result)
            if result.status in (PublishStatus.COMPLETED, PublishStatus.FENCED):
                return result.status
            if stop_after is not None and seq >= stop_after:
                return result.status
            await asyncio.sleep(0.001)

    tasks = [asyncio.create_task(consumer(f"c{i}")) for i in range(3)]
    prod = asyncio.create_task(producer())
    assert await replayer(a.token, stop_after=5) in (PublishStatus.PUBLISHED, PublishStatus.THROTTLED)
    b = await fencing.acquire_claim(redis, KEYS, "b", 60_000)
    assert await replayer(a.token, None) == PublishStatus.FENCED
    await prod
    assert await replayer(b.token, None) == PublishStatus.COMPLETED
    done.set()
    await asyncio.gather(*tasks)
    expected = [f"t{i}".encode() for i in range(total_held + 100)]
    assert await stream_tasks(redis) == expected
    assert sorted(consumed) == sorted(expected)
    assert sum(r.moved for r in results) == total_held + 100
    assert all(r.reading.backlog + r.moved <= threshold for r in results), [r for r in results if r.moved]
    assert max(r.reading.backlog + r.moved for r in results) == threshold  # the bound was reached, never passed


async def test_binary_values_a_1_mib_value_and_1000_fields_move_byte_for_byte(redis: Redis) -> None:
    """Valid data of unusual shape is replayed exactly: every byte value 0-255 (NUL and invalid
    UTF-8 included), one value of 1 MiB, and a task of 1,000 fields."""
    tasks = [
        {b"task": b"binary", b"\x00\xff": bytes(range(256)), b"utf8?": b"\xc3\x28"},
        {b"task": b"big", b"body": b"\x01" * (1024 * 1024)},
        {b"task": b"wide", **{f"f{i}".encode(): f"v{i}".encode() for i in range(1_000)}},
    ]
    await held.pause(redis, KEYS)
    for task in tasks:
        await held.enqueue_task(redis, KEYS, task)
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    result = await publish(redis, grant.token, 1)
    assert (result.status, result.moved) == (PublishStatus.COMPLETED, 3)
    assert [fields for _, fields in await redis.xrange(KEYS.stream)] == tasks


def test_a_publish_result_reads_the_flat_reply_and_writes_it_back_flat() -> None:
    """``PublishResult`` carries its backlog reading whole, while the wire form stays the script's
    flat reply: the publish record in Redis and recorded markers hold it, old ones without
    ``headroom`` or ``threshold`` too, and a worker of the previous release must read a new marker."""
    old = {
        "status": "throttled",
        "moved": 0,
        "backlog": 9,
        "remaining": 4,
        "pending": 2,
        "lag": 7,
        "group_status": "ok",
    }
    result = PublishResult.model_validate(old)
    r = result.reading
    assert (r.pending, r.lag, r.backlog, r.headroom, r.threshold, r.capped, r.last_delivered_id) == (
        2,
        7,
        9,
        0,
        0,
        False,
        "",
    )
    flat = json.loads(PublishResult.model_validate_json(result.model_dump_json()).model_dump_json())
    assert flat == {
        **old,
        "moved_bytes": 0,
        "poison_id": "",
        "total_moved": None,
        "replayed": None,
        "outcome": "",
        "repeated": False,
        "capped": False,
        "bytes_capped": False,
        "headroom": 0,
        "last_delivered_id": "",
        "threshold": 0,
        "limiting_group": "",
        "missing_group": "",
        "last_seq": 0,
        "used_memory": 0,
        "maxmemory": 0,
        "rate_limit": 0.0,
        "rate_limited": False,
        "rate_wait_ms": 0,
        "redelivered": 0,
        "behind": 0,
        "last_moved_id": "",
        "redelivered_total": None,
    }


def test_the_publish_parameters_reach_the_scripts_argv_whole_and_in_its_order() -> None:
    """``PublishParams.argv`` is the one place the parameters become ``publish.lua``'s ARGV: every ARGV the script's
    header names, in its order, each from its field."""
    params = PublishParams(
        token=7, seq=8, batch_size=9, threshold=10, owner="o", lease_ms=11, missing_group=MissingGroupPolicy.ZERO,
        max_bytes=12, max_memory_fraction=0.5, fair_share=True, moved_through="1-1", replayed=13,
    )  # fmt: skip
    argv = params.argv(ExperimentKeys("s", "E9"), "g", ["g", "h"])
    assert argv == [7, 8, 9, 10, "g", "zero", 11, "o", 12, "0.5", "1", "E9", "g h", "1-1", 13]
    header = [line for line in source("publish").splitlines() if line.startswith("--")]
    named = sorted({int(n) for line in header for n in re.findall(r"ARGV\[(\d+)\]", line)})
    assert named == list(range(1, len(argv) + 1))
    # the rounds' bounds are the call's, not the script's
    assert params.model_copy(update={"max_scripts": 5, "max_seconds": 1.0}).argv(
        ExperimentKeys("s", "E9"), "g", None
    ) == [*argv[:12], "*", *argv[13:]]
