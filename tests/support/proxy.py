"""TCP proxies on loopback that stand in for the network in front of a redis-server.

``LosingProxy`` forwards every connection to the real server and can lose a reply: it forwards a
command, waits for the server's reply (so the command has run) and then closes the client's
connection without relaying it: what a producer sees when Redis, a proxy or the network fails
between the write and the reply. It can also hold what the server sends: in front of a primary on
a replica's replication link, a held proxy is a replica that lags by exactly the writes made
since ``hold()``, however fast the machine is.

``LosingProxy`` can also hold a request back before forwarding it (``delay``): a slow network
between a worker and Redis.

``SwitchableProxy`` is a stable address (a DNS name, Sentinel's answer, a cloud endpoint): new
connections go to its current target, which a failover switches to the promoted replica.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class LosingProxy:
    """Listens on a free loopback port and forwards every connection to ``127.0.0.1:upstream``.

    ``lose(command, times)``: the next ``times`` connections that send ``command`` (e.g.
    ``b"EVALSHA"``, matched in the request's bytes) lose the reply to it. ``lost`` counts the
    replies lost so far.

    ``hold()``: from now on the server's bytes are kept, in order, instead of being relayed (its
    clients' bytes still reach it); ``release()`` relays what was kept and forwards again. Bytes kept
    when the server's side closes (the server was killed) are dropped with the connection, never
    relayed: they are what a replica behind this proxy never gets. ``held_bytes`` counts the bytes
    kept now.

    ``delay(marker, seconds, times)``: the next ``times`` requests holding ``marker`` reach the server
    ``seconds`` late.

    ``cut()``: a network partition: from now on every byte either way is dropped (connections stay open and
    new ones are accepted, but nothing gets through: a client waits out its timeout); ``heal()`` forwards again.
    """

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.lost = 0
        self._command = b""
        self._times = 0
        self._delayed: tuple[bytes, float, int] = (b"", 0.0, 0)
        self._lock = threading.Lock()
        self._holding = False
        self._cut = False
        self._kept: dict[socket.socket, list[bytes]] = {}
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def lose(self, command: bytes, times: int = 1) -> None:
        with self._lock:
            self._command, self._times = command.upper(), times

    def hold(self) -> None:
        """Keep the server's bytes from now on instead of relaying them."""
        with self._lock:
            self._holding = True

    def cut(self) -> None:
        """Drop every byte either way from now on: the network between clients and server is gone."""
        with self._lock:
            self._cut = True

    def heal(self) -> None:
        """Forward again (bytes dropped meanwhile stay dropped)."""
        with self._lock:
            self._cut = False

    def release(self) -> None:
        """Relay every byte kept since ``hold()``, in order, and forward again."""
        with self._lock:
            self._holding = False
            for client, kept in self._kept.items():
                with suppress(OSError):
                    client.sendall(b"".join(kept))
                kept.clear()

    @property
    def held_bytes(self) -> int:
        """The server's bytes kept now (not relayed yet)."""
        with self._lock:
            return sum(len(chunk) for kept in self._kept.values() for chunk in kept)

    def delay(self, marker: bytes, seconds: float, times: int = 1) -> None:
        with self._lock:
            self._delayed = (marker, seconds, times)

    def _lateness(self, request: bytes) -> float:
        """Seconds to hold ``request`` back (and counts it): 0 unless it holds the delayed marker."""
        with self._lock:
            marker, seconds, times = self._delayed
            if times > 0 and marker and marker in request:
                self._delayed = (marker, seconds, times - 1)
                return seconds
            return 0.0

    def _claim(self, request: bytes) -> bool:
        """True when this request is one whose reply is to be lost (and counts it)."""
        with self._lock:
            if self._times > 0 and self._command and self._command in request.upper():
                self._times -= 1
                return True
            return False

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:  # the server is gone: the client sees its connection closed
                _close(client)
                continue
            self._sockets += [client, upstream]
            losing = threading.Event()
            for target in (self._requests, self._replies):
                thread = threading.Thread(target=target, args=(client, upstream, losing), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _requests(self, client: socket.socket, upstream: socket.socket, losing: threading.Event) -> None:
        """Client to server: every byte; a request holding the command arms the loss first."""
        try:
            while request := client.recv(1 << 20):
                if self._claim(request):
                    losing.set()
                if late := self._lateness(request):
                    time.sleep(late)
                with self._lock:
                    if self._cut:
                        continue
                upstream.sendall(request)
        except OSError:
            pass
        finally:
            _close(client, upstream)

    def _replies(self, client: socket.socket, upstream: socket.socket, losing: threading.Event) -> None:
        """Server to client: every byte, unless the loss is armed (the server has run the command,
        and its reply goes nowhere: both connections close) or the proxy holds (kept, in order)."""
        try:
            while reply := upstream.recv(1 << 20):
                if losing.is_set():
                    with self._lock:
                        self.lost += 1
                    return
                with self._lock:
                    if self._cut:
                        continue
                    if self._holding:
                        self._kept.setdefault(client, []).append(reply)
                        continue
                client.sendall(reply)
        except OSError:
            pass
        finally:
            with self._lock:
                self._kept.pop(client, None)  # the server is gone: what it sent and was kept is lost
            _close(client, upstream)

    def close(self) -> None:
        self._closing = True
        with suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        self._server.close()
        _close(*self._sockets)
        self._accepter.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)


@contextmanager
def losing_proxy(upstream: int) -> Iterator[LosingProxy]:
    """A ``LosingProxy`` to ``127.0.0.1:upstream`` for the block."""
    proxy = LosingProxy(upstream)
    try:
        yield proxy
    finally:
        proxy.close()


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


class SwitchableProxy:
    """A TCP proxy on 127.0.0.1 whose target port can be switched: a stable address.

    ``switch(port)`` sends new connections to ``port``; connections already open keep their old
    target, unless ``reset=True`` aborts them (an RST to both ends). Runs on the event loop that
    calls ``start``.
    """

    def __init__(self, target: int) -> None:
        self.target = target
        self.sessions: dict[asyncio.StreamWriter, tuple[asyncio.StreamWriter, int]] = {}
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._session, "127.0.0.1", 0)

    def open_to(self, port: int) -> int:
        """Connections open through the proxy to ``port`` now."""
        return sum(1 for _, target in self.sessions.values() if target == port)

    def switch(self, port: int, *, reset: bool = False) -> None:
        self.target = port
        if reset:
            for client, (upstream, _) in list(self.sessions.items()):
                client.transport.abort()
                upstream.transport.abort()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        self.switch(self.target, reset=True)
        await self._server.wait_closed()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = self.target
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            writer.transport.abort()
            return
        self.sessions[writer] = (up_writer, target)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            del self.sessions[writer]

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            dst.transport.abort()  # one side gone: the other goes too
