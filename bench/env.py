"""The services of one bench run: a redis-server, a Temporal dev server and worker processes.

A fresh ``redis-server``, a fresh headless Temporal dev server, and ``python -m worker`` subprocesses, all on
loopback ports of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis
from temporalio.client import Client

from xmc_resumption.services import local_redis, local_temporal, stop_process
from xmc_resumption.settings import Settings, connect_temporal

LOG_DIR = Path(".xmc") / "bench"
WORKER_READY_LINE = b"worker polling task queue"
"""What ``worker.py`` logs once it polls (its INFO line), so a timed run never waits for start-up."""


@dataclass
class BenchEnv:
    """What a bench run talks to.

    Attributes:
        redis_url: the run's own redis-server.
        temporal_address: the run's own dev server (``host:port``).
        client: a Temporal client with the pydantic data converter.
        redis: a bytes asyncio Redis client without socket timeouts (some bench calls are slow on purpose).
        task_queue: the task queue the bench's workers poll.
        log_dir: where the services' and workers' logs go.
    """

    redis_url: str
    temporal_address: str
    client: Client
    redis: Redis
    task_queue: str
    log_dir: Path

    def settings(self) -> Settings:
        """The worker's settings for this run."""
        return Settings(redis_url=self.redis_url, task_queue=self.task_queue)


@contextlib.contextmanager
def _env_var(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for the block (envconfig reads ``TEMPORAL_ADDRESS`` from it)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@contextlib.asynccontextmanager
async def bench_services(log_dir: Path = LOG_DIR) -> AsyncIterator[BenchEnv]:
    """Start a redis-server and a headless dev server for one bench run; stop both at the end."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(local_redis(log_file=log_dir / "redis.log"))
        address = stack.enter_context(local_temporal(port=None, ui_port=None, log_file=log_dir / "temporal.log"))
        stack.enter_context(_env_var("TEMPORAL_ADDRESS", address))
        client = await connect_temporal()
        redis = Redis.from_url(url, decode_responses=False, socket_timeout=None)
        try:
            yield BenchEnv(url, address, client, redis, f"xmc-bench-{os.getpid()}", log_dir)
        finally:
            await redis.aclose()


@dataclass
class WorkerProcess:
    """A running ``python -m worker`` subprocess."""

    proc: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        """The worker's process ID."""
        return self.proc.pid

    def peak_rss_mib(self) -> float:
        """The worker's peak resident set size so far (``VmHWM``), in MiB."""
        return _status_kib(self.pid, "VmHWM") / 1024

    def rss_mib(self) -> float:
        """The worker's resident set size now (``VmRSS``), in MiB."""
        return _status_kib(self.pid, "VmRSS") / 1024


def _status_kib(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(f"{field} not in /proc/{pid}/status")


async def _wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Wait until the worker logged that it polls (seconds); raise if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while WORKER_READY_LINE not in log.read_bytes():
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with code {proc.returncode}; see {log}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker not polling after {timeout} s; see {log}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def worker_process(
    env: BenchEnv, name: str = "worker", settings: Mapping[str, str] | None = None
) -> AsyncIterator[WorkerProcess]:
    """Run ``python -m worker`` as ``xmc/demo.py`` does, once it polls; SIGTERM at the end.

    Its environment: ``XMC_REDIS_URL``, ``XMC_TASK_QUEUE``, ``TEMPORAL_ADDRESS``, and ``settings``: more ``XMC_*``
    variables. It exits 0 after a graceful shutdown.
    """
    log = env.log_dir / f"{name}.log"
    log.write_bytes(b"")
    worker_env = {
        **os.environ,
        "XMC_REDIS_URL": env.redis_url,
        "XMC_TASK_QUEUE": env.task_queue,
        "TEMPORAL_ADDRESS": env.temporal_address,
        **(settings or {}),
    }
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "worker"], env=worker_env, stdout=out, stderr=subprocess.STDOUT)
        try:
            await _wait_ready(proc, log, timeout=60)
            yield WorkerProcess(proc)
        finally:
            stop_process(proc, timeout=30)
