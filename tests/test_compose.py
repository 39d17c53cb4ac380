"""docker-compose.yml against what the worker reads, and its servers' flags run for real.

No Docker engine runs here (nor in CI), so the file is parsed: the worker's variables are the
``Settings`` fields' names and validate as settings, the addresses and the published ports match
the services' own flags, Redis keeps its data (AOF) and never evicts, every long-running service
has a healthcheck and a restart policy. Then the Redis and Temporal commands of the file run on the
installed ``redis-server`` and ``temporal`` binaries (the image's own tag is the same CLI version):
the flags are accepted, a Redis restart keeps what was written, and the search attributes are
registered.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from redis import Redis

from xmc_resumption import search_attributes
from xmc_resumption.services import free_port, installed_binary, stop_process, wait_for_port, wait_until_serving
from xmc_resumption.settings import Settings
from xmc_resumption.worker import SHUTDOWN_LIMIT_SECONDS

COMPOSE = Path(__file__).resolve().parent.parent / "docker-compose.yml"
LONG_RUNNING = ("redis", "temporal", "worker")

SEARCH_ATTRIBUTES = dict(
    arg.split("=", 1) for arg in search_attributes.dev_server_args() if arg != "--search-attribute"
)
"""The custom search attributes the workflow upserts (the fleet view): the compose Temporal must
register every one, or the first upsert fails the workflow task over and over."""


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict[str, Any]:
    return compose["services"]


def _flag(command: list[str], name: str, default: str | None = None) -> str | None:
    """The value following ``name`` in ``command`` (the last one when repeated), else ``default``."""
    values = [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == name]
    return values[-1] if values else default


def _flags(command: list[str], name: str) -> list[str]:
    return [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == name]


def _published(service: dict[str, Any]) -> dict[int, int]:
    """Container port -> host port, from ``ports: ["HOST:CONTAINER", ...]``."""
    pairs = (str(p).rsplit(":", 2)[-2:] for p in service.get("ports", []))
    return {int(container): int(host) for host, container in pairs}


def _settings_env_names() -> set[str]:
    prefix = Settings.model_config.get("env_prefix", "")
    return {f"{prefix}{name}".upper() for name in Settings.model_fields}


def test_the_worker_reads_every_variable_it_is_given_and_they_validate(services, monkeypatch) -> None:
    env = {k: str(v) for k, v in services["worker"]["environment"].items()}
    xmc = {k for k in env if k.startswith("XMC_")}
    assert xmc <= _settings_env_names(), xmc - _settings_env_names()
    assert set(env) - xmc == {"TEMPORAL_ADDRESS"}  # read by the SDK's envconfig
    for name in _settings_env_names():
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()  # raises on a value the worker would refuse
    assert settings.log_format == "json"
    assert settings.metrics_bind is not None


def test_the_worker_addresses_match_the_services(services) -> None:
    env = services["worker"]["environment"]
    temporal = services["temporal"]["command"]
    host, port = env["TEMPORAL_ADDRESS"].rsplit(":", 1)
    assert (host, port) == ("temporal", _flag(temporal, "--port", "7233"))
    assert _flag(temporal, "--ip") == "0.0.0.0"  # reachable from the worker's container
    redis = urlsplit(env["XMC_REDIS_URL"])
    assert (redis.hostname, str(redis.port)) == ("redis", _flag(services["redis"]["command"], "--port", "6379"))


def test_published_ports(services) -> None:
    bind_host, metrics_port = Settings(
        metrics_bind=services["worker"]["environment"]["XMC_METRICS_BIND"]
    ).metrics_bind.rsplit(":", 1)  # type: ignore[union-attr]
    assert bind_host == "0.0.0.0"  # a loopback bind inside the container is unreachable from outside
    assert _published(services["worker"]) == {int(metrics_port): int(metrics_port)}
    temporal = services["temporal"]["command"]
    frontend, ui = int(_flag(temporal, "--port", "7233")), int(_flag(temporal, "--ui-port", "8233"))  # type: ignore[arg-type]
    assert _published(services["temporal"]) == {frontend: frontend, ui: ui}
    assert _published(services["redis"]) == {6379: 6379}


def test_redis_keeps_its_data_and_never_evicts(compose, services) -> None:
    redis = services["redis"]
    command = redis["command"]
    assert command[0] == "redis-server"
    assert _flag(command, "--appendonly") == "yes"
    assert _flag(command, "--appendfsync") in ("everysec", "always")
    assert _flag(command, "--maxmemory-policy") == "noeviction"
    (volume,) = redis["volumes"]
    name, path = volume.split(":")
    assert path == "/data" and name in compose["volumes"]  # a named volume on the image's data directory


def test_temporal_data_is_a_volume_the_server_user_can_write(compose, services) -> None:
    temporal, owner = services["temporal"], services["temporal-data-owner"]
    db = Path(_flag(temporal["command"], "--db-filename") or "")
    (volume,) = temporal["volumes"]
    name, path = volume.split(":")
    assert name in compose["volumes"] and db.parent == Path(path)
    assert owner["volumes"] == [volume]
    assert owner["entrypoint"] == ["chown", temporal["user"], path]
    assert temporal["depends_on"] == {"temporal-data-owner": {"condition": "service_completed_successfully"}}


def test_healthchecks_dependencies_and_restart(services) -> None:
    for name in LONG_RUNNING:
        assert services[name]["restart"] == "unless-stopped", name
        assert services[name]["healthcheck"]["test"], name
    assert "redis-cli ping" in services["redis"]["healthcheck"]["test"][1]
    port = _flag(services["temporal"]["command"], "--port", "7233")
    assert services["temporal"]["healthcheck"]["test"] == [
        "CMD", "/temporal", "operator", "cluster", "health", "--address", f"127.0.0.1:{port}",
    ]  # fmt: skip
    metrics_port = services["worker"]["environment"]["XMC_METRICS_BIND"].rsplit(":", 1)[1]
    assert f"127.0.0.1:{metrics_port}/metrics" in services["worker"]["healthcheck"]["test"][-1]
    assert services["worker"]["depends_on"] == {
        "redis": {"condition": "service_healthy"},
        "temporal": {"condition": "service_healthy"},
    }
    grace = services["worker"]["stop_grace_period"]
    assert grace.endswith("s") and float(grace[:-1]) > SHUTDOWN_LIMIT_SECONDS


def test_the_temporal_image_is_the_tested_cli_version(services) -> None:
    image, tag = services["temporal"]["image"].split(":")
    version = subprocess.run([installed_binary("temporal"), "--version"], capture_output=True, text=True, check=True)
    assert image == "temporalio/temporal"
    assert version.stdout.startswith(f"temporal version {tag} "), version.stdout


def test_the_redis_command_runs_and_a_restart_keeps_the_data(services, tmp_path) -> None:
    port = free_port()
    args = [installed_binary("redis-server"), *services["redis"]["command"][1:],
            "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)]  # fmt: skip
    for run in range(2):
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port, 10, proc)
            client = Redis(port=port)
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
            assert client.config_get("maxmemory") == {"maxmemory": str(512 * 1024 * 1024)}
            if run == 0:
                client.xadd("{xmc-tasks-stream}:experiment:E:held", {"task": "t0"})
                client.incr("{xmc-tasks-stream}:experiment:E:fence")
            else:  # a restart (SIGTERM, as `docker compose restart` sends) kept both
                assert client.xlen("{xmc-tasks-stream}:experiment:E:held") == 1
                assert client.get("{xmc-tasks-stream}:experiment:E:fence") == b"1"
            client.close()
        finally:
            stop_process(proc)


@pytest.mark.slow  # starts a Temporal dev server
def test_the_temporal_command_runs_with_the_search_attributes(services, tmp_path) -> None:
    command = services["temporal"]["command"]
    registered = dict(a.split("=") for a in _flags(command, "--search-attribute"))
    assert registered == SEARCH_ATTRIBUTES
    port, ui = free_port(), free_port()
    temporal = installed_binary("temporal")
    # the file's own flags, then the test's: loopback, free ports, a database in a temporary directory
    args = [temporal, *command, "--ip", "127.0.0.1", "--port", str(port), "--ui-port", str(ui),
            "--db-filename", str(tmp_path / "temporal.db"), "--log-level", "error"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, 60, proc)
        wait_until_serving(f"127.0.0.1:{port}", timeout=60)
        listed = subprocess.run(
            [temporal, "operator", "search-attribute", "list", "--address", f"127.0.0.1:{port}", "-o", "json"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        stop_process(proc)
    assert (tmp_path / "temporal.db").exists()
    custom = json.loads(listed.stdout)["customAttributes"]
    assert {name: custom.get(name) for name in SEARCH_ATTRIBUTES} == {
        name: f"INDEXED_VALUE_TYPE_{kind.upper()}" for name, kind in SEARCH_ATTRIBUTES.items()
    }
