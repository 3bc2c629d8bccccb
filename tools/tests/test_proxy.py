"""The freezable proxy of the fault tests and chaos: bytes held while frozen, and no descriptor kept per connection."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest

from fastrecover_tools.testing.proxy import FreezableProxy, proxied_listeners
from fastrecover_tools.testing.waiting import wait_for


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_campaign_of_connections_leaves_no_descriptor_behind(echo_port: int) -> None:
    with FreezableProxy("127.0.0.1", echo_port) as proxy:
        before = _open_fds()
        for i in range(100):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn:
                conn.sendall(b"ping %d" % i)
                assert conn.recv(64) == b"ping %d" % i
        wait_for(lambda: _open_fds() <= before, 10, 0.05, "every proxied connection's descriptors closed")


def test_frozen_bytes_wait_and_flow_on_thaw(echo_port: int) -> None:
    with (
        FreezableProxy("127.0.0.1", echo_port) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as conn,
    ):
        proxy.freeze()
        conn.sendall(b"held")
        conn.settimeout(0.3)
        with pytest.raises(TimeoutError):
            conn.recv(64)  # nothing passes while frozen, and the socket stays open
        proxy.thaw()
        conn.settimeout(10)
        assert conn.recv(64) == b"held"


def test_proxied_listeners_pair_each_proxy_with_a_listener_of_its_own() -> None:
    proxies, listeners = proxied_listeners(3)
    try:
        assert list(listeners) == ["MEMBER0", "MEMBER1", "MEMBER2"]
        assert [advertised for _, advertised in listeners.values()] == [p.port for p in proxies]
        assert len({listen for listen, _ in listeners.values()}) == 3
    finally:
        for proxy in proxies:
            proxy.close()
