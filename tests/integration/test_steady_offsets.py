"""The steady state (mode on, no range) keeps no record: what the primary returned comes from its positions.

Each test runs the same calls on a plain ``confluent_kafka.Consumer`` and on a
``fastrecover.Consumer`` with the mode on, on a real broker, and compares the
offsets Kafka ends up with.  fastrecover stores a record's offset one call late
(when the application comes back for more), so where the two may differ the
test says which way: fastrecover never commits a record the application may
still be working on.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from fastrecover import Consumer
from fastrecover_tools.testing.broker import produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import group_offsets, mode_of, parallel_config

pytestmark = pytest.mark.integration

RECORDS = 200


def _subscribed(
    mode: str, bootstrap: str, topic_factory: Any, group: str, store_url: str, records: int = RECORDS, **extra: Any
) -> tuple[str, Any]:
    """A one-partition topic of ``records`` records, and a consumer of ``mode`` subscribed to it."""
    topic: str = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(records)], partition=0)
    conf = {"auto.offset.reset": "earliest", **extra}
    if mode == "plain":
        consumer: Any = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group, **conf})
    else:
        consumer = Consumer(parallel_config(bootstrap, group, store_url, **conf))
    consumer.subscribe([topic])
    return topic, consumer


def _offset(msg: Message) -> int:
    offset = msg.offset()
    assert offset is not None
    return offset


def _records(consumer: Any, count: int, api: str = "poll") -> list[Message]:
    """The next ``count`` records, one poll() each or consume() batches (the first may take a rebalance)."""
    got: list[Message] = []

    def step() -> bool:
        if api == "poll":
            msg = consumer.poll(0.2)
            batch = [msg] if msg is not None else []
        else:
            batch = consumer.consume(count - len(got), 0.2)
        got.extend(m for m in batch if m.error() is None)
        return len(got) >= count

    wait_for(step, 60, 0.001, f"{count} records")
    return got


def _committed(result: list[TopicPartition] | None) -> list[tuple[int, int]]:
    return [(tp.partition, tp.offset) for tp in result or []]


@pytest.mark.parametrize("api", ["poll", "consume"])
@pytest.mark.parametrize("mode", ["plain", "fastrecover"])
def test_an_offset_less_commit_in_the_steady_state_commits_every_record_returned_so_far(
    mode: str, api: str, bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    topic, consumer = _subscribed(
        mode, bootstrap, topic_factory, unique_group, store_url, **{"enable.auto.commit": False}
    )
    try:
        got = _records(consumer, 57, api)
        assert mode == "plain" or (mode_of(consumer).steady and mode_of(consumer).offsets.untracked)
        assert _committed(consumer.commit(asynchronous=False)) == [(0, _offset(got[-1]) + 1)]
        more = _records(consumer, 23, api)
        assert _committed(consumer.commit(asynchronous=False)) == [(0, _offset(more[-1]) + 1)]
    finally:
        consumer.close()
    assert group_offsets(bootstrap, unique_group, topic)[0].offset == _offset(more[-1]) + 1


def _kafka_offset(bootstrap: str, group: str, topic: str) -> int:
    return int(group_offsets(bootstrap, group, topic)[0].offset)


def test_auto_commit_in_the_steady_state_never_commits_the_record_the_application_is_working_on(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    auto = {"enable.auto.commit": True, "auto.commit.interval.ms": 100}
    topic, consumer = _subscribed("fastrecover", bootstrap, topic_factory, unique_group, store_url, 39, **auto)
    fr = mode_of(consumer)
    key = (topic, 0)

    def idle_and_stored(offset: int) -> bool:  # the application keeps coming back while nothing arrives
        return consumer.poll(0.05) is None and fr.offsets.done.get(key) == offset

    try:
        _records(consumer, 39)
        assert fr.steady and fr.offsets.untracked  # no range: the untracked path served every record
        wait_for(lambda: idle_and_stored(39), 30, 0.01, "records 0-38 stored")
        wait_for(lambda: _kafka_offset(bootstrap, unique_group, topic) == 39, 30, 0.05, "offset 39 auto-committed")
        produce(bootstrap, topic, ["r39"], partition=0)
        (working,) = _records(consumer, 1)
        assert _offset(working) == 39
        # The application works on record 39 and has not come back: what librdkafka's offset store
        # holds (all that auto-commit can commit) is still 39, with nothing newer pending.
        assert fr.offsets.done.get(key) == 39 and key not in fr.offsets.dirty
        assert _kafka_offset(bootstrap, unique_group, topic) == 39
        # It comes back for more: record 39 is done, a call's tick stores it, auto-commit follows.
        wait_for(lambda: idle_and_stored(40), 30, 0.01, "record 39 stored")
        wait_for(lambda: _kafka_offset(bootstrap, unique_group, topic) == 40, 30, 0.05, "offset 40 auto-committed")
    finally:
        consumer.close()


@pytest.mark.parametrize("mode", ["plain", "fastrecover"])
def test_a_seek_in_the_steady_state_stores_nothing_until_a_record_from_the_new_position_is_returned(
    mode: str, bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    topic, consumer = _subscribed(
        mode, bootstrap, topic_factory, unique_group, store_url, **{"enable.auto.commit": False}
    )
    try:
        got = _records(consumer, 10)
        consumer.seek(TopicPartition(topic, 0, 150))
        # Nothing from 150 was returned: what is stored is still the last record returned + 1.
        assert _committed(consumer.commit(asynchronous=False)) == [(0, _offset(got[-1]) + 1)]
        after = _records(consumer, 1)
        assert _offset(after[0]) == 150
        # A record from 150 came: a second seek hides 151, which is what counts now (not the 10 kept
        # at the first seek).
        consumer.seek(TopicPartition(topic, 0, 20))
        assert _committed(consumer.commit(asynchronous=False)) == [(0, 151)]
        # Back at 20, a record returned stores 21; librdkafka commits no offset below the committed
        # one and says there is nothing to commit, on plain and on fastrecover alike.
        assert _offset(_records(consumer, 1)[0]) == 20
        with pytest.raises(KafkaException) as nothing:
            consumer.commit(asynchronous=False)
        assert nothing.value.args[0].code() == KafkaError._NO_OFFSET
    finally:
        consumer.close()
