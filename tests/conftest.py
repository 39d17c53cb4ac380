"""Fixtures: a real redis-server per session on a free loopback port, and one Temporal environment
fixture, ``temporal_env``: the time-skipping test server or the dev server from the installed
binaries (never downloaded), chosen by ``--workflow-environment`` and the ``real_server`` marker."""

from __future__ import annotations

import gc
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from redis.asyncio import Redis
from temporalio.client import Client
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


TIME_SKIPPING, LOCAL = "time-skipping", "local"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--workflow-environment",
        default=TIME_SKIPPING,
        help="where the workflow-logic tests run: time-skipping (default: Temporal's test server), local (the dev "
        "server, real time), or HOST:PORT of a running server; tests marked real_server run on the dev server "
        "unless an address is given",
    )


SLOW = (
    "tests/test_chaos.py",  # crashes of the worker, Redis and Temporal: about 50 s
    "tests/test_bench_smoke.py",  # the benchmarks' smoke run
    "tests/test_demo_signals.py",  # make demo and xmc demo, stopped by signals
    "tests/test_names.py::test_hostile_names_are_refused_everywhere[cli]",  # one xmc process per name
    "tests/test_waits.py::test_stopped_consumers_under_the_shortest_max_wait_do_not_spin",  # a 6 s window
)
"""Tests marked ``slow`` besides every ``real_server`` test (node ID prefixes; each takes seconds)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("real_server") is not None or item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: takes seconds (every real_server test and conftest.SLOW); make test-fast leaves them out",
    )
    config.addinivalue_line(
        "markers",
        "real_server: needs a real Temporal server (real time, reset, continue-as-new chains, child workflows, the "
        "temporal CLI): runs on the dev server, or on --workflow-environment HOST:PORT",
    )


class Environments:
    """The Temporal environments of a session, started at first use and shut down at its end."""

    def __init__(self, option: str) -> None:
        self.option = option
        self._started: dict[str, WorkflowEnvironment] = {}

    def kind(self, real_server: bool) -> str:
        """The environment a test gets: the option's, but the dev server for a ``real_server`` test
        where the option names the time-skipping server."""
        return LOCAL if real_server and self.option == TIME_SKIPPING else self.option

    async def get(self, kind: str) -> WorkflowEnvironment:
        if kind not in self._started:
            self._started[kind] = await self._start(kind)
        return self._started[kind]

    @staticmethod
    async def _start(kind: str) -> WorkflowEnvironment:
        if kind == TIME_SKIPPING:
            env = await WorkflowEnvironment.start_time_skipping(
                test_server_existing_path=installed_binary("temporal-test-server"),
                data_converter=pydantic_data_converter,
            )
            await search_attributes.register(env.client)  # the fleet view's (no start flag for this server)
            return env
        if kind == LOCAL:
            return await WorkflowEnvironment.start_local(
                dev_server_existing_path=installed_binary("temporal"),
                data_converter=pydantic_data_converter,
                ip="127.0.0.1",
                dev_server_log_level="error",
                dev_server_extra_args=[
                    *("--dynamic-config-value", 'history.workflowIdReuseMinimalInterval="0s"'),
                    # a Worker Deployment Version reports drained within seconds, not 3 min (test_versioning.py)
                    *("--dynamic-config-value", 'matching.wv.VersionDrainageStatusRefreshInterval="1s"'),
                    *("--dynamic-config-value", 'matching.wv.VersionDrainageStatusVisibilityGracePeriod="1s"'),
                ],
                search_attributes=fleet.ALL,
            )
        client = await Client.connect(kind, data_converter=pydantic_data_converter)
        await search_attributes.register(client)
        return WorkflowEnvironment.from_client(client)

    async def shutdown(self) -> None:
        for env in self._started.values():
            await env.shutdown()


@pytest_asyncio.fixture(scope="session")
async def environments(request: pytest.FixtureRequest) -> AsyncIterator[Environments]:
    """The session's Temporal environments (``Environments``)."""
    envs = Environments(request.config.getoption("--workflow-environment"))
    yield envs
    await envs.shutdown()


@pytest_asyncio.fixture
async def temporal_env(request: pytest.FixtureRequest, environments: Environments) -> WorkflowEnvironment:
    """The test's Temporal environment: ``--workflow-environment``'s, or the dev server for a test
    marked ``real_server`` (``Environments.kind``)."""
    return await environments.get(environments.kind(request.node.get_closest_marker("real_server") is not None))


@pytest_asyncio.fixture
async def own_clock_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of the test's own, for a test whose timers must skip whatever the
    session's earlier tests left running there (the session's clock was seen held by one of them)."""
    env = await Environments._start(TIME_SKIPPING)
    yield env
    await env.shutdown()


@pytest.fixture
def task_queue() -> str:
    """A task queue of its own for each test, so workers of different tests never mix."""
    return f"xmc-test-{uuid.uuid4().hex[:8]}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # sdk-python#300: collecting the SDK's objects before exit avoids an abort (docs/development.md, "Temporal facts")
    gc.collect()
