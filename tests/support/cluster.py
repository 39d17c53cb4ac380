"""A throwaway Redis Cluster for the tests: three primaries (no replicas) on free loopback ports,
from Debian's ``redis-server`` and ``redis-cli`` (package redis-tools, a dependency of
redis-server), never downloaded; and moving one slot between primaries while clients use it."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from xmc_resumption.services import free_port, installed_binary, stop_process, wait_for_port

START_TIMEOUT_SECONDS = 20.0
"""How long the cluster may take to listen, form and report ``cluster_state:ok`` (seconds); it took
about 1.5 s here."""


@dataclass(frozen=True)
class LocalCluster:
    """A running cluster: its primaries' ports, in the order they were started.

    Attributes:
        ports: the primaries' ports on 127.0.0.1.
    """

    ports: tuple[int, ...]

    @property
    def url(self) -> str:
        """A seed URL (the first primary) for ``XMC_REDIS_URL`` with ``XMC_REDIS_CLUSTER=true``."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def cli(self, port: int, *args: str) -> str:
        """Run ``redis-cli -p port args...``; returns its output (text).

        Raises:
            subprocess.CalledProcessError: redis-cli failed, or the reply is an error.
        """
        out = subprocess.run(
            [installed_binary("redis-cli"), "-h", "127.0.0.1", "-p", str(port), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        if out.startswith(("ERR", "(error)")):
            raise subprocess.CalledProcessError(1, args, out)
        return out

    def node_id(self, port: int) -> str:
        """The cluster node ID of the primary on ``port``."""
        return self.cli(port, "cluster", "myid").strip()

    def owner(self, slot: int) -> int:
        """The port of the primary that serves ``slot`` now (as the first primary sees it)."""
        for line in self.cli(self.ports[0], "cluster", "nodes").splitlines():
            _, address, _, _, _, _, _, _, *ranges = line.split()
            for part in ranges:
                low, _, high = part.partition("-")
                if not part.startswith("[") and int(low) <= slot <= int(high or low):
                    return int(address.split("@")[0].rsplit(":", 1)[1])
        raise LookupError(f"slot {slot} is not served")

    def move_slot(self, slot: int, to_port: int) -> int:
        """Move ``slot`` with its keys to the primary on ``to_port``, the way ``redis-cli --cluster
        reshard`` does (CLUSTER SETSLOT IMPORTING / MIGRATING, MIGRATE the keys, SETSLOT NODE on
        both); clients see ASK and TRYAGAIN meanwhile and MOVED after. Returns the keys moved.
        """
        from_port = self.owner(slot)
        source, target = self.node_id(from_port), self.node_id(to_port)
        self.cli(to_port, "cluster", "setslot", str(slot), "importing", source)
        self.cli(from_port, "cluster", "setslot", str(slot), "migrating", target)
        moved = 0
        while keys := self.cli(from_port, "cluster", "getkeysinslot", str(slot), "100").split():
            self.cli(from_port, "migrate", "127.0.0.1", str(to_port), "", "0", "5000", "keys", *keys)
            moved += len(keys)
        for port in (to_port, from_port):
            self.cli(port, "cluster", "setslot", str(slot), "node", target)
        return moved


@contextmanager
def local_cluster(primaries: int = 3, log_dir: Path | None = None) -> Iterator[LocalCluster]:
    """Run a Redis Cluster of ``primaries`` primaries on 127.0.0.1 (no persistence, no replicas),
    each in a temporary ``--dir`` of its own with its own ``nodes.conf``; yields it once every
    primary reports ``cluster_state:ok``. Every process is stopped at the end.

    Raises:
        TimeoutError: the cluster did not form within ``START_TIMEOUT_SECONDS``.
        FileNotFoundError: redis-server or redis-cli is not installed.
    """
    ports = tuple(free_port() for _ in range(primaries))
    with ExitStack() as stack:
        for port in ports:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"xmc-cluster-{port}-"))
            log = open(log_dir / f"redis-{port}.log", "ab") if log_dir else subprocess.DEVNULL  # noqa: SIM115
            if log_dir:
                stack.callback(log.close)  # type: ignore[union-attr]
            # the bus port is named: its default, port + 10000, fails for a port above 55535
            args = [installed_binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
                    "--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                    "--cluster-config-file", "nodes.conf", "--dir", workdir,
                    "--save", "", "--appendonly", "no", "--cluster-node-timeout", "5000"]  # fmt: skip
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
            stack.callback(stop_process, proc)
            wait_for_port(port, START_TIMEOUT_SECONDS, proc)
        cluster = LocalCluster(ports)
        nodes = [f"127.0.0.1:{port}" for port in ports]
        subprocess.run(
            [installed_binary("redis-cli"), "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            timeout=START_TIMEOUT_SECONDS,
            check=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not all("cluster_state:ok" in cluster.cli(port, "cluster", "info") for port in ports):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster on {nodes} did not reach cluster_state:ok")
            time.sleep(0.05)
        yield cluster
