"""Servers started on a free port of our choosing survive losing that port to another process (``services``)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from redis import Redis

from xmc_resumption import services


@pytest.fixture
def taken() -> Iterator[int]:
    """A port another process holds (bound) for the test's length."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def test_a_free_port_taken_before_the_bind_is_chosen_again(monkeypatch: pytest.MonkeyPatch, taken: int) -> None:
    """The first "free" port is taken by the time redis-server binds it: it exits, and the next one is used."""
    real = services.free_port
    ports = iter([taken])
    monkeypatch.setattr(services, "free_port", lambda: next(ports, None) or real())
    with services.local_redis() as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert port != taken and Redis(port=port).ping()


def test_a_port_given_is_not_changed(taken: int) -> None:
    with pytest.raises(RuntimeError, match=f"before listening on {taken}"), services.local_redis(port=taken):
        pass
