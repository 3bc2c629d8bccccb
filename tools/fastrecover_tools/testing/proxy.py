"""A TCP proxy on 127.0.0.1 that can *freeze*: bytes stop flowing both ways while every socket stays open.

That is how networks usually fail in production (a switch that drops traffic, a
firewall that forgets a connection, a peer that hangs): nothing is refused,
nothing is closed, calls simply never come back.  A store behind such a network
never sees the statement, so no server-side timeout fires; only the client's
own bounds can end the wait.  The fault tests put this proxy between the
consumer and PostgreSQL and freeze it mid-run.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from collections.abc import Iterator

log = logging.getLogger("fastrecover_tools.proxy")

_CHUNK = 65_536
#: how often a pump looks at the proxy's state while it waits
_TICK_S = 0.05


class FreezableProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; :meth:`freeze` stops the bytes, :meth:`thaw` lets them go."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(_TICK_S)
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, name="proxy-accept", daemon=True)]
        self._threads[0].start()

    def freeze(self) -> None:
        """Stop forwarding in both directions; connections stay open, new ones are accepted and hang."""
        self._flowing.clear()
        log.info("proxy :%d frozen", self.port)

    def thaw(self) -> None:
        self._flowing.set()
        log.info("proxy :%d flowing again", self.port)

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in [self._listener, *sockets]:
            with contextlib.suppress(OSError):
                sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> FreezableProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError as exc:
                log.warning("proxy :%d cannot reach %s:%d: %s", self.port, *self._target, exc)
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                thread = threading.Thread(target=self._pump, args=(src, dst), name="proxy-pump", daemon=True)
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
                thread.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Copy ``src`` to ``dst`` while flowing; while frozen, leave the bytes in the kernel's buffers."""
        while not self._closed.is_set():
            if not self._flowing.wait(_TICK_S):
                continue
            try:
                readable, _w, _x = select.select([src], [], [], _TICK_S)
                if not readable or not self._flowing.is_set():
                    continue
                data = src.recv(_CHUNK)
                if not data:
                    break
                dst.sendall(data)
            except (OSError, ValueError):  # ValueError: close() closed the socket under select()
                break
        # Either side ended (or the proxy closed): end the pair.  Closed, not only shut down: a proxy that
        # outlives thousands of connections (a chaos campaign's restarts) must not keep their descriptors.
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._sockets = [sock for sock in self._sockets if sock is not src and sock is not dst]
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.close()


@contextlib.contextmanager
def freezable_proxy(target_host: str, target_port: int) -> Iterator[FreezableProxy]:
    proxy = FreezableProxy(target_host, target_port)
    try:
        yield proxy
    finally:
        proxy.close()


def proxied_listeners(count: int, prefix: str = "MEMBER") -> tuple[list[FreezableProxy], dict[str, tuple[int, int]]]:
    """``count`` proxies, each in front of a broker listener of its own, and those listeners for
    :class:`~fastrecover_tools.testing.broker.LocalJarBroker`'s ``extra_listeners``.

    A client that bootstraps on proxy ``i`` is told by the broker to use that proxy for every
    connection (its listener advertises the proxy's port), so freezing proxy ``i`` cuts that one
    client off from Kafka while every other client, and the client's store, carry on.  The
    proxies forward to ports that are free now and that the broker binds when it starts.
    """
    from fastrecover_tools.testing.broker import free_ports

    targets = free_ports(count)
    proxies = [FreezableProxy("127.0.0.1", port) for port in targets]
    return proxies, {f"{prefix}{i}": (targets[i], proxy.port) for i, proxy in enumerate(proxies)}
