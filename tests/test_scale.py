"""Many replayers on one threshold (issue 8, items 3 and 4).

The fair share of the headroom in the publish script (``lua/fair.lua``) against a real redis-server:
weights, the active replayers' leases, the floor of 1, what it refuses before writing. Then the
bench's figure g at a small size: 10 experiments x 200 tasks resumed at once under two
``python -m worker`` processes, paced consumers, a backlog sampler in its own process: the
backlog never passed the threshold, every task was delivered exactly once, each experiment in
order, every run completed; without and with the fair share.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from temporalio.testing import WorkflowEnvironment

from bench.env import BenchEnv
from bench.scale import Group, ScaleCase, ScaleSize, scale_run, two_workers
from xmc_resumption.cli.params import field_type
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.fencing import MAX_LEASE_MS
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams, publish_batch
from xmc_resumption.redisclient.results import ExperimentState, PublishResult, PublishStatus
from xmc_resumption.redisclient.scripts import run_script, source
from xmc_resumption.redisclient.weights import (
    MAX_WEIGHT,
    active_replayers,
    clear_weight,
    replayers_key,
    set_weight,
    weights_key,
)
from xmc_resumption.workflows.models import ResumptionInput

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

STREAM = "scale-stream"
GROUP = "xmc-workers"


def keys(experiment: str) -> ExperimentKeys:
    return ExperimentKeys(STREAM, experiment)


async def claimed(redis: Redis, experiment: str, n: int) -> int:
    """Pause ``experiment``, hold ``n`` tasks, take the claim; returns the token."""
    k = keys(experiment)
    await held.pause(redis, k)
    for i in range(n):
        await held.enqueue_task(redis, k, {"task": f"{experiment}-{i}"})
    return (await fencing.acquire_claim(redis, k, "me", 60_000)).token


async def fair_publish(
    redis: Redis,
    experiment: str,
    token: int,
    seq: int,
    *,
    threshold: int = 100,
    lease_ms: int = 60_000,
    fair: bool = True,
) -> PublishResult:
    return await publish_batch(
        redis,
        keys(experiment),
        GROUP,
        PublishParams(
            token=token, seq=seq, batch_size=1_000, threshold=threshold, owner="me", lease_ms=lease_ms, fair_share=fair
        ),
    )


@pytest_asyncio.fixture
async def group(redis: Redis) -> AsyncIterator[Redis]:
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    yield redis


async def test_share_is_the_weighted_part_of_the_headroom(group: Redis) -> None:
    redis = group
    a, b, c = [await claimed(redis, e, 500) for e in ("A", "B", "C")]
    # alone: A takes the whole headroom (its batch is larger)
    first = await fair_publish(redis, "A", a, 1)
    assert (first.moved, first.reading.headroom) == (100, 100)
    await redis.xtrim(STREAM, maxlen=0)  # consumers took everything: headroom 100 again
    await redis.xgroup_setid(STREAM, GROUP, "$")
    # B joins: A and B weigh 1 each, so B's share of 100 is 50
    second = await fair_publish(redis, "B", b, 1)
    assert (second.moved, second.reading.headroom) == (50, 50)
    # C weighs 3 of 1 + 1 + 3: floor(50 * 3 / 5) = 30 of the 50 left
    await set_weight(redis, STREAM, "C", 3)
    third = await fair_publish(redis, "C", c, 1)
    assert (third.status, third.moved, third.reading.headroom, third.reading.backlog) == (
        PublishStatus.PUBLISHED,
        30,
        30,
        50,
    )
    assert set(await active_replayers(redis, STREAM)) == {"A", "B", "C"}
    # A: floor(20 * 1 / 5) = 4
    fourth = await fair_publish(redis, "A", a, 2)
    assert (fourth.moved, fourth.reading.backlog) == (4, 80)
    # the bound is the threshold's, shared: 84 entries in the stream, each experiment in order
    tasks = [fields[b"task"].decode() for _, fields in await redis.xrange(STREAM)]
    assert len(tasks) == 84
    for e, first, n in (("A", 100, 4), ("B", 0, 50), ("C", 0, 30)):  # A's first 100 were trimmed
        assert [t for t in tasks if t.startswith(e + "-")] == [f"{e}-{i}" for i in range(first, first + n)]
    await clear_weight(redis, STREAM, "C")
    assert await redis.hgetall(weights_key(STREAM)) == {}


async def test_at_least_one_moves_and_a_lapsed_lease_stops_counting(group: Redis) -> None:
    redis = group
    tokens = {e: await claimed(redis, e, 10) for e in ("A", "B", "C", "D")}
    for e in ("B", "C", "D"):  # three replayers with a short lease (C and D find no headroom: registered)
        await fair_publish(redis, e, tokens[e], 1, threshold=3, lease_ms=300)
    assert set(await active_replayers(redis, STREAM)) == {"B", "C", "D"}
    await redis.xtrim(STREAM, maxlen=0)
    await redis.xgroup_setid(STREAM, GROUP, "$")
    # headroom 2 among 4 replayers of weight 1: floor(2 / 4) = 0, but at least 1 moves
    low = await fair_publish(redis, "A", tokens["A"], 1, threshold=2)
    assert (low.moved, low.reading.headroom) == (1, 1)
    await asyncio.sleep(0.4)  # B, C and D's leases end: A is alone again
    assert set(await active_replayers(redis, STREAM)) == {"A"}
    alone = await fair_publish(redis, "A", tokens["A"], 2, threshold=5)
    assert (alone.moved, alone.reading.headroom) == (4, 4)
    assert await redis.zrange(replayers_key(STREAM), 0, -1) == [b"A"]


async def test_many_replayers_are_summed_in_chunks(group: Redis) -> None:
    redis = group
    token = await claimed(redis, "A", 200)
    seconds, _ = await redis.time()
    lease_end = (seconds + 60) * 1000
    await redis.zadd(replayers_key(STREAM), {f"other-{i}": lease_end for i in range(1_500)})
    await redis.zadd(replayers_key(STREAM), {f"gone-{i}": lease_end - 120_000 for i in range(10)})
    await set_weight(redis, STREAM, "A", MAX_WEIGHT)
    # 1,500 others of weight 1 (past one HMGET of 1,000 fields) and A of 1,000: 100 * 1,000 / 2,500
    result = await fair_publish(redis, "A", token, 1)
    assert (result.moved, result.reading.headroom) == (40, 40)
    # the lapsed ones were dropped with the caller's registration
    assert await redis.zcard(replayers_key(STREAM)) == 1_501


async def test_a_bad_lease_fails_before_any_write(group: Redis) -> None:
    redis = group
    token = await claimed(redis, "A", 5)
    k = keys("A")
    script_keys = [k.stream, k.held, k.state, k.fence, k.claim, k.publish, weights_key(STREAM), replayers_key(STREAM)]
    for lease in ("abc", "0", "1.5"):
        args = [token, 1, 10, 100, GROUP, "zero", lease, "me", 4 * 1024 * 1024, "", "1", "A", "*"]
        with pytest.raises(ResponseError, match=r"^XMCARG lease must be an integer 1\.\."):
            await run_script(redis, "publish", script_keys, args)
    assert await held.held_count(redis, k) == 5
    assert await redis.xlen(STREAM) == 0 and await redis.exists(replayers_key(STREAM)) == 0


async def test_a_completed_replay_leaves_and_an_unfair_one_never_registers(group: Redis) -> None:
    redis = group
    a, b = await claimed(redis, "A", 3), await claimed(redis, "B", 3)
    done = await fair_publish(redis, "A", a, 1)
    assert (done.status, done.moved) == (PublishStatus.COMPLETED, 3)
    assert await redis.exists(replayers_key(STREAM)) == 0
    plain = await fair_publish(redis, "B", b, 1, fair=False)
    assert (plain.status, plain.moved) == (PublishStatus.COMPLETED, 3)
    assert await redis.exists(replayers_key(STREAM)) == 0


@pytest.mark.parametrize("weight", ["0", "1001", "-1", "1.5", "two", ""])
async def test_a_bad_weight_fails_before_any_write(group: Redis, weight: str) -> None:
    redis = group
    token = await claimed(redis, "A", 5)
    await redis.hset(weights_key(STREAM), "A", weight)
    with pytest.raises(ResponseError, match=r"XMCCORRUPT \{scale-stream\}:weights field A holds .*not a weight"):
        await fair_publish(redis, "A", token, 1)
    assert await held.held_count(redis, keys("A")) == 5
    assert await redis.xlen(STREAM) == 0 and await redis.exists(replayers_key(STREAM)) == 0


async def test_a_weights_key_of_another_type_is_named(group: Redis) -> None:
    redis = group
    token = await claimed(redis, "A", 5)
    await redis.set(weights_key(STREAM), "x")
    with pytest.raises(ResponseError, match=r"WRONGTYPE \{scale-stream\}:weights is a string, expected a hash"):
        await fair_publish(redis, "A", token, 1)
    assert await held.held_count(redis, keys("A")) == 5


async def test_set_weight_validates(redis: Redis) -> None:
    for bad in (0, MAX_WEIGHT + 1, True, 2.5):
        with pytest.raises(ValueError, match="weight must be an integer"):
            await set_weight(redis, STREAM, "A", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="experiment_id"):
        await set_weight(redis, STREAM, "A B", 2)
    await set_weight(redis, STREAM, "A", MAX_WEIGHT)
    assert await redis.hget(weights_key(STREAM), "A") == str(MAX_WEIGHT).encode()


def test_fair_share_is_an_input_field_off_by_default() -> None:
    assert ResumptionInput(experiment_id="E").fair_share is False
    assert ResumptionInput.model_validate({"experiment_id": "E", "fair_share": True}).fair_share is True


SIZE = ScaleSize(experiments=10, tasks=200, rate=1_000, threshold=100)


@pytest_asyncio.fixture
async def bench_env(temporal_env: WorkflowEnvironment, redis_url: str, task_queue: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    redis = Redis.from_url(redis_url, decode_responses=False)
    await redis.flushall()
    address = temporal_env.client.service_client.config.target_host
    yield BenchEnv(redis_url, address, temporal_env.client, redis, task_queue, tmp_path)
    await redis.aclose()


@pytest.mark.heavy  # ten replays under two worker processes
async def test_ten_replayers_two_workers_one_threshold(bench_env: BenchEnv) -> None:
    batch = SIZE.threshold // 5
    cases = [
        ScaleCase("equal", (Group(10, 200, batch),), "adaptive"),
        ScaleCase("greedy", (Group(9, 200, batch), Group(1, 200, SIZE.threshold)), "adaptive", fair_share=True),
    ]
    async with two_workers(bench_env) as workers:
        rows = [await scale_run(bench_env, case, SIZE, workers) for case in cases]
        assert all(w.proc.poll() is None for w in workers)
    for row in rows:
        assert row["outcomes"] == {"completed": 10}
        assert (row["stream_entries"], row["duplicates"], row["lost"], row["out_of_order"]) == (2_000, 0, 0, 0)
        assert row["held_left"] == 0 and row["exactly_once"] is True
        # sampled all along (a shared machine can stretch a gap; the script bounds every publish)
        assert 0 < row["max_backlog"] <= row["threshold"] == 100
        assert row["samples"] > 100
        assert row["worker_cpu_s"] > 0 and row["redis_cpu_s"] > 0
        finish = row["finish"]
        assert 0 < finish["first_s"] <= finish["median_s"] <= finish["last_s"] <= row["wall_s"]
    # the replays reached the threshold and waited for the consumers (how close to their rate the replays
    # finished is a speed: figure g's wall/ideal, python -m bench, docs/benchmarks.md)
    assert all(row["throttles"] > 0 for row in rows)
    # the fair replays registered while they ran and left the registry once completed
    assert rows[1]["replayers_left"] == 0 and rows[1]["fair_share"] is True


async def test_a_released_replay_leaves_the_fair_share_at_once(group: Redis) -> None:
    """A paused or cancelled fair-share replay releases its claim: it stops counting in the others'
    shares then, not when its lease ends."""
    redis = group
    a, b = await claimed(redis, "A", 30), await claimed(redis, "B", 30)
    await fair_publish(redis, "A", a, 1, threshold=10)  # neither drains: both stay registered
    await fair_publish(redis, "B", b, 1, threshold=10)
    assert sorted(await redis.zrange(replayers_key(STREAM), 0, -1)) == [b"A", b"B"]
    assert (await fencing.release_claim(redis, keys("A"), a, owner="me", back_to_paused=True)).token == a
    assert await redis.zrange(replayers_key(STREAM), 0, -1) == [b"B"]


async def test_a_replayers_key_of_the_wrong_type_does_not_stop_the_release(group: Redis) -> None:
    """The stream's shared key, of the wrong type, holds no entry of this replay: the release
    leaves it alone and hands the experiment back all the same (it failed every release on the
    stream once); the fair publishes on the stream fail on it, naming it."""
    redis = group
    b = await claimed(redis, "B", 30)
    await redis.set(replayers_key(STREAM), "x")
    with pytest.raises(ResponseError, match=r"WRONGTYPE \{scale-stream\}:replayers is a string, expected a zset"):
        await fair_publish(redis, "B", b, 1, threshold=10)
    assert (await fencing.release_claim(redis, keys("B"), b, owner="me", back_to_paused=True)).token == b
    assert await fencing.current_token(redis, keys("B")) == b + 1  # revoked
    assert await held.get_state(redis, keys("B")) is ExperimentState.PAUSED
    assert await redis.exists(keys("B").claim) == 0
    assert await redis.get(replayers_key(STREAM)) == b"x"  # not the release's to mend
    assert await held.held_count(redis, keys("B")) == 30


async def test_a_corrupt_weight_affects_only_its_own_experiment(group: Redis) -> None:
    """B's weight is garbage: B's own fair publish fails naming the key and field, before any
    write; A's share counts B at the default weight 1 (a corrupt weight of one experiment failed
    every other's fair publish once)."""
    redis = group
    a, b = await claimed(redis, "A", 100), await claimed(redis, "B", 100)
    await redis.zadd(replayers_key(STREAM), {"B": (await redis.time())[0] * 1000 + 60_000})
    await redis.hset(weights_key(STREAM), mapping={"B": "heavy", "A": "3"})
    with pytest.raises(ResponseError, match=r"XMCCORRUPT \{scale-stream\}:weights field B holds \"heavy\""):
        await fair_publish(redis, "B", b, 1)
    assert await held.held_count(redis, keys("B")) == 100 and await redis.xlen(STREAM) == 0
    result = await fair_publish(redis, "A", a, 1)
    assert (result.status, result.moved, result.reading.headroom) == (
        PublishStatus.PUBLISHED,
        75,
        75,
    )  # 100 * 3 / (3 + 1)


@pytest.mark.parametrize(
    ("ahead_ms", "counted"),
    [(MAX_LEASE_MS - 60_000, True), (MAX_LEASE_MS + 60_000, False), (10 * 365 * 86_400_000, False)],
    ids=["within-the-longest-lease", "past-it", "ten-years"],
)
async def test_a_lease_end_beyond_the_longest_lease_counts_for_nobody(
    group: Redis, ahead_ms: int, counted: bool
) -> None:
    """A ``{S}:replayers`` member whose lease ends further ahead than any replay could have set
    (a week, the input's bound) never lapsed and shrank every share for good once: now it does
    not count, and the next fair publish drops it."""
    redis = group
    a = await claimed(redis, "A", 200)
    seconds, _ = await redis.time()
    await redis.zadd(replayers_key(STREAM), {"Z": seconds * 1000 + ahead_ms})
    result = await fair_publish(redis, "A", a, 1)
    assert (result.moved, result.reading.headroom) == ((50, 50) if counted else (100, 100))
    assert set(await active_replayers(redis, STREAM)) == ({"A", "Z"} if counted else {"A"})
    members = {m.decode() for m in await redis.zrange(replayers_key(STREAM), 0, -1)}
    assert members == ({"A", "Z"} if counted else {"A"})


def test_the_longest_lease_is_one_number() -> None:
    """``fair.lua`` holds the bound as a literal: it must be Python's, and the input's."""
    lua = source("publish")
    assert f"local XMC_MAX_LEASE_MS = {MAX_LEASE_MS} " in lua
    assert field_type(ResumptionInput, "claim_lease_seconds").max * 1000 == MAX_LEASE_MS  # type: ignore[attr-defined]
    assert ResumptionInput(experiment_id="E", claim_lease_seconds=MAX_LEASE_MS / 1000).lease_ms == MAX_LEASE_MS


async def test_a_lease_past_the_longest_is_refused(group: Redis) -> None:
    redis = group
    token = await claimed(redis, "A", 5)
    with pytest.raises(ValueError, match=r"lease must be an integer of 1\.\.604800000 ms"):
        await fair_publish(redis, "A", token, 1, lease_ms=MAX_LEASE_MS + 1)
    k = keys("A")
    script_keys = [k.stream, k.held, k.state, k.fence, k.claim, k.publish, weights_key(STREAM), replayers_key(STREAM)]
    args = [token, 1, 10, 100, GROUP, "zero", MAX_LEASE_MS + 1, "me", 4 * 1024 * 1024, "", "1", "A", "*"]
    with pytest.raises(ResponseError, match=r'^XMCARG lease must be an integer 1\.\.604800000, got "604800001"'):
        await run_script(redis, "publish", script_keys, args)
    assert await held.held_count(redis, k) == 5
