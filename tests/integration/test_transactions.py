"""A lag written by transactional producers: committed, aborted and still open transactions.

Exactly-once pipelines (Kafka Streams, a transactional producer) leave commit and abort markers
in the log, aborted records between them, and, at a crash, transactions still open above the last
stable offset (LSO).  Under ``read_committed`` (librdkafka's default) the recovery's log end is the
LSO: the child's range ends there and finishes although its last offsets are markers it never
receives, and the open transaction's records, above the LSO, come from the primary once committed.
Under ``read_uncommitted`` the log end is the high watermark and every record is read, as a plain
consumer would.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Message, Producer, TopicPartition

from fastrecover import Consumer
from fastrecover.store import open_store
from fastrecover.tokens import TokenState
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import consume_until, parallel_config

pytestmark = pytest.mark.integration

COMMITTED_A, ABORTED_B, COMMITTED_C, OPEN_D, FRESH_E = 100, 50, 100, 20, 10
#: records and one marker per transaction: a [0, 100) + marker, b [101, 151) + marker, c [152, 252) + marker
LSO = COMMITTED_A + 1 + ABORTED_B + 1 + COMMITTED_C + 1
HIGH_WATERMARK = LSO + OPEN_D


def _transactional(bootstrap: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    return producer


def _write(producer: Producer, topic: str, tag: str, count: int) -> None:
    producer.begin_transaction()
    for i in range(count):
        producer.produce(topic, value=f"{tag}{i}".encode(), partition=0)
    producer.flush(30)


def _values(got: list[Message]) -> list[str]:
    return [bytes(m.value() or b"").decode() for m in got]


def _tagged(*tags: tuple[str, int]) -> set[str]:
    return {f"{tag}{i}" for tag, count in tags for i in range(count)}


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_a_lag_of_transactions_is_backfilled_to_its_stable_end_and_the_open_one_follows_its_commit(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, isolation: str
) -> None:
    topic = topic_factory(partitions=1)
    Consumer(parallel_config(bootstrap, unique_group, store_url)).close()  # the store's schema
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": unique_group})
    try:  # a member that crashed before it read anything
        plain.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        plain.close()
    producer, other = _transactional(bootstrap), _transactional(bootstrap)
    for tag, count, commit in (("a", COMMITTED_A, True), ("b", ABORTED_B, False), ("c", COMMITTED_C, True)):
        _write(producer, topic, tag, count)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    _write(other, topic, "d", OPEN_D)  # still open when the consumer starts

    committed = isolation == "read_committed"
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url, **{"isolation.level": isolation}))
    got: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])
        (report,) = consumer.recoveries
        end = LSO if committed else HIGH_WATERMARK
        assert (report.committed, report.log_end, report.primary_start) == (0, end, end)
        assert [(r.start, r.end) for r in report.new_ranges] == [(0, end)]

        lag = _tagged(("a", COMMITTED_A), ("c", COMMITTED_C)) | (
            set() if committed else _tagged(("b", ABORTED_B), ("d", OPEN_D))
        )
        consume_until(consumer, got, lambda: set(_values(got)) >= lag, 60, "the lag")
        with open_store(store_url) as store:
            (token,) = store.ranges(unique_group)

        def range_done() -> bool:
            consumer.consume(100, 0.05)
            consumer.commit(asynchronous=True)
            with open_store(store_url) as store:
                return store.get(token.id).state is TokenState.DONE

        wait_for(range_done, 60, 0.01, "the range, whose last offset is a marker, to finish")
        assert set(_values(got)) == lag, "nothing of an aborted or open transaction under read_committed"

        other.commit_transaction(30)
        _write(producer, topic, "e", FRESH_E)
        producer.commit_transaction(30)
        everything = lag | _tagged(("d", OPEN_D), ("e", FRESH_E))
        consume_until(
            consumer, got, lambda: set(_values(got)) >= everything, 60, "the open transaction, then fresh records"
        )
        values = _values(got)
        assert set(values) == everything
        assert len(values) == len(everything), "each record once"
    finally:
        consumer.close()
