"""A TCP proxy in front of a redis-server that can lose a reply: it forwards a command to the real
server, waits for the server's reply (so the command has run) and then closes the client's
connection without relaying it. What a producer sees when Redis, a proxy or the network fails
between the write and the reply."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class LosingProxy:
    """Listens on a free loopback port and forwards every connection to ``127.0.0.1:upstream``.

    ``lose(command, times)``: the next ``times`` connections that send ``command`` (e.g.
    ``b"EVALSHA"``, matched in the request's bytes) lose the reply to it. ``lost`` counts the
    replies lost so far.
    """

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.lost = 0
        self._command = b""
        self._times = 0
        self._lock = threading.Lock()
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
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
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
                upstream.sendall(request)
        except OSError:
            pass
        finally:
            _close(client, upstream)

    def _replies(self, client: socket.socket, upstream: socket.socket, losing: threading.Event) -> None:
        """Server to client: every byte, unless the loss is armed: then the server has run the
        command, and its reply goes nowhere: both connections close."""
        try:
            while reply := upstream.recv(1 << 20):
                if losing.is_set():
                    with self._lock:
                        self.lost += 1
                    return
                client.sendall(reply)
        except OSError:
            pass
        finally:
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
