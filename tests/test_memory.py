"""The memory guard against a real redis-server (issue 8, item 1): an eviction policy that could
drop the replay's keys refuses the claim and the publish before any write, however the resumption
starts; the publish waits while used memory is at or above a fraction of ``maxmemory``; one
publish moves at most its byte budget plus one task; the worker warns and ``xmc status`` shows the
policy. The session's redis-server is reconfigured with CONFIG SET and restored after each test."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator
from fractions import Fraction
from pathlib import Path

import pytest
import pytest_asyncio
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from tests.support.helpers import (
    GROUP,
    STREAM,
    hold_tasks,
    resumption_worker,
    start,
    stream_tasks,
    throttled_replay,
    token_floor,
    wait_for,
    xmc_process,
)
from xmc_resumption import redisclient
from xmc_resumption.activities.errors import ErrorType
from xmc_resumption.activities.requests import AcquireRequest, ExperimentRef
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.backlog import MAX_BYTE_BUDGET
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.memory import fraction_arg, read_memory
from xmc_resumption.redisclient.publish import PublishParams, publish_batch
from xmc_resumption.redisclient.readings import MissingGroupPolicy
from xmc_resumption.redisclient.results import ExperimentState, PublishStatus
from xmc_resumption.redisclient.scripts import run_script, source
from xmc_resumption.settings import Settings
from xmc_resumption.worker import check_redis
from xmc_resumption.workflows.models import Outcome

KEYS = ExperimentKeys(STREAM, "M1")
EVICTING = ("allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu", "volatile-random",
            "volatile-ttl")  # fmt: skip
PUBLISH_KEYS = [KEYS.held, KEYS.state, KEYS.fence, KEYS.claim, KEYS.publish]
MIB = 1024 * 1024


@pytest_asyncio.fixture
async def memory(redis: Redis) -> AsyncIterator[Redis]:
    """The session's Redis with ``maxmemory 8mb``; policy and limit restored to the defaults after."""
    await redis.config_set("maxmemory", str(8 * MIB))
    try:
        yield redis
    finally:
        await redis.config_set("maxmemory-policy", "noeviction")
        await redis.config_set("maxmemory", "0")


async def publish(redis: Redis, token: int, seq: int, **kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {"batch_size": 100, "threshold": 1_000, "missing_group": MissingGroupPolicy.ZERO, **kw}
    return await publish_batch(
        redis, KEYS, GROUP, PublishParams(token=token, seq=seq, owner="me", lease_ms=60_000, **args)
    )  # type: ignore[arg-type]


async def snapshot(redis: Redis) -> dict[str, object]:
    """Everything the scripts could write for ``KEYS``."""
    return {
        "state": await redis.get(KEYS.state),
        "held": await redis.xrange(KEYS.held),
        "stream": await redis.xlen(STREAM) if await redis.exists(STREAM) else None,
        "fence": await redis.get(KEYS.fence),
        "claim": await redis.hgetall(KEYS.claim),
        "publish": await redis.hgetall(KEYS.publish),
        "acquired": await redis.lrange(KEYS.acquire_log, 0, -1),
    }


@pytest.mark.parametrize("policy", EVICTING)
async def test_the_claim_is_refused_under_every_policy_but_noeviction(memory: Redis, policy: str) -> None:
    await hold_tasks(memory, KEYS.experiment_id, 3)
    await memory.config_set("maxmemory-policy", policy)
    before = await snapshot(memory)
    with pytest.raises(ResponseError) as err:
        await fencing.acquire_claim(memory, KEYS, "me", 60_000, "req-1")
    assert str(err.value).startswith(f"XMCEVICTION maxmemory-policy {policy}: the replay needs noeviction")
    assert await snapshot(memory) == before
    assert before["state"] == b"paused" and before["fence"] is None
    await memory.config_set("maxmemory-policy", "noeviction")
    floor = await token_floor(memory)
    assert (await fencing.acquire_claim(memory, KEYS, "me", 60_000, "req-1")).token >= floor  # the first claim


async def test_a_publish_under_an_evicting_policy_moves_nothing(memory: Redis) -> None:
    """The policy changed after the claim (CONFIG SET mid-run): the publish refuses before its first
    write, and a repeated request ID of the acquire is refused too."""
    await hold_tasks(memory, KEYS.experiment_id, 5)
    grant = await fencing.acquire_claim(memory, KEYS, "me", 60_000, "req-1")
    assert (await publish(memory, grant.token, 1, batch_size=2)).moved == 2
    await memory.config_set("maxmemory-policy", "allkeys-lru")
    before = await snapshot(memory)
    with pytest.raises(ResponseError, match=r"^XMCEVICTION maxmemory-policy allkeys-lru: "):
        await publish(memory, grant.token, 2, batch_size=2)
    with pytest.raises(ResponseError, match=r"^XMCEVICTION maxmemory-policy allkeys-lru: "):
        await fencing.acquire_claim(memory, KEYS, "me", 60_000, "req-1")
    assert await snapshot(memory) == before
    assert len(before["held"]) == 3 and before["stream"] == 2  # type: ignore[arg-type]


async def test_the_activity_fails_non_retryable_naming_the_setting(memory: Redis) -> None:
    await hold_tasks(memory, KEYS.experiment_id, 1)
    await memory.config_set("maxmemory-policy", "volatile-lru")
    ref = ExperimentRef(experiment_id=KEYS.experiment_id, stream=STREAM, consumer_group=GROUP)
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            ResumptionActivities(memory).acquire_claim,
            AcquireRequest(ref=ref, owner="me", lease_ms=1000, request_id="r"),
        )
    assert (err.value.type, err.value.non_retryable) == (ErrorType.REDIS_EVICTION_POLICY, True)
    assert err.value.message.startswith("maxmemory-policy volatile-lru: the replay needs noeviction (")


async def test_read_memory_reports_policy_limit_and_problem(memory: Redis) -> None:
    ok = await read_memory(memory, STREAM)
    assert (ok.policy, ok.maxmemory, ok.problem, ok.evicts) == ("noeviction", 8 * MIB, None, False)
    assert 0 < ok.used_memory == pytest.approx((await memory.info("memory"))["used_memory"], rel=0.2)
    await memory.config_set("maxmemory-policy", "allkeys-lfu")
    bad = await read_memory(memory, STREAM)
    assert bad.evicts and bad.problem and bad.problem.startswith("maxmemory-policy allkeys-lfu: the replay needs")


async def test_the_publish_waits_at_the_memory_fraction(memory: Redis) -> None:
    """used/max at about 0.95: a fraction of 0.9 moves nothing (status ``memory``, the figures in the
    result), 0.99 and None move, and without maxmemory the check is off."""
    await hold_tasks(memory, KEYS.experiment_id, 6)
    grant = await fencing.acquire_claim(memory, KEYS, "me", 60_000)
    await memory.script_load(source("publish"))  # the script cache counts in used_memory: loaded first
    used = (await memory.info("memory"))["used_memory"]
    await memory.config_set("maxmemory", str(int(used / 0.95)))
    full = await publish(memory, grant.token, 1, max_memory_fraction=0.9)
    assert (full.status, full.moved, full.remaining) == (PublishStatus.MEMORY, 0, 6)
    assert full.maxmemory == int(used / 0.95) and 0.9 <= full.used_memory / full.maxmemory < 0.99
    assert not await memory.exists(STREAM)
    assert (await publish(memory, grant.token, 2, batch_size=2, max_memory_fraction=0.99)).moved == 2
    assert (await publish(memory, grant.token, 3, batch_size=2, max_memory_fraction=None)).moved == 2
    await memory.config_set("maxmemory", "0")
    last = await publish(memory, grant.token, 4, max_memory_fraction=0.01)
    assert (last.status, last.moved, last.maxmemory) == (PublishStatus.COMPLETED, 2, 0)
    assert await stream_tasks(memory) == [f"M1-t{i}".encode() for i in range(6)]


async def test_a_group_with_no_consumer_does_not_hold_the_replay_and_the_memory_guard_still_does(
    memory: Redis,
) -> None:
    """Issue 24 item 5: a group no consumer reads (``leftover``, 50 entries behind at threshold 10) does not bound
    the move, so what protects Redis from its unread entries is the memory guard, which stops the move all the same."""
    await memory.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    await memory.xgroup_create(STREAM, "leftover", id="$")
    for i in range(50):
        await memory.xadd(STREAM, {"task": f"x{i}"})
    await memory.xreadgroup(GROUP, "w1", {STREAM: ">"}, count=50, noack=True)
    await hold_tasks(memory, KEYS.experiment_id, 6)
    grant = await fencing.acquire_claim(memory, KEYS, "me", 60_000)
    await memory.script_load(source("publish"))  # the script cache counts in used_memory: loaded first
    used = (await memory.info("memory"))["used_memory"]
    await memory.config_set("maxmemory", str(int(used / 0.95)))
    full = await publish(memory, grant.token, 1, threshold=10, max_memory_fraction=0.9)
    assert (full.status, full.moved, full.reading.headroom) == (PublishStatus.MEMORY, 0, 10)
    assert [(g.name, g.lag) for g in full.reading.unattended] == [("leftover", 50)]
    moved = await publish(memory, grant.token, 2, threshold=10, batch_size=4, max_memory_fraction=None)
    assert (moved.status, moved.moved) == (PublishStatus.PUBLISHED, 4)


async def test_a_fraction_out_of_bounds_is_refused_before_any_write(memory: Redis) -> None:
    await hold_tasks(memory, KEYS.experiment_id, 1)
    grant = await fencing.acquire_claim(memory, KEYS, "me", 60_000)
    with pytest.raises(ValueError, match=r"max memory fraction must be in \(0, 1\], got 1.5"):
        await publish(memory, grant.token, 1, max_memory_fraction=1.5)
    before = await snapshot(memory)
    for bad in ("0", "1.01", "nan", "x"):  # the script checks too, whoever calls it
        args = [grant.token, 1, 10, 100, GROUP, "zero", 60_000, "me", MIB, bad, "0", KEYS.experiment_id, "*"]
        with pytest.raises(ResponseError, match=r"^XMCARG max memory fraction must be a number with 0 < f <= 1"):
            await run_script(memory, "publish", [STREAM, *PUBLISH_KEYS], args)
    assert await snapshot(memory) == before


async def test_a_publish_moves_at_most_its_byte_budget_plus_one_task(redis: Redis) -> None:
    """Held tasks of mixed sizes (small ones first, so the read's chunks grow, then up to 300 KiB):
    every publish moves at least one task, and stops once its bytes reach the budget."""
    budget = 256 * 1024
    rng = random.Random(8)
    sizes = [100] * 40 + [rng.choice((1_000, 20_000, 120_000, 300_000)) for _ in range(60)]
    await held.pause(redis, KEYS)
    for i, size in enumerate(sizes):
        await held.enqueue_task(redis, KEYS, {"task": f"t{i}", "payload": "x" * size})
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    seq, moved_in_all, calls = 0, 0, []
    while True:
        seq += 1
        result = await publish(redis, grant.token, seq, max_bytes=budget)
        await redis.xgroup_setid(STREAM, GROUP, "$")  # consumed: the next count reads no large task
        entries = (await redis.xrange(STREAM))[moved_in_all:]
        moved_bytes = [sum(len(k) + len(v) for k, v in f.items()) for _, f in entries]  # fields and values
        assert result.moved == len(entries) >= 1
        assert sum(moved_bytes) < result.moved_bytes <= sum(moved_bytes) + 41 * result.moved  # + the held IDs
        assert result.moved_bytes - moved_bytes[-1] - 41 < budget, f"publish {seq} moved {moved_bytes}: past {budget}"
        calls.append(result.moved)
        moved_in_all += result.moved
        if result.status is PublishStatus.COMPLETED:
            break
    assert moved_in_all == len(sizes) and len(calls) > 10  # the budget, not the batch of 100, split the moves
    assert [f[b"task"] for _, f in await redis.xrange(STREAM)] == [f"t{i}".encode() for i in range(len(sizes))]


async def test_a_resumption_on_an_evicting_redis_fails_at_once_and_moves_nothing(
    temporal_env, memory, redis_url, task_queue
) -> None:
    """Started like the Temporal CLI or a parent would start it (no CLI check in between)."""
    e = f"M-{uuid.uuid4().hex[:6]}"
    keys = ExperimentKeys(STREAM, e)
    names = await hold_tasks(memory, e, 3)
    await memory.config_set("maxmemory-policy", "allkeys-lru")
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e)
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 20)
    cause = failure.value.cause
    while not isinstance(cause, ApplicationError) and cause is not None:
        cause = cause.cause  # type: ignore[attr-defined]
    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.REDIS_EVICTION_POLICY
    assert cause.message.startswith("maxmemory-policy allkeys-lru: the replay needs noeviction")
    assert await held.get_state(memory, keys) is ExperimentState.PAUSED
    assert [f[b"task"] for _, f in await memory.xrange(keys.held)] == names
    assert not await memory.exists(keys.claim, keys.fence, STREAM)


async def test_a_policy_changed_mid_run_fails_the_run_and_hands_back_a_paused_experiment(
    temporal_env, memory, redis_url, task_queue
) -> None:
    """The policy changes during a throttle wait: the next publish refuses before its first write,
    and the run fails after releasing the claim (the release does not need the policy)."""
    async with throttled_replay(temporal_env, task_queue, memory, redis_url) as run:
        await memory.config_set("maxmemory-policy", "allkeys-lru")
        await memory.xgroup_setid(STREAM, GROUP, "$")  # the consumers caught up: the next turn publishes
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(run.handle.result(), 20)
    assert "maxmemory-policy allkeys-lru: the replay needs noeviction" in str(failure.value.cause)
    assert await held.get_state(memory, run.keys) is ExperimentState.PAUSED
    assert [f[b"task"] for _, f in await memory.xrange(run.keys.held)] == run.names
    [release] = await memory.lrange(run.keys.released, 0, -1)  # '<token> <outcome> <replayed> <remaining>'
    assert await fencing.current_token(memory, run.keys) == int(release.split()[0]) + 1  # its token, revoked
    assert not await memory.exists(run.keys.claim)
    assert await memory.xlen(STREAM) == 5  # the backlog that was there; nothing replayed


async def test_the_replay_waits_while_memory_is_high_then_goes_on(temporal_env, memory, redis_url, task_queue) -> None:
    """Used memory over the input's fraction (1 % of 100 MiB): the replay waits on a timer of
    ``throttle_seconds`` with the reason in its progress, publishing nothing; once the limit is
    lifted it replays everything in order."""
    e = f"M-{uuid.uuid4().hex[:6]}"
    names = await hold_tasks(memory, e, 10)
    await memory.config_set("maxmemory", str(100 * MIB))
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        with temporal_env.auto_time_skipping_disabled():
            handle = await start(
                temporal_env.client,
                task_queue,
                experiment_id=e,
                max_memory_fraction=0.01,
                missing_group="zero",  # no group: the stream's entries (none yet) are the backlog
                throttle_seconds=1,
                throttle_policy="adaptive",  # a memory wait is a timer whatever the policy, never a drain poll
            )
            waiting = await wait_for(handle, lambda p: (p.throttle_reason or "").startswith("Redis memory"))
            assert waiting.replayed == 0 and not await memory.exists(STREAM)
            assert waiting.throttle_reason.endswith(" of 100.0 MiB) >= 1%")  # type: ignore[union-attr]
            assert (waiting.wait_plan, waiting.wait_seconds) == ("fixed 1s wait", 1)
            await memory.config_set("maxmemory", "0")
            result = await asyncio.wait_for(handle.result(), 20)
    assert (result.outcome, result.replayed) == (Outcome.COMPLETED, 10) and result.throttles >= 1
    assert await stream_tasks(memory) == names


async def test_xmc_resume_refuses_before_starting_and_status_shows_the_policy(memory: Redis, redis_url: str) -> None:
    """``xmc resume`` refuses before it connects to Temporal (none listens at TEMPORAL_ADDRESS)."""
    await hold_tasks(memory, KEYS.experiment_id, 2)
    await memory.config_set("maxmemory-policy", "allkeys-lru")
    refused = await asyncio.to_thread(xmc_process, redis_url, "resume", KEYS.experiment_id)
    assert refused.returncode == 2
    assert refused.stderr.startswith("xmc resume: maxmemory-policy allkeys-lru: the replay needs noeviction (")
    status = json.loads(
        (await asyncio.to_thread(xmc_process, redis_url, "status", KEYS.experiment_id, "--json")).stdout
    )
    assert status["redis_memory"]["policy"] == "allkeys-lru" and status["redis_memory"]["maxmemory"] == 8 * MIB
    assert status["redis_memory"]["problem"].startswith("maxmemory-policy allkeys-lru")
    assert status["state"] == "paused" and status["fence"] == 0


async def test_the_worker_warns_at_start(memory: Redis, redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(redis_url=redis_url)
    with caplog.at_level(logging.WARNING, logger="xmc.worker"):
        await check_redis(settings)
        assert not caplog.records
        await memory.config_set("maxmemory-policy", "volatile-ttl")
        await check_redis(settings)
    assert [r.getMessage() for r in caplog.records] == [
        "maxmemory-policy volatile-ttl: the replay needs noeviction (this policy can evict the held tasks, the "
        "fence counter or the claim); set maxmemory-policy noeviction on this Redis, then resume again; every "
        "resumption on this Redis fails until then"
    ]


async def script_ms(redis: Redis) -> list[float]:
    """Redis-side time of each script call in the SLOWLOG (ms)."""
    return [entry["duration"] / 1000 for entry in await redis.slowlog_get(100) if b"EVALSHA" in entry["command"]]


async def test_a_publish_of_1_mib_tasks_costs_redis_a_fraction_of_an_unbudgeted_one(redis: Redis) -> None:
    """Issue 8's bound (no script blocks Redis more than 50 ms) is measured by ``python -m bench
    --only f``; on this shared machine an absolute bound in a test is not robust (a full-suite run
    under a load average of 20 saw 92-348 ms for calls that take 8-9 ms alone). Asserted here: at
    batch 100 and the default 4 MiB each publish of 1 MiB tasks behind 2 undelivered ones moves 4
    tasks, and Redis's own time for it (SLOWLOG; the least disturbed of three) is well under that
    of one call without the budget, which moves the other 47 at once."""
    payload = b"x" * MIB

    async def two_undelivered() -> None:  # the consumers read all but the last two
        await redis.xgroup_setid(STREAM, GROUP, "$")
        for i in range(2):
            await redis.xadd(STREAM, {"task": f"other-{i}", "payload": payload})

    await redis.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    await held.pause(redis, KEYS)
    for i in range(60):
        await held.enqueue_task(redis, KEYS, {"task": f"t{i}", "payload": payload})
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    await publish(redis, grant.token, 1, batch_size=1)  # loads the script
    await redis.config_set("slowlog-log-slower-than", "0")
    try:
        budgeted = []
        for seq in range(2, 5):
            await two_undelivered()
            await redis.slowlog_reset()
            result = await publish(redis, grant.token, seq)
            # the count reads at most 256 KiB, so behind 1 MiB entries it takes the stream's length as the bound
            assert (result.moved, result.reading.lag_source) == (4, "bound") and result.reading.lag >= 2, result
            budgeted += await script_ms(redis)
        await two_undelivered()
        await redis.slowlog_reset()
        unbounded = await publish(redis, grant.token, 5, max_bytes=MAX_BYTE_BUDGET)
        whole = await script_ms(redis)
    finally:
        await redis.config_set("slowlog-log-slower-than", "10000")
    assert (unbounded.status, unbounded.moved) == (PublishStatus.COMPLETED, 47)
    assert len(budgeted) == 3 and len(whole) == 1
    assert whole[0] > 3 * min(budgeted), (whole, budgeted)


def memory_full_probe() -> str:
    """A script running ``memory.lua``'s own rule on given figures: ARGV used_memory, maxmemory
    (bytes) and the fraction argument as the publish script gets it; returns 1 (stop) or 0."""
    fragment = (Path(redisclient.__file__).parent / "lua" / "memory.lua").read_text()
    return fragment + (
        "\nlocal m = {used_memory = tonumber(ARGV[1]), maxmemory = tonumber(ARGV[2])}"
        "\nreturn xmc_memory_full(m, xmc_memory_fraction(ARGV[3])) and 1 or 0\n"
    )


BOUNDARIES = [
    # (maxmemory, fraction): used memory exactly at fraction x maxmemory, then one byte below
    (1_000, 0.9),
    (100, 0.07),  # 0.07 x 100 = 7.000000000000001 in floating point
    (104_857_600, 0.55),  # 100 MiB: 0.55 x max = 57671680.00000001
    (104_857_600, 0.9),
    (3_000_000_000, 0.34),
    (8 * MIB, 1.0),
]


@pytest.mark.parametrize(("maxmemory", "fraction"), BOUNDARIES)
async def test_used_memory_exactly_at_the_fraction_stops_and_a_byte_below_does_not(
    redis: Redis, maxmemory: int, fraction: float
) -> None:
    """``>=`` means stop: the rule of the publish script (``xmc_memory_full``) at the boundary,
    both sides, with the fraction as ``fraction_arg`` passes it. Computed as used >= f x max, the
    product rounded up past the exact figure and memory exactly at the fraction did not stop."""
    at = int(Fraction(repr(fraction)) * maxmemory)
    assert Fraction(repr(fraction)) * maxmemory == at  # the cases are exact
    probe = memory_full_probe()
    for used, full in ((at, 1), (at - 1, 0), (at + 1, 1), (maxmemory, 1), (0, 0)):
        assert await redis.eval(probe, 0, used, maxmemory, fraction_arg(fraction)) == full, (used, maxmemory)
    assert await redis.eval(probe, 0, at, 0, fraction_arg(fraction)) == 0  # no maxmemory: never
    assert await redis.eval(probe, 0, maxmemory, maxmemory, fraction_arg(None)) == 0  # off: never
