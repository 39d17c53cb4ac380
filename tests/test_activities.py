"""The activities' error classification, with real Redis error replies (SDK ActivityEnvironment)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError
from redis.exceptions import TimeoutError as RedisTimeoutError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from xmc_resumption.activities.errors import NON_RETRYABLE_ERROR_TYPES
from xmc_resumption.activities.requests import (
    AcquireRequest,
    CheckRequest,
    DrainWaitRequest,
    ExperimentRef,
    PublishRequest,
    ReleaseRequest,
)
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.redisclient.publish import PublishParams
from xmc_resumption.services import free_port

REF = ExperimentRef(experiment_id="E1", stream="xmc-tasks-stream", consumer_group="xmc-workers")


def drain(ref: ExperimentRef, **kw: Any) -> DrainWaitRequest:
    """A short poll of ``ref``'s backlog (the activity that measures it)."""
    return DrainWaitRequest(ref=ref, threshold=5, low_watermark=0, min_seconds=0, max_seconds=1, poll_seconds=0.1, **kw)


KEYS = ExperimentKeys(REF.stream, REF.experiment_id)


async def test_a_wrong_type_is_not_retried(redis: Redis) -> None:
    await redis.set(REF.stream, "oops")
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(ResumptionActivities(redis).wait_for_drain, drain(REF))
    assert (err.value.type, err.value.non_retryable) == ("RedisWrongType", True)


async def test_an_error_reply_that_repeats_is_not_retried(redis: Redis) -> None:
    await redis.set(KEYS.fence, "not a number")
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            ResumptionActivities(redis).acquire_claim,
            AcquireRequest(ref=REF, owner="me", lease_ms=1000, request_id="r1"),
        )
    assert (err.value.type, err.value.non_retryable) == ("RedisCommandError", True)
    # the message names the key and what it holds, not a script hash and a line
    assert 'XMCCORRUPT {xmc-tasks-stream}:experiment:E1:fence holds "not a number", not a fencing token' in str(
        err.value
    )
    assert "script:" not in str(err.value) and "user_script" not in str(err.value)
    assert err.value.type in NON_RETRYABLE_ERROR_TYPES


async def test_out_of_memory_is_retried(redis: Redis) -> None:
    await held.pause(redis, KEYS)
    await held.enqueue_task(redis, KEYS, {"task": "t1"})
    grant = await fencing.acquire_claim(redis, KEYS, "me", 60_000)
    await redis.config_set("maxmemory", "1")
    try:
        with pytest.raises(OutOfMemoryError):  # raised as is: Temporal's retry policy retries it
            await ActivityEnvironment().run(
                ResumptionActivities(redis).publish_rounds,
                PublishRequest(
                    ref=REF,
                    params=PublishParams(
                        token=grant.token,
                        seq=1,
                        batch_size=5,
                        threshold=5,
                        owner="me",
                        lease_ms=1000,
                        missing_group="zero",
                    ),
                ),
            )
    finally:
        await redis.config_set("maxmemory", "0")
    assert await redis.xlen(KEYS.held) == 1 and not await redis.exists(KEYS.stream)


async def test_a_missing_group_under_the_error_policy_is_not_retried(redis: Redis) -> None:
    await redis.xadd(REF.stream, {"task": "t1"})
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(ResumptionActivities(redis).wait_for_drain, drain(REF, missing_group="error"))
    assert (err.value.type, err.value.non_retryable) == ("MissingConsumerGroup", True)


CALLS: dict[str, Callable[[ResumptionActivities], Any]] = {
    "acquire_claim": lambda a: a.acquire_claim(AcquireRequest(ref=REF, owner="me", lease_ms=1000, request_id="r1")),
    "check_claim": lambda a: a.check_claim(CheckRequest(ref=REF, token=1, owner="me", lease_ms=1000)),
    "wait_for_drain": lambda a: a.wait_for_drain(drain(REF)),
    "publish_rounds": lambda a: a.publish_rounds(
        PublishRequest(
            ref=REF, params=PublishParams(token=1, seq=1, batch_size=5, threshold=5, owner="me", lease_ms=1000)
        )
    ),
    "release_claim": lambda a: a.release_claim(ReleaseRequest(ref=REF, token=1, owner="me")),
}


NO_CLIENT_RETRY = Retry(NoBackoff(), 0)
"""redis-py's own retries (seconds of backoff) are beside the point: what the activity raises is."""


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    """A port whose connections the kernel accepts and nobody ever answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        yield silent.getsockname()[1]


@pytest.mark.parametrize("name", CALLS)
async def test_a_refused_connection_is_retried(name: str) -> None:
    """Redis down (nothing listens): every activity raises redis' ConnectionError as is, which
    Temporal's retry policy retries, never a non-retryable ApplicationError."""
    client = Redis(port=free_port(), socket_connect_timeout=0.5, retry=NO_CLIENT_RETRY)
    try:
        with pytest.raises(RedisConnectionError):  # raised as is: retried
            await ActivityEnvironment().run(CALLS[name], ResumptionActivities(client))
    finally:
        await client.aclose()


@pytest.mark.parametrize("name", CALLS)
async def test_a_timeout_is_retried(name: str, silent_port: int) -> None:
    client = Redis(port=silent_port, socket_connect_timeout=0.2, socket_timeout=0.2, retry=NO_CLIENT_RETRY)
    try:
        with pytest.raises(RedisTimeoutError):  # raised as is: retried
            await ActivityEnvironment().run(CALLS[name], ResumptionActivities(client))
    finally:
        await client.aclose()
