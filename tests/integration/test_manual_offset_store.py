"""enable.auto.offset.store=false with the mode on: no record is kept by the consumer, explicit stores commit.

Without the auto offset store, poll()/consume() used to append every returned
record to a list that nothing reads in that mode (a leak of every message).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from fastrecover import Consumer
from fastrecover.store import open_store
from fastrecover.tokens import TopicPartitionKey
from fastrecover_tools.testing.broker import produce
from tests.integration.helpers import consume_until, group_offsets, lag_after_crash, mode_of, offset_of, parallel_config


def _read_backfill_and_live(consumer: Consumer, bootstrap: str, topic: str) -> list[Message]:
    """Subscribe after the crash, then read the range [20, 2000) and 50 live records (2000..2049)."""
    consumer.subscribe([topic])
    got: list[Message] = []
    consume_until(consumer, got, lambda: len(got) >= 1, 60, "the first record after the restart")
    produce(bootstrap, topic, [f"live{i}" for i in range(50)], partition=0)  # for the primary: 2000..2049
    consume_until(
        consumer,
        got,
        lambda: {m.offset() for m in got} >= set(range(20, 2050)),
        60,
        "the backfill and the live records",
    )
    return got


def test_manual_store_keeps_no_records_and_commits_what_was_stored(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=1)
    lag_after_crash(
        bootstrap, topic, unique_group, store_url, tmp_path, produced=50, commit_at=20, block_at=50, log_end=2000
    )
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url, **{"enable.auto.offset.store": False}))
    store = open_store(store_url)
    try:
        got = _read_backfill_and_live(consumer, bootstrap, topic)
        for _ in range(5):
            consumer.consume(500, 0.05)
        # nothing reads them without the auto offset store, so nothing beyond one call is kept
        assert mode_of(consumer) is not None
        assert len(mode_of(consumer).offsets.unsettled) <= 500
        assert len(mode_of(consumer).streams.child_runs) <= 500
        for msg in got:
            consumer.store_offsets(message=msg)
        consumer.commit(asynchronous=False)
        assert group_offsets(bootstrap, unique_group, topic)[0].offset == 2050
        assert store.open_ranges(unique_group) == []
    finally:
        store.close()
        consumer.close()


def test_stored_offsets_under_auto_commit_are_never_moved_back_when_a_range_finishes_later(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    """The asynchronous path of session 5's floor bug.

    The partition recovers with a range and a *floor* (the primary's start, 2000), committed once
    the range finishes if the primary committed nothing. Here the application stores the live
    records' offsets (2050) first and auto-commit sends them; the range finishes afterwards, through
    write-behind. The floor must be gone by then, or its asynchronous commit moves Kafka's offset
    back to 2000 (re-delivering 50 records after the next restart).
    """
    topic = topic_factory(partitions=2)  # partition 1 stays empty: a barrier for the commits of partition 0
    lag_after_crash(
        bootstrap, topic, unique_group, store_url, tmp_path, produced=50, commit_at=20, block_at=50, log_end=2000
    )
    config = parallel_config(
        bootstrap,
        unique_group,
        store_url,
        **{
            "enable.auto.offset.store": False,
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 100,
            "fastrecover.backfill.commit.interval.ms": 100,
        },
    )
    consumer = Consumer(config)
    store = open_store(store_url)
    key = TopicPartitionKey(topic, 0)

    def kafka_offset() -> int:
        return group_offsets(bootstrap, unique_group, topic)[0].offset

    try:
        got = _read_backfill_and_live(consumer, bootstrap, topic)
        fr = mode_of(consumer)
        assert fr is not None
        assert fr.partitions.floor(key) == 2000, "the recovery must have set the floor this test is about"
        for msg in got:
            if offset_of(msg) >= 2000:
                consumer.store_offsets(message=msg)
        # a partition with ranges routes per-message stores in bulk at the next tick (before it looks
        # at finished ranges): storing the primary's own offset must drop the floor there
        consume_until(
            consumer, [], lambda: fr.partitions.floor(key) is None, 10, "the stored offsets to drop the floor"
        )
        consume_until(consumer, [], lambda: kafka_offset() == 2050, 30, "auto-commit of the stored 2050")
        for msg in got:
            if offset_of(msg) < 2000:
                consumer.store_offsets(message=msg)
        consume_until(
            consumer,
            [],
            lambda: not store.open_ranges(unique_group) and not fr.partitions.routes,
            30,
            "the range to finish",
        )
        # a floor commit would have been sent (asynchronously) on the tick that saw the range finish;
        # a synchronous commit on the same coordinator, of the other partition, completes after it
        consumer.commit(offsets=[TopicPartition(topic, 1, 0)], asynchronous=False)
        assert kafka_offset() == 2050, "Kafka's offset moved back after the range finished"
    finally:
        store.close()
        consumer.close()
    assert kafka_offset() == 2050


def test_an_error_event_of_a_partition_with_ranges_is_refused_as_plain_refuses_it(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    """store_offsets() and commit() of an EOF event never route its offset (the log end) as a record.

    Per-message calls of a partition with ranges keep only the record's offset until the next tick,
    so the event must be refused before that: routed as a record, its offset (here 2050, the next
    record to be produced) would be committed and that record never consumed by the group.
    """
    topic = topic_factory(partitions=1)
    lag_after_crash(
        bootstrap, topic, unique_group, store_url, tmp_path, produced=50, commit_at=20, block_at=50, log_end=2000
    )
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url, **{"enable.auto.offset.store": False}))
    try:
        got = _read_backfill_and_live(consumer, bootstrap, topic)
        fr = mode_of(consumer)
        assert fr is not None and TopicPartitionKey(topic, 0) in fr.partitions.routes, "the range must still be open"
        eof = Message(topic=topic, partition=0, offset=2050, error=KafkaError(KafkaError._PARTITION_EOF))
        calls: dict[str, Callable[[], object]] = {
            "store_offsets": lambda: consumer.store_offsets(message=eof),
            "commit async": lambda: consumer.commit(message=eof),
            "commit sync": lambda: consumer.commit(message=eof, asynchronous=False),
        }
        for name, call in calls.items():
            with pytest.raises(KafkaException) as raised:
                call()
            assert raised.value.args[0].code() == KafkaError._INVALID_ARG, name
        live = max(got, key=offset_of)
        consumer.store_offsets(message=live)  # the last live record, 2049: Kafka's offset may reach 2050 only
        consumer.consume(1, 0.2)  # a tick routes what was deferred
        consumer.commit(asynchronous=False)
        assert group_offsets(bootstrap, unique_group, topic)[0].offset == 2050
    finally:
        consumer.close()
