"""Test fixtures of issue 9: redis-servers that enforce the project's ACL or speak only TLS, and
certificates made by the test (the ``cryptography`` package; nothing downloaded)."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.helpers import ROOT
from xmc_resumption.services import free_port, installed_binary, stop_process, wait_for_port

ACL_FILE = ROOT / "deploy" / "redis-acl.conf"
ACL_USER = "xmc-resumption"
PRODUCER_ACL_FILE = ROOT / "deploy" / "redis-acl-producer.conf"
PRODUCER_USER = "xmc-producer"
SECRET = "Xs3cret-acl-Pa55"
"""The ACL user's password in these tests: it must never show in any output."""


@contextmanager
def redis_server(*args: str, port: int | None = None, listen_port: int | None = None) -> Iterator[int]:
    """Run a throwaway ``redis-server`` on 127.0.0.1 with extra ``args`` (no persistence, its own
    working directory); yields the port it listens on (``listen_port``, e.g. a TLS port, or ``port``)."""
    port = port if port is not None else free_port()
    with tempfile.TemporaryDirectory(prefix="xmc-redis-sec-") as workdir:
        argv = [installed_binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", workdir, *args]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(listen_port or port, 10, proc)
            yield listen_port or port
        finally:
            stop_process(proc)


@contextmanager
def acl_redis() -> Iterator[tuple[str, str]]:
    """A redis-server that loads ``deploy/redis-acl.conf``; its ACL user is switched on with the
    password ``SECRET`` by the admin (the ``default`` user, which the file leaves as it is).
    Yields (admin URL, the ACL user's URL)."""
    with redis_server("--aclfile", str(ACL_FILE)) as port:
        subprocess.run(
            [installed_binary("redis-cli"), "-p", str(port), "ACL", "SETUSER", ACL_USER, "on", f">{SECRET}"],
            check=True,
            capture_output=True,
        )
        yield f"redis://127.0.0.1:{port}/0", f"redis://{ACL_USER}:{SECRET}@127.0.0.1:{port}/0"


@contextmanager
def producer_acl_redis() -> Iterator[tuple[str, str]]:
    """A redis-server that loads ``deploy/redis-acl-producer.conf``, its producer user switched on
    with the password ``SECRET``. Yields (admin URL, the producer's URL)."""
    with redis_server("--aclfile", str(PRODUCER_ACL_FILE)) as port:
        subprocess.run(
            [installed_binary("redis-cli"), "-p", str(port), "ACL", "SETUSER", PRODUCER_USER, "on", f">{SECRET}"],
            check=True,
            capture_output=True,
        )
        yield f"redis://127.0.0.1:{port}/0", f"redis://{PRODUCER_USER}:{SECRET}@127.0.0.1:{port}/0"


@dataclass(frozen=True)
class Certificates:
    """PEM files of a test CA, a server certificate for 127.0.0.1/localhost and a client
    certificate, all signed by the CA, and of a second CA that signed neither."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _ca(path: Path, name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign, crl_sign
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], name: str, server: bool, cert_path: Path, key_path: Path
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    cert_path.write_bytes(builder.sign(ca[1], hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)


def make_certificates(folder: Path) -> Certificates:
    """Write a CA, a server and a client certificate (ECDSA P-256, valid for a day) into ``folder``."""
    certs = Certificates(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        other_ca=folder / "other-ca.pem",
    )
    ca = _ca(certs.ca, "xmc test CA")
    _leaf(ca, "127.0.0.1", True, certs.server_cert, certs.server_key)
    _leaf(ca, "xmc-worker", False, certs.client_cert, certs.client_key)
    _ca(certs.other_ca, "some other CA")
    return certs


@contextmanager
def tls_redis(certs: Certificates, *args: str) -> Iterator[int]:
    """A redis-server that speaks only TLS (``--port 0``) on a free loopback port and requires a
    client certificate signed by ``certs.ca`` (``tls-auth-clients yes``), with extra ``args``;
    yields the TLS port."""
    tls_port = free_port()
    with redis_server(
        "--tls-port", str(tls_port),
        "--tls-cert-file", str(certs.server_cert),
        "--tls-key-file", str(certs.server_key),
        "--tls-ca-cert-file", str(certs.ca),
        "--tls-auth-clients", "yes",
        *args,
        port=0,
        listen_port=tls_port,
    ) as port:  # fmt: skip
        yield port
