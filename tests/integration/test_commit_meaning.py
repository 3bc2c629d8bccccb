"""``commit(message=m)`` means what it means in Kafka, inside a backfilled range too.

An application that processes records in order and commits every Nth one says
"everything up to m is done".  Inside a range that must finish the range, move
``committed()`` to its end and leave Kafka's offset there after ``close()``;
``fastrecover.commit.out.of.order`` is the opt-in for marking m alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Message, TopicPartition

from fastrecover import Consumer
from fastrecover.store import open_store
from fastrecover_tools.testing.broker import group_is_empty, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import group_offsets, offset_of, parallel_config

START = 100
END = 5_100
EVERY = 5


def _lag(bootstrap: str, topic: str, group: str) -> None:
    produce(bootstrap, topic, [f"r{i}" for i in range(END)], partition=0)
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, START)], asynchronous=False)
    finally:
        plain.close()


def _config(bootstrap: str, group: str, store_url: str, how: str, **extra: Any) -> dict[str, Any]:
    if how == "store_offsets":
        extra = {"enable.auto.commit": True, "auto.commit.interval.ms": 200, "enable.auto.offset.store": False, **extra}
    return parallel_config(bootstrap, group, store_url, **extra)


def _consume_committing_every_nth(consumer: Consumer, how: str) -> list[Message]:
    """Deliver the whole range, committing (or storing) every EVERY-th record in order."""
    got: list[Message] = []

    def step() -> bool:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            got.append(msg)
            if len(got) % EVERY == 0:
                if how == "sync":
                    consumer.commit(message=msg, asynchronous=False)
                elif how == "async":
                    consumer.commit(message=msg)
                else:
                    consumer.store_offsets(message=msg)
        return len({offset_of(m) for m in got}) >= END - START

    wait_for(step, 90, interval=0.001, what=f"the {END - START} backfilled records")
    return got


@pytest.mark.parametrize("how", ["sync", "async", "store_offsets"])
def test_committing_every_nth_record_in_order_finishes_the_range(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, how: str
) -> None:
    topic = topic_factory(partitions=1)
    _lag(bootstrap, topic, unique_group)
    consumer = Consumer(_config(bootstrap, unique_group, store_url, how))
    try:
        consumer.subscribe([topic])
        got = _consume_committing_every_nth(consumer, how)
        assert offset_of(got[-1]) == END - 1 and len(got) % EVERY == 0, "the last record was committed too"

        def finished() -> bool:
            consumer.poll(0.05)  # the write-behind and auto-commit run inside poll()
            (answer,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
            return answer.offset == END

        wait_for(finished, 30, interval=0.01, what=f"committed() to reach {END}")
        with open_store(store_url) as store:
            assert store.open_ranges(unique_group) == [], "the range finished"
    finally:
        consumer.close()
    wait_for(lambda: group_is_empty(bootstrap, unique_group), 30, 0.2, "the consumer to leave")
    (kafka,) = group_offsets(bootstrap, unique_group, topic)
    assert kafka.offset == END, "Kafka's offset is at the end: a lag monitor sees no lag"


def test_out_of_order_commits_mark_each_record_alone_when_asked_to(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    topic = topic_factory(partitions=1)
    _lag(bootstrap, topic, unique_group)
    consumer = Consumer(
        _config(bootstrap, unique_group, store_url, "sync", **{"fastrecover.commit.out.of.order": True})
    )
    try:
        consumer.subscribe([topic])
        _consume_committing_every_nth(consumer, "sync")
        (answer,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        assert answer.offset == START, "only every fifth record is finished: the range's committed offset stays"
        with open_store(store_url) as store:
            (token,) = store.open_ranges(unique_group)
        assert token.progress.committed == START
        assert len(token.progress.completed) == (END - START) // EVERY
    finally:
        consumer.close()
