"""Backlog measurement against a real redis-server: every case of tests/cases/backlog.json (the
XINFO lag cases of docs/contract.md, "Backlog"), plus the cap and the error paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from xmc_resumption.redisclient.backlog import measure_backlog
from xmc_resumption.redisclient.errors import MissingConsumerGroupError
from xmc_resumption.redisclient.results import GroupStatus, MissingGroupPolicy

CASES = json.loads((Path(__file__).parent / "cases" / "backlog.json").read_text())
STREAM = CASES["stream"]


@pytest.mark.parametrize("case", CASES["cases"], ids=[c["name"] for c in CASES["cases"]])
async def test_backlog_case(redis: Redis, case: dict) -> None:
    for command in case["commands"]:
        await redis.execute_command(*command)
    policy = MissingGroupPolicy(case.get("policy", "zero"))
    threshold = case["threshold"]
    if "expect_error" in case:
        with pytest.raises(ResponseError, match=case["expect_error"]):
            await measure_backlog(redis, STREAM, case["group"], threshold, policy)
        return
    reading = await measure_backlog(redis, STREAM, case["group"], threshold, policy)
    truth = case["truth"]
    if truth < threshold:
        expected = (truth, False)  # exact
    else:
        # capped: pending alone at the threshold skips the count; else the XRANGE reads at most
        # k = threshold - pending + 1 entries, so the reading is min(truth, threshold + 1)
        pending = (await redis.xpending(STREAM, case["group"]))["pending"]
        expected = (pending, True) if pending >= threshold else (min(truth, threshold + 1), truth > threshold)
    assert (reading.backlog, reading.capped) == expected
    assert reading.headroom == max(0, threshold - truth)


async def test_lag_count_stops_just_past_the_threshold(redis: Redis) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(1, 10_001):
            pipe.xadd(STREAM, {"task": f"t{i}"}, id=f"{i}-0")
        await pipe.execute()
    await redis.xgroup_create(STREAM, "g", id="0")
    reading = await measure_backlog(redis, STREAM, "g", 50)
    assert (reading.pending, reading.lag, reading.capped) == (0, 51, True)
    assert reading.xinfo_lag == 10_000


async def test_pending_alone_at_threshold_skips_the_count(redis: Redis) -> None:
    for i in range(1, 21):
        await redis.xadd(STREAM, {"task": f"t{i}"}, id=f"{i}-0")
    await redis.xgroup_create(STREAM, "g", id="0")
    await redis.xreadgroup("g", "c1", {STREAM: ">"}, count=7)
    reading = await measure_backlog(redis, STREAM, "g", 7)
    assert (reading.pending, reading.lag, reading.capped, reading.backlog) == (7, 0, True, 7)
    reading = await measure_backlog(redis, STREAM, "g", 8)
    assert (reading.pending, reading.lag, reading.capped, reading.backlog) == (7, 2, True, 9)
    reading = await measure_backlog(redis, STREAM, "g", 100)
    assert (reading.pending, reading.lag, reading.capped, reading.backlog) == (7, 13, False, 20)


async def test_missing_group_zero_policy_warns(redis: Redis, caplog: pytest.LogCaptureFixture) -> None:
    await redis.xadd(STREAM, {"task": "t1"})
    reading = await measure_backlog(redis, STREAM, "nobody", 5)
    assert (reading.status, reading.backlog) == (GroupStatus.NO_GROUP, 0)
    assert "does not exist" in caplog.text


async def test_missing_group_error_policy_raises(redis: Redis) -> None:
    await redis.xadd(STREAM, {"task": "t1"})
    with pytest.raises(MissingConsumerGroupError, match="nobody"):
        await measure_backlog(redis, STREAM, "nobody", 5, MissingGroupPolicy.ERROR)


async def test_missing_stream_is_zero_under_the_zero_policy_and_an_error_under_error(redis: Redis) -> None:
    reading = await measure_backlog(redis, STREAM, "g", 5, MissingGroupPolicy.ZERO)
    assert (reading.status, reading.backlog) == (GroupStatus.NO_STREAM, 0)
    with pytest.raises(MissingConsumerGroupError):
        await measure_backlog(redis, STREAM, "g", 5, MissingGroupPolicy.ERROR)


async def test_connection_error_is_raised_not_zero() -> None:
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    from xmc_resumption.services import free_port

    client = Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))  # no client retries
    with pytest.raises(RedisConnectionError):
        await measure_backlog(client, STREAM, "g", 5)
    await client.aclose()


async def test_threshold_below_one_is_refused(redis: Redis) -> None:
    with pytest.raises(ValueError, match="threshold"):
        await measure_backlog(redis, STREAM, "g", 0)
