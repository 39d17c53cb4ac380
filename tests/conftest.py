"""Fixtures: a real redis-server per session on a free loopback port, and real Temporal servers
(the time-skipping test server and the dev server) from the installed binaries, never downloaded."""

from __future__ import annotations

import gc
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from redis.asyncio import Redis
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from xmc_resumption import search_attributes
from xmc_resumption.services import installed_binary, local_redis
from xmc_resumption.workflows import fleet


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a redis-server started for this test session (no persistence)."""
    with local_redis(log_file=tmp_path_factory.mktemp("redis") / "redis.log") as url:
        yield url


@pytest_asyncio.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """A bytes client on an emptied database."""
    client = Redis.from_url(redis_url, decode_responses=False)
    await client.flushall()
    yield client
    await client.aclose()


@pytest_asyncio.fixture(scope="session")
async def ts_env() -> AsyncIterator[WorkflowEnvironment]:
    """Temporal's time-skipping test server, for workflow logic."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=installed_binary("temporal-test-server"),
        data_converter=pydantic_data_converter,
    )
    await search_attributes.register(env.client)  # the fleet view's (no start flag for this server)
    yield env
    await env.shutdown()


@pytest_asyncio.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """Temporal's dev server (real time, the real server's continue-as-new and child workflows)."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=installed_binary("temporal"),
        data_converter=pydantic_data_converter,
        ip="127.0.0.1",
        dev_server_log_level="error",
        dev_server_extra_args=["--dynamic-config-value", 'history.workflowIdReuseMinimalInterval="0s"'],
        search_attributes=fleet.ALL,
    )
    yield env
    await env.shutdown()


@pytest.fixture
def task_queue() -> str:
    """A task queue of its own for each test, so workers of different tests never mix."""
    return f"xmc-test-{uuid.uuid4().hex[:8]}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # sdk-python#300: collecting the SDK's objects before exit avoids an abort (docs/development.md, "Temporal facts")
    gc.collect()
