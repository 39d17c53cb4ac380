"""Issue 9, item 2 (Redis): ``rediss://`` with the CA, client certificate and key from the
settings. A redis-server that speaks only TLS, requires a client certificate and enforces the
project's ACL; certificates made by the test. The Redis layer, the CLI and one replay run through
it; a wrong CA and TLS settings that cannot work are one line naming the setting, no secret."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from pydantic import ValidationError
from redis.asyncio import Redis
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.support.helpers import GROUP, RUNNER, STREAM, run_module, start
from tests.support.secure import ACL_FILE, ACL_USER, SECRET, Certificates, make_certificates, tls_redis
from xmc_resumption.activities.resumption import ResumptionActivities
from xmc_resumption.errors import validation_message
from xmc_resumption.redisclient import fencing, held
from xmc_resumption.redisclient.keys import ExperimentKeys
from xmc_resumption.services import installed_binary
from xmc_resumption.settings import Settings
from xmc_resumption.workflows.resumption import ResumptionWorkflow


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def admin_command(certs: Certificates, port: int, *args: str) -> None:
    """Run one command as the TLS server's default user (``redis-cli``): what the ACL user may not do."""
    cli = [installed_binary("redis-cli"), "--tls", "--cacert", str(certs.ca), "--cert", str(certs.client_cert),
           "--key", str(certs.client_key), "-p", str(port)]  # fmt: skip
    subprocess.run([*cli, *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def tls_port(certs: Certificates) -> Iterator[int]:
    """A TLS-only redis-server with the project's ACL; its ACL user switched on with ``SECRET``."""
    with tls_redis(certs, "--aclfile", str(ACL_FILE)) as port:
        admin_command(certs, port, "ACL", "SETUSER", ACL_USER, "on", f">{SECRET}")
        yield port


def tls_env(certs: Certificates, port: int, ca: Path | None = None) -> dict[str, str]:
    """The environment of a worker or CLI that reaches the TLS server as the ACL user."""
    return {
        "XMC_REDIS_URL": f"rediss://{ACL_USER}:{SECRET}@127.0.0.1:{port}/0",
        "XMC_REDIS_TLS_CA_FILE": str(ca or certs.ca),
        "XMC_REDIS_TLS_CERT_FILE": str(certs.client_cert),
        "XMC_REDIS_TLS_KEY_FILE": str(certs.client_key),
    }


def settings_of(env: dict[str, str]) -> Settings:
    """``Settings`` as the worker reads them from ``env`` (the ``XMC_*`` variables)."""
    return Settings(**{name.removeprefix("XMC_").lower(): value for name, value in env.items()})


@pytest_asyncio.fixture
async def tls_client(certs: Certificates, tls_port: int) -> AsyncIterator[Redis]:
    """The ACL user's client through TLS, as ``Settings.redis()`` builds it, on an emptied stream."""
    client = settings_of(tls_env(certs, tls_port)).redis()
    await client.delete(STREAM)
    yield client
    await client.aclose()


async def test_the_redis_layer_and_a_replay_through_tls(
    tls_client: Redis, certs: Certificates, tls_port: int, temporal_env: WorkflowEnvironment, task_queue: str
) -> None:
    keys = ExperimentKeys(STREAM, "T1")
    await held.pause(tls_client, keys)
    for i in range(25):
        await held.enqueue_task(tls_client, keys, {"task": f"t{i}"})
    assert await held.held_count(tls_client, keys) == 25
    assert (await fencing.claim_info(tls_client, keys)) == {}
    admin_command(certs, tls_port, "XGROUP", "CREATE", STREAM, GROUP, "$", "MKSTREAM")  # the replay waits for it
    async with Worker(
        temporal_env.client,
        task_queue=task_queue,
        workflows=[ResumptionWorkflow],
        activities=ResumptionActivities(tls_client).all(),
        workflow_runner=RUNNER,
    ):
        handle = await start(temporal_env.client, task_queue, experiment_id="T1", batch_size=10)
        result = await handle.result()
    assert (result.outcome.value, result.replayed) == ("completed", 25)
    assert [f[b"task"] for _, f in await tls_client.xrange(STREAM)] == [f"t{i}".encode() for i in range(25)]
    assert tls_client.connection_pool.connection_class.__name__ == "SSLConnection"


def test_the_cli_reads_the_tls_settings(certs: Certificates, tls_port: int) -> None:
    env = tls_env(certs, tls_port)
    for args in (["pause", "T2"], ["enqueue", "T2", "--count", "3"], ["status", "T2", "--json"]):
        proc = run_module("xmc_resumption", *args, **env)
        assert proc.returncode == 0, proc.stderr
    assert '"held": 3' in proc.stdout and SECRET not in proc.stdout + proc.stderr


def test_a_wrong_ca_is_one_line_naming_the_setting(certs: Certificates, tls_port: int) -> None:
    proc = run_module("xmc_resumption", "status", "T3", **tls_env(certs, tls_port, ca=certs.other_ca))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith(f"xmc status: the Redis at rediss://{ACL_USER}:***@127.0.0.1:{tls_port}/0 presented a")
    assert "XMC_REDIS_TLS_CA_FILE" in line and "CERTIFICATE_VERIFY_FAILED" in line
    assert SECRET not in line and "BEGIN" not in line


def test_the_worker_refuses_to_start_with_a_wrong_ca(certs: Certificates, tls_port: int) -> None:
    """A certificate that does not verify is a setting to mend, not an outage to wait out."""
    proc = run_module("xmc_resumption.worker", **tls_env(certs, tls_port, ca=certs.other_ca))
    assert proc.returncode == 2, proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("worker: ")]
    assert "presented a certificate that XMC_REDIS_TLS_CA_FILE" in line and SECRET not in proc.stderr


def test_without_a_client_certificate_the_server_refuses(certs: Certificates, tls_port: int) -> None:
    env = tls_env(certs, tls_port)
    del env["XMC_REDIS_TLS_CERT_FILE"], env["XMC_REDIS_TLS_KEY_FILE"]
    proc = run_module("xmc_resumption", "status", "T4", **env)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"rediss://{ACL_USER}:***@127.0.0.1:{tls_port}/0" in proc.stderr and SECRET not in proc.stderr


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"XMC_REDIS_URL": f"redis://u:{SECRET}@127.0.0.1:1/0"},
            "XMC_REDIS_TLS_CA_FILE: needs a rediss:// XMC_REDIS_URL",
        ),
        ({"XMC_REDIS_TLS_CA_FILE": "/nonexistent/ca.pem"}, "XMC_REDIS_TLS_CA_FILE: no such file: /nonexistent/ca.pem"),
        ({"XMC_REDIS_TLS_KEY_FILE": ""}, "XMC_REDIS_TLS_CERT_FILE and XMC_REDIS_TLS_KEY_FILE go together"),
    ],
)
def test_tls_settings_that_cannot_work_are_refused(certs: Certificates, change: dict[str, str], expected: str) -> None:
    env = {**tls_env(certs, 1), **change}
    with pytest.raises(ValidationError) as err:
        settings_of(env)
    message = validation_message(err.value)
    assert message.startswith("invalid setting: ") and expected in message, message
    assert SECRET not in message and "BEGIN" not in message


def test_no_tls_keywords_without_rediss() -> None:
    assert Settings(redis_url="redis://127.0.0.1:6379/0").redis_tls_kwargs() == {}
    assert Settings(redis_url="rediss://127.0.0.1:6379/0").redis_tls_kwargs() == {"ssl_cert_reqs": "required"}
