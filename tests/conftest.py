"""Fixtures: a real redis-server per session on a free loopback port, and one Temporal environment
fixture, ``temporal_env``: the time-skipping test server or the dev server from the installed
binaries (never downloaded), chosen by ``--workflow-environment`` and the ``real_server`` marker."""

from __future__ import annotations

import fcntl
import gc
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from redis.asyncio import Redis
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import open_workflows
from xmc_resumption import search_attributes
from xmc_resumption.services import installed_binary, local_redis
from xmc_resumption.workflows import fleet

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # pytest started in the background by a non-interactive shell (`.ci/run &`: bash ignores SIGINT for it): every
    # process the tests start would inherit the ignore, and the Ctrl-C tests' commands would never see theirs
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # every real_server test takes seconds: its file marks it slow too, where a reader sees it
    unmarked = [i.nodeid for i in items if i.get_closest_marker("real_server") and not i.get_closest_marker("slow")]
    if unmarked:
        raise pytest.UsageError(f"marked real_server but not slow: {', '.join(unmarked)}")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: takes seconds, starts the dev server or runs processes end to end; make test-fast leaves them out "
        "(every real_server test is marked slow as well)",
    )
    config.addinivalue_line(
        "markers",
        "real_server: needs a real Temporal server (real time, reset, continue-as-new chains, child workflows, the "
        "temporal CLI): runs on the dev server, or on --workflow-environment HOST:PORT",
    )
    config.addinivalue_line(
        "markers",
        "heavy: an end-to-end run with servers and worker processes of its own, or a measurement of latencies: "
        "runs while no other heavy test runs, whatever make test's process (one_heavy_test_at_a_time)",
    )


@pytest.fixture(autouse=True)
def one_heavy_test_at_a_time(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A test marked ``heavy`` holds a lock shared by make test's processes (pytest-xdist) while it runs.

    The lock is a file beside the processes' temporary directories (their common parent, the run's
    own). Heavy tests take about 130 s in all: a wait stays well within the 300 s timeout.
    """
    if request.node.get_closest_marker("heavy") is None or "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    with open(tmp_path_factory.getbasetemp().parent / "heavy.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


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

    async def discard(self, kind: str) -> None:
        """Shut the ``kind`` environment down; the next test that asks for it gets a new one."""
        await self._started.pop(kind).shutdown()

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
async def temporal_env(
    request: pytest.FixtureRequest, environments: Environments
) -> AsyncIterator[WorkflowEnvironment]:
    """The test's Temporal environment: ``--workflow-environment``'s, or the dev server for a test
    marked ``real_server`` (``Environments.kind``).

    A test on the time-skipping server must end every workflow it starts while its worker runs. The
    server skips time for nobody while any workflow or activity task is scheduled and not completed
    (one time lock for the whole server, Temporal's Java test server): a workflow left open once
    its worker stopped holds the clock, for good (terminating it does not free it), as soon as it
    has a task to run, and every later test's timers then take real time. Such a test errors here,
    naming the workflows, and the next test gets a new server.
    """
    kind = environments.kind(request.node.get_closest_marker("real_server") is not None)
    env = await environments.get(kind)
    yield env
    if kind == TIME_SKIPPING and (left := await open_workflows(env.client)):
        await environments.discard(kind)
        pytest.fail(f"left open on the time-skipping server (they would hold its clock): {', '.join(left)}")


@pytest.fixture
def task_queue() -> str:
    """A task queue of its own for each test, so workers of different tests never mix."""
    return f"xmc-test-{uuid.uuid4().hex[:8]}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # sdk-python#300: collecting the SDK's objects before exit avoids an abort (docs/development.md, "Temporal facts")
    gc.collect()
