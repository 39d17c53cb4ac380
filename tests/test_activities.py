"""The activities' error classification, with real Redis error replies (SDK ActivityEnvironment)."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.errors import NON_RETRYABLE_ERROR_TYPES
from activities.requests import AcquireRequest, BacklogRequest, ExperimentRef, PublishRequest
from activities.resumption import ResumptionActivities
from redisclient import fencing, held
from redisclient.keys import ExperimentKeys

REF = ExperimentRef(experiment_id="E1", stream="xmc-tasks-stream", consumer_group="xmc-workers")
KEYS = ExperimentKeys(REF.stream, REF.experiment_id)


async def test_a_wrong_type_is_not_retried(redis: Redis) -> None:
    await redis.set(REF.stream, "oops")
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            ResumptionActivities(redis).measure_backlog, BacklogRequest(ref=REF, threshold=5)
        )
    assert (err.value.type, err.value.non_retryable) == ("RedisWrongType", True)


async def test_an_error_reply_that_repeats_is_not_retried(redis: Redis) -> None:
    await redis.set(KEYS.fence, "not a number")
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            ResumptionActivities(redis).acquire_claim,
            AcquireRequest(ref=REF, owner="me", lease_ms=1000, request_id="r1"),
        )
    assert (err.value.type, err.value.non_retryable) == ("RedisCommandError", True)
    assert "not an integer" in str(err.value)
    assert err.value.type in NON_RETRYABLE_ERROR_TYPES


async def test_out_of_memory_is_retried(redis: Redis) -> None:
    await held.pause(redis, KEYS)
    await held.enqueue_task(redis, KEYS, {"task": "t1"})
    await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    await redis.config_set("maxmemory", "1")
    try:
        with pytest.raises(OutOfMemoryError):  # raised as is: Temporal's retry policy retries it
            await ActivityEnvironment().run(
                ResumptionActivities(redis).publish_batch,
                PublishRequest(ref=REF, token=1, seq=1, batch_size=5, threshold=5, owner="me", lease_ms=1000),
            )
    finally:
        await redis.config_set("maxmemory", "0")
    assert await redis.xlen(KEYS.held) == 1 and not await redis.exists(KEYS.stream)


async def test_a_missing_group_under_the_error_policy_is_not_retried(redis: Redis) -> None:
    await redis.xadd(REF.stream, {"task": "t1"})
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            ResumptionActivities(redis).measure_backlog,
            BacklogRequest(ref=REF, threshold=5, missing_group="error"),
        )
    assert (err.value.type, err.value.non_retryable) == ("MissingConsumerGroup", True)
