"""Claims, fencing tokens, leases, pause state and the pause-aware enqueue, against a real redis-server."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from tests.support.helpers import (
    STREAM,
    fill_backlog,
    hold_tasks,
    resumption_worker,
    start,
    throttled,
    token_floor,
    wait_for,
)
from xmc_resumption.redisclient import deadletter, fencing, held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams, publish_batch
from xmc_resumption.redisclient.readings import MissingGroupPolicy
from xmc_resumption.redisclient.results import ExperimentState, PublishResult, PublishStatus, SetAsideStatus
from xmc_resumption.workflows.models import Outcome

KEYS = ExperimentKeys("xmc-tasks-stream", "E1")


def test_companion_keys_share_the_streams_cluster_slot() -> None:
    from redis.crc import key_slot

    slot = key_slot(KEYS.stream.encode())
    assert KEYS.state == "{xmc-tasks-stream}:experiment:E1:state"
    for key in (KEYS.state, KEYS.held, KEYS.claim, KEYS.fence):
        assert key_slot(key.encode()) == slot


@pytest.mark.parametrize("stream,experiment", [("", "E"), ("a{b}", "E"), ("s", "")])
def test_bad_key_parts_are_refused(stream: str, experiment: str) -> None:
    with pytest.raises(ValueError):
        ExperimentKeys(stream, experiment)


async def test_enqueue_follows_the_pause_state(redis: Redis) -> None:
    assert await held.get_state(redis, KEYS) is ExperimentState.RUNNING
    assert (await held.enqueue_task(redis, KEYS, {"task": "a"}))[0] == "stream"
    await held.pause(redis, KEYS)
    assert (await held.enqueue_task(redis, KEYS, {"task": "b"}))[0] == "held"
    await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    assert await held.get_state(redis, KEYS) is ExperimentState.RESUMING
    assert (await held.enqueue_task(redis, KEYS, {"task": "c"}))[0] == "held"
    assert [e[1] for e in await redis.xrange(KEYS.held)] == [{b"task": b"b"}, {b"task": b"c"}]
    assert [e[1] for e in await redis.xrange(KEYS.stream)] == [{b"task": b"a"}]


async def test_enqueue_keeps_field_maps_byte_for_byte(redis: Redis) -> None:
    await held.pause(redis, KEYS)
    task = {b"payload": bytes(range(256)), "unicode": "é✓", b"empty": b"", b"n": b"42"}
    await held.enqueue_task(redis, KEYS, task)
    [(_, fields)] = await redis.xrange(KEYS.held)
    assert fields == {b"payload": bytes(range(256)), b"unicode": "é✓".encode(), b"empty": b"", b"n": b"42"}


async def test_empty_task_is_refused(redis: Redis) -> None:
    with pytest.raises(ValueError, match="at least one field"):
        await held.enqueue_task(redis, KEYS, {})


async def test_newest_claim_wins_and_stale_tokens_are_fenced(redis: Redis) -> None:
    await held.pause(redis, KEYS)
    first = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    second = await fencing.acquire_claim(redis, KEYS, "b", 60_000)
    assert first.token < second.token
    old = await fencing.check_claim(redis, KEYS, first.token, "a", 60_000)
    assert old.fenced and old.current_token == second.token
    new = await fencing.check_claim(redis, KEYS, second.token, "b", 60_000)
    assert not new.fenced and new.state is ExperimentState.RESUMING
    assert not (await fencing.release_claim(redis, KEYS, first.token, back_to_paused=True)).token
    assert await held.get_state(redis, KEYS) is ExperimentState.RESUMING
    assert (await fencing.claim_info(redis, KEYS))["owner"] == "b"


async def test_check_extends_the_lease(redis: Redis) -> None:
    grant = await fencing.acquire_claim(redis, KEYS, "a", 1_000)
    assert 0 < await redis.pttl(KEYS.claim) <= 1_000
    await fencing.check_claim(redis, KEYS, grant.token, "a", 60_000)
    assert 59_000 < await redis.pttl(KEYS.claim) <= 60_000
    await fencing.check_claim(redis, KEYS, grant.token, "a", 20_000)  # the lease asked for, also a shorter one
    assert 19_000 < await redis.pttl(KEYS.claim) <= 20_000


async def test_lapsed_lease_is_reestablished_for_the_current_token(redis: Redis) -> None:
    grant = await fencing.acquire_claim(redis, KEYS, "a", 50)
    await asyncio.sleep(0.1)
    assert not await redis.exists(KEYS.claim)
    check = await fencing.check_claim(redis, KEYS, grant.token, "a", 60_000)
    assert not check.fenced and check.reestablished
    assert (await fencing.claim_info(redis, KEYS))["token"] == str(grant.token)
    assert 59_000 < await redis.pttl(KEYS.claim) <= 60_000  # taken again with the lease, not for ever


async def test_release_can_hand_the_experiment_back_as_paused(redis: Redis) -> None:
    await held.pause(redis, KEYS)
    grant = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    assert (await fencing.release_claim(redis, KEYS, grant.token, back_to_paused=True)).token == grant.token
    assert await held.get_state(redis, KEYS) is ExperimentState.PAUSED
    assert not await redis.exists(KEYS.claim)
    assert await fencing.current_token(redis, KEYS) == grant.token + 1  # the released token is revoked


async def test_a_released_token_is_fenced_for_good(redis: Redis) -> None:
    grant = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    await fencing.release_claim(redis, KEYS, grant.token, back_to_paused=False)
    check = await fencing.check_claim(redis, KEYS, grant.token, "a", 60_000)
    assert check.fenced and not check.reestablished
    assert not await redis.exists(KEYS.claim)
    again = await fencing.release_claim(redis, KEYS, grant.token, back_to_paused=False)
    assert (again.token, again.repeated) == (grant.token, True)  # its own release, recorded: nothing changes
    assert await fencing.current_token(redis, KEYS) == grant.token + 1


async def test_release_by_owner_when_the_token_is_unknown(redis: Redis) -> None:
    await held.pause(redis, KEYS)
    grant = await fencing.acquire_claim(redis, KEYS, "resumption-E1", 60_000)
    assert (await fencing.release_claim(redis, KEYS, 0, owner="someone-else", back_to_paused=True)).token == 0
    assert await held.get_state(redis, KEYS) is ExperimentState.RESUMING
    by_owner = await fencing.release_claim(redis, KEYS, 0, owner="resumption-E1", back_to_paused=True)
    assert by_owner.token == grant.token
    assert await held.get_state(redis, KEYS) is ExperimentState.PAUSED
    assert (await fencing.check_claim(redis, KEYS, grant.token, "resumption-E1", 60_000)).fenced


async def test_lease_below_one_ms_is_refused(redis: Redis) -> None:
    with pytest.raises(ValueError, match="lease"):
        await fencing.acquire_claim(redis, KEYS, "a", 0)


async def test_a_late_repeat_of_an_acquire_changes_nothing(redis: Redis) -> None:
    await held.pause(redis, KEYS)
    first = await fencing.acquire_claim(redis, KEYS, "a", 60_000, request_id="req-1")
    retry = await fencing.acquire_claim(redis, KEYS, "a", 60_000, request_id="req-1")
    assert (retry.token, retry.repeated) == (first.token, True)
    assert not (await fencing.check_claim(redis, KEYS, first.token, "a", 60_000)).fenced
    await fencing.release_claim(redis, KEYS, first.token, back_to_paused=True)
    late = await fencing.acquire_claim(redis, KEYS, "a", 60_000, request_id="req-1")  # after the run ended
    assert (late.token, late.repeated, late.state) == (first.token, True, ExperimentState.PAUSED)
    assert await held.get_state(redis, KEYS) is ExperimentState.PAUSED
    assert await fencing.current_token(redis, KEYS) == first.token + 1  # no new token was issued


async def test_acquire_resumes_held_tasks_whose_state_key_is_gone(redis: Redis) -> None:
    await held.pause(redis, KEYS)
    for name in (b"h0", b"h1"):
        await held.enqueue_task(redis, KEYS, {b"task": name})
    await redis.delete(KEYS.state)  # evicted or deleted by hand
    grant = await fencing.acquire_claim(redis, KEYS, "a", 60_000)
    assert (grant.state, grant.held) == (ExperimentState.RESUMING, 2)
    assert (await held.enqueue_task(redis, KEYS, {b"task": b"new"}))[0] == "held"  # queued behind h0, h1


def publish(redis: Redis, token: int, seq: int = 1) -> Awaitable[PublishResult]:
    """A publish of up to 10 tasks on a stream no group reads yet: the ``zero`` policy counts the
    stream's entries as the backlog (threshold 100), so the tokens alone decide the status."""
    return publish_batch(
        redis,
        KEYS,
        "g",
        PublishParams(
            token=token,
            seq=seq,
            batch_size=10,
            threshold=100,
            owner="me",
            lease_ms=60_000,
            missing_group=MissingGroupPolicy.ZERO,
        ),
    )


@pytest.mark.parametrize(
    "counter", [8, 9, 92, 93, 98, 99, 922, 923, 998, 999, 9_999, 10**18 - 1, fencing.MAX_TOKEN - 2]
)
async def test_tokens_compare_as_integers_whatever_their_length(redis: Redis, counter: int) -> None:
    """Tokens are integers, never text, in the scripts and in Python: compared as text, a counter
    at 93..99 or 923..999 reads as exhausted (past 9223372036854775806) and can never be claimed
    again, and token 9 against counter 10 reads as data loss (fence_lost) instead of a takeover.
    (A claim takes the clock's floor when the counter is below it, so the run's token is set as the
    counter's next value here: a replay that claimed before tokens had a floor holds such a token.)"""
    await held.pause(redis, KEYS)
    for i in range(3):
        await held.enqueue_task(redis, KEYS, {"task": f"t{i}"})
    await redis.set(KEYS.fence, counter)
    stale = counter  # as if a replay held the counter's token when a newer claim came
    before = await token_floor(redis)
    claimed = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    if counter + 1 > before:
        assert claimed.token == counter + 1
    else:
        assert before <= claimed.token <= await token_floor(redis)
    await redis.set(KEYS.fence, counter + 1)
    grant = claimed.model_copy(update={"token": counter + 1})
    current = await fencing.check_claim(redis, KEYS, grant.token, "me", 60_000)
    assert (current.fenced, current.fence_lost, current.current_token) == (False, False, counter + 1)
    older = await fencing.check_claim(redis, KEYS, stale, "old", 60_000)
    assert (older.fenced, older.fence_lost) == (True, False)
    assert (await publish(redis, stale)).status is PublishStatus.FENCED
    first = await redis.xadd(KEYS.held, {"f": "v"})  # an entry to set aside (the last one)
    assert (await deadletter.set_aside(redis, KEYS, stale, first.decode())).status is SetAsideStatus.FENCED
    ahead = await fencing.check_claim(redis, KEYS, counter + 5, "lost", 60_000)
    assert (ahead.fenced, ahead.fence_lost) == (False, True)  # a counter below the token: Redis lost data
    assert (await publish(redis, counter + 5)).status is PublishStatus.FENCE_LOST
    moved = await publish(redis, grant.token)
    assert (moved.status, moved.moved) == (PublishStatus.COMPLETED, 4)
    assert (await fencing.release_claim(redis, KEYS, stale, owner="old", back_to_paused=False)).token == 0
    released = await fencing.release_claim(redis, KEYS, grant.token, owner="me", back_to_paused=False)
    assert released.token == grant.token
    assert await fencing.current_token(redis, KEYS) == counter + 2


@pytest.mark.parametrize("raw", ["-1", "007", "ten", "1.5", "9223372036854775808", " 1"])
async def test_a_fence_counter_that_is_no_token_is_refused_alike_in_lua_and_python(redis: Redis, raw: str) -> None:
    await held.pause(redis, KEYS)
    await held.enqueue_task(redis, KEYS, {"task": "t"})
    await redis.set(KEYS.fence, raw)
    with pytest.raises(ResponseError, match=f"XMCCORRUPT {re.escape(KEYS.fence)} holds"):
        await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    with pytest.raises(ValueError, match=f"{re.escape(KEYS.fence)} holds .*, not a fencing token"):
        await fencing.current_token(redis, KEYS)
    entry = (await redis.xrange(KEYS.held))[0][0].decode()
    with pytest.raises(ValueError, match="not a fencing token"):
        await deadletter.set_aside(redis, KEYS, 1, entry)
    assert await redis.xlen(KEYS.held) == 1 and await redis.xlen(KEYS.dead) == 0


async def test_a_replay_whose_token_a_newer_claim_passes_ends_fenced(
    temporal_env, redis, redis_url, task_queue
) -> None:
    """A run holding its token when a newer claim takes the next: outcome ``fenced`` (a takeover),
    not ``fence_lost`` (data loss), and it publishes nothing more. (Tokens of different lengths:
    ``test_tokens_compare_as_integers_whatever_their_length``.)"""
    e = "E9to10"
    await hold_tasks(redis, e, 10)
    await fill_backlog(redis, 5)
    keys = ExperimentKeys(STREAM, e)
    async with resumption_worker(temporal_env.client, task_queue, redis_url):
        handle = await start(temporal_env.client, task_queue, experiment_id=e, max_backlog_threshold=5)
        progress = await wait_for(handle, throttled)
        newer = await fencing.acquire_claim(redis, keys, "someone-else", 60_000)
        await temporal_env.sleep(15)  # past the throttle wait: the next check sees the newer token
        result = await handle.result()
    assert 0 < progress.token < newer.token
    assert (result.outcome, result.token, result.replayed) == (Outcome.FENCED, progress.token, 0)
    assert await redis.xlen(keys.held) == 10
