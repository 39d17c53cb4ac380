"""Issue 9, item 2 (Temporal): TLS and the API key come through the SDK's envconfig, exactly as
the ``temporal`` CLI reads them: a TOML profile (``TEMPORAL_CONFIG_FILE`` + ``TEMPORAL_PROFILE``)
or ``TEMPORAL_*`` variables. The dev server cannot serve TLS, so the tests show that the connect
keywords the project builds (``xmc.settings.temporal_connect_config``) carry the profile's TLS
files and key, and that the worker and the CLI use them: a TLS handshake against the plain dev
server fails, with one line naming ``TEMPORAL_ADDRESS`` and never the key or a certificate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.service import TLSConfig
from temporalio.testing import WorkflowEnvironment

from tests.support.helpers import run_module
from tests.support.secure import Certificates, make_certificates
from xmc_resumption.settings import temporal_connect_config

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

API_KEY = "tmprl-ApiKey-s3cret"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def profile_file(folder: Path, certs: Certificates, address: str) -> Path:
    """A TOML profile ``prod`` with an address, namespace, API key and TLS files."""
    path = folder / "temporal.toml"
    path.write_text(
        f"""[profile.prod]
address = "{address}"
namespace = "experiments"
api_key = "{API_KEY}"

[profile.prod.tls]
server_ca_cert_path = "{certs.ca}"
client_cert_path = "{certs.client_cert}"
client_key_path = "{certs.client_key}"
server_name = "temporal.internal"
"""
    )
    return path


def clear_temporal_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``TEMPORAL_*`` variable of the test's own environment takes part."""
    for name in [n for n in os.environ if n.startswith("TEMPORAL_")]:
        monkeypatch.delenv(name)


def test_a_profile_file_sets_address_namespace_api_key_and_tls(
    certs: Certificates, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_temporal_env(monkeypatch)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(profile_file(tmp_path, certs, "temporal.internal:7233")))
    monkeypatch.setenv("TEMPORAL_PROFILE", "prod")
    config = temporal_connect_config()
    assert (config["target_host"], config["namespace"], config["api_key"]) == (
        "temporal.internal:7233",
        "experiments",
        API_KEY,
    )
    tls = config["tls"]
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == certs.ca.read_bytes()
    assert tls.client_cert == certs.client_cert.read_bytes()
    assert tls.client_private_key == certs.client_key.read_bytes()
    assert tls.domain == "temporal.internal"


def test_environment_variables_set_tls_and_override_the_profile(
    certs: Certificates, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_temporal_env(monkeypatch)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(profile_file(tmp_path, certs, "temporal.internal:7233")))
    monkeypatch.setenv("TEMPORAL_PROFILE", "prod")
    monkeypatch.setenv("TEMPORAL_ADDRESS", "other.internal:7233")
    monkeypatch.setenv("TEMPORAL_TLS_SERVER_CA_CERT_PATH", str(certs.other_ca))
    config = temporal_connect_config()
    assert config["target_host"] == "other.internal:7233" and config["api_key"] == API_KEY
    assert isinstance(config["tls"], TLSConfig) and config["tls"].server_root_ca_cert == certs.other_ca.read_bytes()


def test_an_api_key_alone_turns_tls_on(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_temporal_env(monkeypatch)
    monkeypatch.setenv("TEMPORAL_API_KEY", API_KEY)
    assert temporal_connect_config() == {"target_host": "localhost:7233", "api_key": API_KEY, "tls": True}
    monkeypatch.setenv("TEMPORAL_TLS", "false")  # a plain-text server (the dev server): TLS off explicitly
    assert temporal_connect_config()["tls"] is False


@pytest.mark.parametrize("command", [["xmc_resumption.worker"], ["xmc_resumption", "resume", "V1", "--force"]])
def test_the_worker_and_the_cli_connect_with_the_profile(
    command: list[str], certs: Certificates, tmp_path: Path, temporal_env: WorkflowEnvironment, redis_url: str
) -> None:
    """The profile names the (plain-text) dev server with TLS on: the TLS handshake fails, so the
    command used the profile's TLS; it says so in one line, without the key or a certificate."""
    address = temporal_env.client.service_client.config.target_host
    env = {
        "TEMPORAL_CONFIG_FILE": str(profile_file(tmp_path, certs, address)),
        "TEMPORAL_PROFILE": "prod",
        "XMC_REDIS_URL": redis_url,
    }
    proc = run_module(*command, **env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if "Temporal" in ln]
    assert f"cannot reach Temporal at TEMPORAL_ADDRESS={address}" in line, line
    assert "InvalidContentType" in line, line  # rustls: a plain-text reply to the TLS handshake
    output = proc.stdout + proc.stderr
    assert API_KEY not in output and "BEGIN" not in output
