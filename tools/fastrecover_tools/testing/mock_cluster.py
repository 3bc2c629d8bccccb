"""librdkafka's built-in mock cluster, for the demo on machines with neither Java nor Docker.

Never used by tests: they need a real broker.  The mock cluster lives inside the
client that creates it but listens on real loopback ports, so other processes
(the demo's consumer workers) can reach it while this process keeps the client
open.  Its bootstrap address is only announced in librdkafka's log, which we
read through a Python logger.
"""

from __future__ import annotations

import logging

from confluent_kafka import Producer

from fastrecover_tools.testing.waiting import wait_for

_MARKER = "replaced with "


class MockCluster:
    """A one-broker mock cluster; ``bootstrap`` is its address."""

    def __init__(self, timeout: float = 10.0) -> None:
        found: list[str] = []

        class _Grab(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                text = record.getMessage()
                if _MARKER in text:
                    found.append(text.split(_MARKER, 1)[1].split()[0].rstrip(","))

        logger = logging.getLogger("fastrecover_tools.testing.mock_cluster.librdkafka")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        logger.addHandler(_Grab())
        self._client = Producer({"bootstrap.servers": "mock:9092", "test.mock.num.brokers": 1, "logger": logger})

        def announced() -> bool:
            self._client.poll(0.1)
            return bool(found)

        wait_for(announced, timeout, 0.05, "librdkafka's mock cluster to announce its address")
        self.bootstrap = found[0]

    def describe(self) -> str:
        return f"librdkafka mock cluster at {self.bootstrap} (neither Java nor a Docker engine here)"

    def close(self) -> None:
        self._client.flush(5)
