"""A failure inside the merge of the two streams never costs the application a record nor an event.

``consume()`` during a backfill takes the primary's records first, then the child's.  A child whose
librdkafka handle breaks between the two is the child's failure: it is replaced from the ranges'
progress, and the primary's records already taken in that call reach the application.  Were the
failure to escape ``consume()``, those records would be lost to the application, yet counted as
handed out, and the next commit would move Kafka's offset past them.

A real broker and store; the handle is broken for real (its librdkafka consumer closed under it).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message, Producer

from fastrecover import Consumer, hooks
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import lag_after_crash, mode_of, parallel_config

pytestmark = pytest.mark.integration

LAG_START, LOG_END = 20, 2000


class _LiveProducer:
    """Fresh records on partition 0 all along, so that the primary has records in every merge call."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        self._topic = topic
        self._stop = threading.Event()
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="live-producer", daemon=True)

    def __enter__(self) -> _LiveProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._producer.flush(10)

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            for _ in range(5):
                self._producer.produce(self._topic, f"live{self.sent}".encode(), partition=0)
                self.sent += 1
            self._producer.poll(0)


#: the child's handles broken in a row before the backfill may go on
BROKEN_HANDLES = 3


def _break_the_childs_handles(consumer: Consumer) -> Any:
    """Close the child's librdkafka consumer right after each of its fetches, until BROKEN_HANDLES
    handles were replaced: every later call on a closed one raises, wherever the child makes it (its
    next fetch, a check of its positions after an empty fetch, the start of its next range)."""

    def action() -> None:
        child = mode_of(consumer).child
        if consumer.metrics().child_restarts < BROKEN_HANDLES and child._h._consumer is not None:
            child._h._consumer.close()

    return action


def test_a_child_handle_that_breaks_mid_merge_loses_no_record_and_raises_nothing(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    topic: str = topic_factory(partitions=1)
    lag_after_crash(
        bootstrap,
        topic,
        unique_group,
        store_url,
        tmp_path,
        produced=100,
        commit_at=LAG_START,
        block_at=40,
        log_end=LOG_END,
    )
    consumer = Consumer(
        parallel_config(
            bootstrap,
            unique_group,
            store_url,
            **{"fastrecover.store.retry.backoff.ms": 100, "fastrecover.backfill.batch.size": 200},
        )
    )
    got: list[Message] = []
    escaped: list[BaseException] = []

    def delivered() -> set[int]:
        try:
            got.extend(m for m in consumer.consume(100, 0.2) if m.error() is None)
        except Exception as exc:  # an application that logs and goes on, as most do
            escaped.append(exc)
        return {m.offset() or 0 for m in got}

    try:
        consumer.subscribe([topic])
        hooks.register("child-batch", _break_the_childs_handles(consumer))
        with _LiveProducer(bootstrap, topic) as live:
            lag = set(range(LAG_START, LOG_END))
            wait_for(lambda: bool(escaped) or delivered() >= lag, 120, 0.001, "the lag, the child's handle broken")
            assert not escaped, f"consume() raised the child's failure at the application: {escaped[0]!r}"
        wanted = set(range(LAG_START, LOG_END + live.sent))
        wait_for(lambda: bool(escaped) or delivered() >= wanted, 60, 0.001, f"every record to {LOG_END + live.sent}")
        assert not escaped, f"consume() raised the child's failure at the application: {escaped[0]!r}"
        assert consumer.metrics().child_restarts >= BROKEN_HANDLES
    finally:
        hooks.clear()
        consumer.close()
