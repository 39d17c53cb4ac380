"""Redis contents the scripts must not trust: fencing tokens up to Redis's 64-bit INCR limit,
corrupt fence counters, state values the contract does not know, a fence counter that went back
(data loss), keys of the wrong type; and the replay count kept by the publish script."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from tests.support.helpers import token_floor
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams, publish_batch
from xmc_resumption.redisclient.readings import MissingGroupPolicy
from xmc_resumption.redisclient.results import ExperimentState, PublishStatus

KEYS = ExperimentKeys("xmc-tasks-stream", "E1")
GROUP = "xmc-workers"


async def publish(redis: Redis, token: int, seq: int, batch: int = 10) -> object:
    """A publish with no consumer group on the stream: under ``zero`` its entries are the backlog."""
    return await publish_batch(
        redis,
        KEYS,
        GROUP,
        PublishParams(
            token=token,
            seq=seq,
            batch_size=batch,
            threshold=1000,
            owner="me",
            lease_ms=60_000,
            missing_group=MissingGroupPolicy.ZERO,
        ),
    )


async def hold(redis: Redis, n: int) -> None:
    await held.pause(redis, KEYS)
    for i in range(n):
        await held.enqueue_task(redis, KEYS, {"task": f"t{i}"})


@pytest.mark.parametrize("fence", ["100000000000000", "9007199254740993", "9223372036854775805"])
async def test_tokens_are_exact_up_to_the_incr_limit(redis: Redis, fence: str) -> None:
    """1e14 + 1 has 15 digits (cjson keeps 14), 2^53 + 1 is not a double, 2^63 - 2 is the last
    token (its release takes the counter to INCR's limit, 2^63 - 1). A claim takes the clock's floor
    when the counter is below it: the run's token is then set as the counter's next value, as a run
    that claimed before tokens had a floor holds it."""
    await hold(redis, 3)
    await redis.set(KEYS.fence, fence)
    floor = await token_floor(redis)
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    assert grant.token == int(fence) + 1 if int(fence) + 1 > floor else grant.token >= floor
    await redis.set(KEYS.fence, int(fence) + 1)
    grant = grant.model_copy(update={"token": int(fence) + 1})
    check = await fencing.check_claim(redis, KEYS, grant.token, "me", 60_000)
    assert (check.fenced, check.fence_lost, check.current_token) == (False, False, grant.token)
    result = await publish(redis, grant.token, 1)
    assert (result.status, result.moved, result.total_moved) == (PublishStatus.COMPLETED, 3, 3)  # type: ignore[attr-defined]
    assert (await fencing.release_claim(redis, KEYS, grant.token, back_to_paused=False)).token == grant.token
    stale = await publish(redis, grant.token, 2)
    # fenced by its own release: the release's record, not a takeover
    assert (stale.status, stale.outcome, stale.replayed) == (PublishStatus.RELEASED, "released", 3)  # type: ignore[attr-defined]


@pytest.mark.parametrize("fence", ["9223372036854775806", "9223372036854775807"])
async def test_a_fence_at_the_incr_limit_refuses_a_new_claim_and_writes_nothing(redis: Redis, fence: str) -> None:
    await hold(redis, 1)
    await redis.set(KEYS.fence, fence)
    with pytest.raises(ResponseError, match=f"XMCEXHAUSTED {KEYS.fence} has no fencing token left"):
        await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    assert await held.get_state(redis, KEYS) is ExperimentState.PAUSED
    assert not await redis.exists(KEYS.claim, KEYS.acquire_log)


@pytest.mark.parametrize("garbage", ["-5", "1.5", "007", "abc", "1" * 20])
async def test_a_corrupt_fence_fails_every_script_before_any_write_naming_the_key(redis: Redis, garbage: str) -> None:
    await hold(redis, 2)
    await redis.set(KEYS.fence, garbage)
    expected = f"XMCCORRUPT {KEYS.fence} holds"
    with pytest.raises(ResponseError, match=expected) as err:
        await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    assert "user_script" not in str(err.value)
    for call in (
        fencing.check_claim(redis, KEYS, 1, "me", 60_000),
        publish(redis, 1, 1),
        fencing.release_claim(redis, KEYS, 1, back_to_paused=True),
    ):
        with pytest.raises(ResponseError, match=expected):
            await call
    # nothing written: still paused, both tasks held, no claim, no token handed out
    assert await held.get_state(redis, KEYS) is ExperimentState.PAUSED
    assert await redis.xlen(KEYS.held) == 2 and not await redis.exists(KEYS.stream)
    assert not await redis.exists(KEYS.claim, KEYS.acquire_log, KEYS.publish)
    assert await redis.get(KEYS.fence) == garbage.encode()


async def test_a_fence_that_went_back_is_data_loss_not_a_takeover(redis: Redis) -> None:
    await hold(redis, 4)
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    await redis.set(KEYS.fence, "0")  # a restart without persistence kept the held stream only
    check = await fencing.check_claim(redis, KEYS, grant.token, "me", 60_000)
    assert (check.fenced, check.fence_lost, check.current_token) == (False, True, 0)
    result = await publish(redis, grant.token, 1)
    assert (result.status, result.moved) == (PublishStatus.FENCE_LOST, 0)  # type: ignore[attr-defined]
    assert await redis.xlen(KEYS.held) == 4


@pytest.mark.parametrize("state", ["running", "PAUSED", "", "resumed"])
async def test_a_state_value_the_contract_does_not_know_never_reorders_tasks(redis: Redis, state: str) -> None:
    await hold(redis, 3)
    await redis.set(KEYS.state, state)
    assert await held.get_state(redis, KEYS) is ExperimentState.UNKNOWN
    assert (await held.enqueue_task(redis, KEYS, {"task": "t3"}))[0] == "held"
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    assert (grant.state, grant.previous_state) == (ExperimentState.RESUMING, ExperimentState.UNKNOWN)
    result = await publish(redis, grant.token, 1)
    assert (result.status, result.moved) == (PublishStatus.COMPLETED, 4)  # type: ignore[attr-defined]
    assert [f[b"task"] for _, f in await redis.xrange(KEYS.stream)] == [b"t0", b"t1", b"t2", b"t3"]
    assert (await held.enqueue_task(redis, KEYS, {"task": "t4"}))[0] == "stream"


async def test_held_tasks_without_a_state_key_still_hold_new_ones(redis: Redis) -> None:
    await hold(redis, 2)
    await redis.delete(KEYS.state)
    assert (await held.enqueue_task(redis, KEYS, {"task": "t2"}))[0] == "held"


async def test_a_key_of_the_wrong_type_is_named(redis: Redis) -> None:
    await redis.hset(KEYS.state, "x", "y")
    assert (await held.enqueue_task(redis, KEYS, {"task": "t"}))[0] == "held"  # any state key holds
    with pytest.raises(ResponseError) as err:
        await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    assert str(err.value) == f"WRONGTYPE {KEYS.state} is a hash, expected a string"
    await redis.delete(KEYS.state, KEYS.held)
    await redis.set(KEYS.stream, "not a stream")
    await redis.set(KEYS.held, "nor this")
    with pytest.raises(ResponseError) as err:
        await publish(redis, 1, 1)
    assert str(err.value) == (
        f"WRONGTYPE {KEYS.stream} is a string, expected a stream; {KEYS.held} is a string, expected a stream"
    )


async def test_the_count_is_the_publish_scripts_whatever_the_caller_lost(redis: Redis) -> None:
    """A caller that lost the replies of seq 1 and 2 (history lost in a crash) and asks again
    with seq 1 is told the recorded count: the authority is Redis, not the caller's memory."""
    await hold(redis, 25)
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    totals = [(await publish(redis, grant.token, seq)).total_moved for seq in (1, 2)]  # type: ignore[attr-defined]
    assert totals == [10, 20]
    stale = await publish(redis, grant.token, 1)
    assert (stale.status, stale.total_moved, stale.last_seq) == (PublishStatus.STALE, 20, 2)  # type: ignore[attr-defined]
    last = await publish(redis, grant.token, 3)
    assert (last.status, last.moved, last.total_moved) == (PublishStatus.COMPLETED, 5, 25)  # type: ignore[attr-defined]
    await hold(redis, 2)
    regrant = await fencing.acquire_claim(redis, KEYS, "other", 60_000)  # a new resumption counts afresh
    fresh = await publish(redis, regrant.token, 1)
    assert (fresh.moved, fresh.total_moved) == (2, 2)  # type: ignore[attr-defined]


async def test_a_fenced_publish_reports_no_count_and_the_caller_keeps_its_own(redis: Redis) -> None:
    await hold(redis, 5)
    old = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    assert (await publish(redis, old.token, 1, batch=2)).total_moved == 2  # type: ignore[attr-defined]
    await fencing.acquire_claim(redis, KEYS, "other", 60_000)  # takes over: the publish record is reset
    fenced = await publish(redis, old.token, 2)
    assert (fenced.status, fenced.total_moved) == (PublishStatus.FENCED, None)  # type: ignore[attr-defined]


async def test_a_record_written_before_the_count_existed_keeps_no_count(redis: Redis) -> None:
    """A resumption that spans the deploy: its record has no ``moved``; a count starting at 0 in
    the middle would be wrong, so none is reported and the workflow keeps counting itself."""
    await hold(redis, 5)
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    await redis.hset(KEYS.publish, mapping={"token": grant.token, "seq": 3, "result": "{}"})
    result = await publish(redis, grant.token, 4, batch=2)
    assert (result.status, result.moved, result.total_moved) == (PublishStatus.PUBLISHED, 2, None)  # type: ignore[attr-defined]
    assert not await redis.hexists(KEYS.publish, "moved")


async def test_every_claim_script_reads_before_it_writes(redis: Redis) -> None:
    """A key of the wrong type fails the call before its first write: Redis keeps a failed
    script's earlier writes."""
    await hold(redis, 2)
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    await redis.delete(KEYS.held)
    await redis.set(KEYS.held, "text")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await fencing.acquire_claim(redis, KEYS, "other", 60_000)
    assert await fencing.current_token(redis, KEYS) == grant.token  # not fenced by a failed claim
    assert (await fencing.claim_info(redis, KEYS))["owner"] == "me"
    await redis.delete(KEYS.state)
    await redis.hset(KEYS.state, "x", "y")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await fencing.release_claim(redis, KEYS, grant.token, back_to_paused=True)
    assert await fencing.current_token(redis, KEYS) == grant.token  # not revoked half way
    assert await redis.exists(KEYS.claim)
