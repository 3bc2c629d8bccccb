"""Range reads as a task does them (fastrecover.spark.kafka), against the real broker, without Spark."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from fastrecover.spark.kafka import DataLossError, LogView, _close_consumers, read_pieces
from fastrecover.spark.offsets import LogBounds, Piece
from fastrecover.spark.source import arrow_schema
from fastrecover.tokens import TopicPartitionKey
from fastrecover_tools.testing.broker import produce
from tests.fixtures.broker import TopicFactory

pytestmark = [pytest.mark.integration]


@pytest.fixture(autouse=True, scope="module")
def _closed_readers() -> Iterator[None]:
    """read_pieces keeps a consumer per configuration for the process (a Spark worker's life); this
    process is the test session, so they are closed when the module is done."""
    yield
    _close_consumers()


def read_offsets(bootstrap: str, pieces: list[Piece], *, fail_on_data_loss: bool = True) -> list[int]:
    out: list[int] = []
    for batch in read_pieces(
        {"bootstrap.servers": bootstrap}, pieces, arrow_schema(), fail_on_data_loss=fail_on_data_loss, timeout_s=30
    ):
        out.extend(batch.column("offset").to_pylist())
    return out


def test_reads_exactly_the_pieces_with_the_source_schema(bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"v{i}" for i in range(50)], partition=0, key=b"k")
    pieces = [Piece(topic, 0, 40, 45, False), Piece(topic, 0, 3, 7, True)]
    batches = list(
        read_pieces({"bootstrap.servers": bootstrap}, pieces, arrow_schema(), fail_on_data_loss=True, timeout_s=30)
    )
    rows = [row for b in batches for row in b.to_pylist()]
    assert [r["offset"] for r in rows] == [40, 41, 42, 43, 44, 3, 4, 5, 6]
    assert [r["backfill"] for r in rows] == [False] * 5 + [True] * 4
    assert rows[0]["value"] == b"v40" and rows[0]["key"] == b"k" and rows[0]["topic"] == topic
    assert rows[0]["timestampType"] == 0 and rows[0]["timestamp"] is not None
    assert LogView({"bootstrap.servers": bootstrap}).bounds([TopicPartitionKey(topic, 0)]) == {
        TopicPartitionKey(topic, 0): LogBounds(0, 50)
    }


def test_transaction_markers_inside_and_at_the_end_of_a_piece_are_passed(
    bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=1)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    for txn in range(3):
        producer.begin_transaction()
        for i in range(4):
            producer.produce(topic, value=f"t{txn}-{i}".encode(), partition=0)
        producer.commit_transaction(30)
    # Offsets: 4 records + 1 commit marker per transaction -> the log ends at 15 with a marker at 14.
    high = (
        LogView({"bootstrap.servers": bootstrap})
        .bounds([TopicPartitionKey(topic, 0)])[TopicPartitionKey(topic, 0)]
        .high
    )
    assert high == 15
    got = read_offsets(bootstrap, [Piece(topic, 0, 0, high, False)])
    assert got == [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13]


def test_records_lost_to_retention_follow_fail_on_data_loss(bootstrap: str, topic_factory: TopicFactory) -> None:
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"v{i}" for i in range(30)], partition=0)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 20)]).values():
        future.result(30)
    with pytest.raises(DataLossError, match=r"records \[10, 20\)"):
        read_offsets(bootstrap, [Piece(topic, 0, 10, 25, True)])
    assert read_offsets(bootstrap, [Piece(topic, 0, 10, 25, True)], fail_on_data_loss=False) == list(range(20, 25))
    assert read_offsets(bootstrap, [Piece(topic, 0, 0, 10, True)], fail_on_data_loss=False) == []
