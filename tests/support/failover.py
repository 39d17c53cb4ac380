"""A crash failover with a delayed replica, made deterministic (issue 23).

A primary redis-server and a replica run with the docs' settings (AOF, ``appendfsync always``,
``noeviction``: docs/memory.md). The replica reaches the primary through a ``LosingProxy`` on its
replication link, which can hold what the primary sends: while held, the replica lags by exactly
the writes made since, whatever the machine's load. ``crash()`` then does what a manager
(Sentinel, a cloud service) does when a primary dies: the primary is killed with SIGKILL (what
it acknowledged and the proxy held is lost), the replica is promoted (``REPLICAOF NO ONE``) and
the clients' stable address (a ``SwitchableProxy``, as a DNS name or Sentinel's answer) moves to
it.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from redis.asyncio import Redis

from tests.support.proxy import LosingProxy, SwitchableProxy
from xmc_resumption.redisclient.connection import ReplicaAcks
from xmc_resumption.services import free_port, installed_binary, stop_process, wait_for_port

DOCS_SETTINGS = ["--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction"]
"""The Redis settings docs/memory.md asks for: AOF, fsync on every write, no eviction."""

ACKS = ReplicaAcks(replicas=1, timeout_ms=4_000)
"""The acknowledged mode of the crash-failover tests: one replica, within 4 s (a bound for a loaded machine)."""

HELD_ACKS = ReplicaAcks(replicas=1, timeout_ms=200)
"""The same while the link is held: no replica ever answers then, so a short WAIT says as much."""


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = 20, what: str = "the condition") -> None:
    """Await ``condition()`` until it is true, polling every 10 ms; TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:g} s")
        await asyncio.sleep(0.01)


def _start_redis(port: int, workdir: Path, name: str, *extra: str) -> subprocess.Popen[bytes]:
    """A redis-server on 127.0.0.1:``port`` with the docs' settings, its files in ``workdir/name``."""
    directory = workdir / name
    directory.mkdir(exist_ok=True)
    args = [installed_binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--protected-mode", "yes", "--dir", str(directory), "--repl-diskless-sync-delay", "0",
            *DOCS_SETTINGS, *extra]  # fmt: skip
    log = open(workdir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    log.close()  # the child holds its own descriptor
    wait_for_port(port, 10, proc)
    return proc


class CrashFailover:
    """A primary, a replica behind a holding replication link, and the clients' stable address.

    Attributes:
        primary, replica: bytes clients straight to each server (for setup and inspection).
        link: the replication link's proxy (``hold()``, ``release()``).
        address: the clients' stable address; ``url`` is its ``redis://`` URL.
        primary_port, replica_port: the servers' ports.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.primary_port, self.replica_port = free_port(), free_port()
        self._processes: list[subprocess.Popen[bytes]] = []
        self.link = LosingProxy(self.primary_port)
        try:
            self._primary = self._start(self.primary_port, "primary")
            self._replica = self._start(self.replica_port, "replica", "--replicaof", "127.0.0.1", str(self.link.port))
        except BaseException:
            self.link.close()
            for proc in self._processes:
                stop_process(proc)
            raise
        self.primary = Redis(port=self.primary_port, decode_responses=False)
        self.replica = Redis(port=self.replica_port, decode_responses=False)
        self.address = SwitchableProxy(self.primary_port)
        self.crashed = False

    @property
    def url(self) -> str:
        """The clients' stable address: the primary's until ``crash()``, the promoted replica's after."""
        return self.address.url

    def client(self, **kwargs: object) -> Redis:
        """A new bytes client on the stable address (the caller closes it)."""
        return Redis.from_url(self.url, decode_responses=False, **kwargs)  # type: ignore[arg-type]

    async def in_sync(self) -> None:
        """Wait until the replica's link is up and it has processed every write of the primary."""

        async def caught_up() -> bool:
            primary = await self.primary.info("replication")
            replica = await self.replica.info("replication")
            return (
                replica.get("master_link_status") == "up"
                and primary.get("connected_slaves") == 1
                and replica.get("slave_repl_offset") == primary.get("master_repl_offset")
            )

        await until(caught_up, what="the replica in sync")

    def _start(self, port: int, name: str, *extra: str) -> subprocess.Popen[bytes]:
        proc = _start_redis(port, self.workdir, name, *extra)
        self._processes.append(proc)
        return proc

    def hold(self) -> None:
        """From now on the replica gets nothing: the primary's writes stay on the primary alone."""
        self.link.hold()

    def release(self) -> None:
        """The replica gets what was held, and what follows."""
        self.link.release()

    async def crash(self) -> None:
        """SIGKILL the primary, promote the replica and move the stable address to it.

        What the link held is dropped with the primary. Connections open through the address are
        reset (their server died); new ones reach the promoted replica.
        """
        self._primary.send_signal(signal.SIGKILL)
        await asyncio.to_thread(self._primary.wait, 10)
        self.crashed = True
        await self.replica.execute_command("REPLICAOF", "NO", "ONE")
        await until(self._replica_is_primary, what="the replica's promotion")
        self.address.switch(self.replica_port, reset=True)

    async def rejoin(self) -> None:
        """Start the old primary again, as a replica of the promoted one (what Sentinel does), in sync.

        It loads its own AOF first, then a full resynchronisation replaces its data with the new
        primary's: what only it had is gone for good.
        """
        assert self.crashed
        self._start(self.primary_port, "primary", "--replicaof", "127.0.0.1", str(self.replica_port))
        old, new = self.primary, self.replica

        async def caught_up() -> bool:
            primary, replica = await new.info("replication"), await old.info("replication")
            return replica.get("master_link_status") == "up" and replica.get("slave_repl_offset") == primary.get(
                "master_repl_offset"
            )

        await until(caught_up, what="the old primary in sync as a replica")

    async def _replica_is_primary(self) -> bool:
        return bool((await self.replica.info("replication")).get("role") == "master")

    async def close(self) -> None:
        await self.address.close()
        await self.primary.aclose()
        await self.replica.aclose()
        self.link.close()
        for proc in reversed(self._processes):
            await asyncio.to_thread(stop_process, proc)


@asynccontextmanager
async def crash_failover(workdir: Path) -> AsyncIterator[CrashFailover]:
    """A ``CrashFailover`` in ``workdir``, the replica in sync, for the block."""
    async with AsyncExitStack() as stack:
        servers = CrashFailover(workdir)
        stack.push_async_callback(servers.close)
        await servers.address.start()
        await servers.in_sync()
        yield servers
