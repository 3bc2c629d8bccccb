"""A lag on a compacted topic: the range's offsets that compaction emptied are gaps, and the range still finishes.

Compacted topics (changelogs, tables of latest values) are common in production.  The log cleaner
removes every record a later record of the same key replaces, so a range [C, E) on such a topic
holds offsets with no record.  The child must deliver every record that is left, count the emptied
offsets as finished, and finish the range, so that Kafka's offset can move past it: a range waiting
for an offset that holds no record would hold the group's offset back for good.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Message, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from fastrecover import Consumer
from fastrecover.store import open_store
from fastrecover_tools.testing.broker import Record, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.dropin import commit_offsets
from tests.integration.helpers import consume_until, drain_and_commit, offset_of, parallel_config

pytestmark = pytest.mark.integration

#: records produced before compaction: even offsets with keys of their own, odd ones all replacing one key
RECORDS = 600
COMMITTED = 100
LIVE = 20
#: how often the broker's log cleaner looks for work while this test runs (Kafka's default: 15 s)
CLEANER_BACKOFF_MS = "200"

COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",  # the cleaner never touches the active segment: the next record rolls it
    "min.cleanable.dirty.ratio": "0.001",
    "min.compaction.lag.ms": "0",
}


@pytest.fixture
def fast_cleaner(bootstrap: str) -> Iterator[None]:
    """Every broker's log cleaner looks for work every 200 ms while the test runs (a dynamic broker setting)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    brokers = [str(b) for b in admin.list_topics(timeout=30).brokers]

    def set_backoff(op: AlterConfigOpType, value: str | None) -> None:
        entry = ConfigEntry("log.cleaner.backoff.ms", value, incremental_operation=op)
        resources = [ConfigResource(ResourceType.BROKER, b, incremental_configs=[entry]) for b in brokers]
        for future in admin.incremental_alter_configs(resources).values():
            future.result(timeout=30)

    set_backoff(AlterConfigOpType.SET, CLEANER_BACKOFF_MS)
    try:
        yield
    finally:
        set_backoff(AlterConfigOpType.DELETE, None)


def _records_left(bootstrap: str, topic: str) -> list[int]:
    """The offsets that hold a record, read from the log start by a consumer of no group."""
    reader = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    try:
        low, high = reader.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        reader.assign([TopicPartition(topic, 0, low)])
        got: list[int] = []

        def read() -> bool:
            got.extend(offset_of(m) for m in reader.consume(500, 0.2) if m.error() is None)
            return bool(got) and got[-1] >= high - 1

        wait_for(read, 30, 0.001, f"the log of {topic} up to offset {high - 1}")
        return got
    finally:
        reader.close()


def _compacted(bootstrap: str, topic: str, done: Callable[[list[int]], bool], what: str) -> list[int]:
    """Roll the segment until the cleaner has compacted it as ``done`` says; the offsets left then.

    The cleaner never touches the active segment, and a segment rolls at the first append past
    ``segment.ms``: each look appends a record, of a key of its own so that no later pass removes it.
    """
    left: list[int] = []
    rolls = itertools.count()

    def look() -> bool:
        produce(bootstrap, topic, [Record("roll", key=f"roll{next(rolls)}", partition=0)])
        left[:] = _records_left(bootstrap, topic)
        return done(left)

    wait_for(look, 90, 0.3, what)
    return left


@pytest.mark.usefixtures("fast_cleaner")
def test_a_range_over_compacted_offsets_delivers_what_is_left_and_finishes(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    topic = topic_factory(partitions=1, config=COMPACTED)
    produce(
        bootstrap,
        topic,
        [Record(f"v{i}", key=f"k{i}" if i % 2 == 0 else "hot", partition=0) for i in range(RECORDS)],
    )
    left = _compacted(
        bootstrap, topic, lambda left: len(left) < RECORDS // 2 + 10, "the log cleaner to remove the replaced records"
    )
    log_end = left[-1] + 1
    in_range = {o for o in left if COMMITTED <= o < log_end}
    assert len(in_range) < (log_end - COMMITTED) * 3 // 4, "the range holds offsets with no record"

    commit_offsets(bootstrap, unique_group, [TopicPartition(topic, 0, COMMITTED)])

    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    got: list[Message] = []
    try:
        consumer.subscribe([topic])
        consume_until(consumer, got, lambda: bool(consumer.recoveries), 60, "the recovery")
        (report,) = consumer.recoveries
        assert [(r.start, r.end) for r in report.new_ranges] == [(COMMITTED, log_end)], report
        live = produce(bootstrap, topic, [Record(f"live{i}", key=f"live{i}", partition=0) for i in range(LIVE)])
        wanted = in_range | {d.offset for d in live}
        drain_and_commit(consumer, got, TopicPartition(topic, 0), wanted)
    finally:
        consumer.close()
    offsets = [offset_of(m) for m in got]
    assert not set(offsets) - wanted - set(range(COMMITTED)), "only records of the log were delivered"
    store = open_store(store_url)
    try:
        assert store.open_ranges(unique_group) == [], "the range over the emptied offsets finished"
    finally:
        store.close()


@pytest.mark.usefixtures("fast_cleaner")
def test_records_compacted_away_while_the_range_waits_are_gaps_and_the_range_finishes(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    """The cleaner empties the range's last offsets after the recovery, while the partition is paused.

    The live records replace the keys of the range's last records; once they roll the segment, the
    cleaner removes those records.  On resume the child reads from its cursor, finds the next record
    at the log end it recovered at or above (the primary's), and the range is finished.
    """
    topic = topic_factory(partitions=1, config=COMPACTED)
    produce(bootstrap, topic, [Record(f"v{i}", key=f"k{i}", partition=0) for i in range(RECORDS)])
    replaced = range(RECORDS - 50, RECORDS)
    commit_offsets(bootstrap, unique_group, [TopicPartition(topic, 0, COMMITTED)])

    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    got: list[Message] = []
    try:
        partition = [TopicPartition(topic, 0)]
        consumer.assign(partition)  # recovery runs here: range [COMMITTED, RECORDS), the primary at RECORDS
        consumer.pause(partition)  # before the child hands out anything
        (report,) = consumer.recoveries
        assert [(r.start, r.end) for r in report.new_ranges] == [(COMMITTED, RECORDS)], report
        produce(bootstrap, topic, [Record(f"new{i}", key=f"k{i}", partition=0) for i in replaced])
        left = _compacted(
            bootstrap,
            topic,
            lambda left: not set(replaced) & set(left),
            "the log cleaner to remove the range's replaced records",
        )
        consumer.resume(partition)
        wanted = {o for o in left if o >= COMMITTED}  # the range's records left, the new ones and the rolls
        assert set(range(COMMITTED, RECORDS - len(replaced))) <= wanted
        drain_and_commit(consumer, got, partition[0], wanted)
    finally:
        consumer.close()
    delivered = {offset_of(m) for m in got}
    assert delivered <= set(range(COMMITTED, max(wanted) + 1))
    # nothing was handed out before the pause: the child read the range after the cleaner emptied its end
    assert not delivered & set(replaced), "records the cleaner removed were delivered: the range was read before"
    store = open_store(store_url)
    try:
        assert store.open_ranges(unique_group) == [], "the range whose last offsets were emptied finished"
    finally:
        store.close()
