"""Pieces for driving consumer processes against a real broker: used by ``fastrecover demo`` and ``bench``.

* :class:`SteadyProducer` writes records at a fixed rate from a thread;
* :class:`EventProcess` runs a ``python -m <module>`` child whose stdout is JSON
  lines (one event each) and lets the driver wait on those events;
* :func:`broker_session` yields a bootstrap address: the one given, or a broker
  chosen by :func:`fastrecover_tools.testing.broker.select_broker`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from confluent_kafka import Producer

from fastrecover_tools.testing.broker import Broker, select_broker


class SteadyProducer:
    """Writes ``rate`` records/s until stopped.

    By default the values are the running count (``b"0"``, ``b"1"``, ...) and the
    partitioner picks partitions; ``value_size`` pads values to that many bytes and
    ``partitions`` spreads records round-robin over that many partitions.

    With ``track_acks`` every record the broker acknowledged is remembered, from
    the delivery callbacks: :meth:`acked` gives ``{(partition, offset): create
    timestamp in ms}``, the reference a loss check compares deliveries against.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rate: int,
        *,
        value_size: int | None = None,
        partitions: int | None = None,
        track_acks: bool = False,
    ) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self._topic, self._rate = topic, rate
        self._value_size, self._partitions = value_size, partitions
        self._stop = threading.Event()
        self.sent = 0
        self._track = track_acks
        self._acked: dict[tuple[int, int], int] = {}
        self.failed = 0
        self._acks_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)

    def __enter__(self) -> SteadyProducer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        """Stop producing, wait until everything sent is acknowledged; returns the count sent."""
        self._stop.set()
        self._thread.join(30)
        self._producer.flush(30)
        return self.sent

    def acked(self) -> dict[tuple[int, int], int]:
        """A copy of the acknowledged records so far: (partition, offset) -> create timestamp (ms)."""
        with self._acks_lock:
            return dict(self._acked)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            with self._acks_lock:
                self.failed += 1
            return
        _ts_type, ts = msg.timestamp()
        with self._acks_lock:
            self._acked[(msg.partition(), msg.offset())] = ts

    def _value(self, n: int) -> bytes:
        text = b"%d" % n
        return text if self._value_size is None else text.ljust(self._value_size, b".")

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - start) * self._rate)
            while self.sent < due:
                if self._track:
                    extra: dict[str, Any] = {"on_delivery": self._on_delivery}
                    if self._partitions:
                        extra["partition"] = self.sent % self._partitions
                    self._producer.produce(self._topic, value=self._value(self.sent), **extra)
                elif self._partitions:
                    self._producer.produce(
                        self._topic, value=self._value(self.sent), partition=self.sent % self._partitions
                    )
                else:
                    self._producer.produce(self._topic, value=self._value(self.sent))
                self.sent += 1
                if self.sent % 1000 == 0:
                    self._producer.poll(0)
            self._producer.poll(0.005)


class EventProcess:
    """A ``python -m <module>`` process whose JSON-line events on stdout we follow.

    With ``stdin=True`` the driver can :meth:`tell` it lines of text.
    """

    def __init__(self, module: str, args: list[str], log_file: TextIO, *, stdin: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE if stdin else None,
            stderr=log_file,
            text=True,
        )
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self._lock:
                self.events.append(event)

    def event(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return next((e for e in self.events if e["event"] == name), None)

    def latest(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return next((e for e in reversed(self.events) if e["event"] == name), None)

    def tell(self, line: str) -> None:
        assert self.proc.stdin is not None, "started without stdin=True"
        self.proc.stdin.write(line.rstrip("\n") + "\n")
        self.proc.stdin.flush()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)


@contextmanager
def broker_session(bootstrap: str | None, out: TextIO) -> Iterator[tuple[str, Broker | None]]:
    """The given bootstrap address, or a broker from select_broker() (closed on exit)."""
    if bootstrap:
        print(f"broker: {bootstrap} (from --bootstrap-servers)", file=out, flush=True)
        yield bootstrap, None
        return
    broker: Broker = select_broker()
    try:
        print(f"broker: {broker.describe()}", file=out, flush=True)
        yield broker.bootstrap, broker
    finally:
        broker.close()
