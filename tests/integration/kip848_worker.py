"""``fastrecover_tools.testing.worker`` for KIP-848 groups (``--set group.protocol=consumer``).

librdkafka refuses ``session.timeout.ms``, ``heartbeat.interval.ms`` and
``partition.assignment.strategy`` when ``group.protocol=consumer`` (the broker owns them),
and the worker always sets the first two.  This shim drops them for such groups and is
otherwise the worker itself.  Once tools/fastrecover_tools/testing/worker.py leaves them out for
``group.protocol=consumer`` itself, this module can go.
"""

from __future__ import annotations

import sys
from typing import Any

from confluent_kafka import Consumer as PlainConsumer

from fastrecover.consumer import Consumer
from fastrecover_tools.testing import worker

#: What librdkafka rejects with group.protocol=consumer ("It is defined broker side").
CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")


def for_protocol(config: dict[str, Any]) -> dict[str, Any]:
    if str(config.get("group.protocol", "classic")).lower() != "consumer":
        return config
    return {k: v for k, v in config.items() if k not in CLASSIC_ONLY}


class _Consumer(Consumer):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(for_protocol(config))


class _PlainConsumer(PlainConsumer):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(for_protocol(config))


# the worker looks both names up in its module when it builds its consumer
worker.Consumer = _Consumer  # type: ignore[attr-defined]
worker.PlainConsumer = _PlainConsumer  # type: ignore[attr-defined,assignment]

if __name__ == "__main__":
    sys.exit(worker.run())
