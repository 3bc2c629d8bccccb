"""A recovery that cannot plan a partition still keeps the ranges its marker owes.

A recovery that jumped on Kafka's marker while the store opened leaves the ranges in the commit
metadata alone until the store takes them.  If that member dies first, the marker is their only
record.  The next member may fail to plan the partition (the cluster id or the log end unavailable):
it then starts at the committed offset like a plain consumer, and its first commit would erase the
marker.  It keeps the marker's unfinished ranges parked instead, so its commits carry them on and a
later recovery reads them.  Real broker, real store; the cluster id's absence is injected.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from confluent_kafka import Message, TopicPartition

from fastrecover import Consumer
from fastrecover.book import mirror_context
from fastrecover.codec import read_marker
from fastrecover.store import open_store
from fastrecover.tokens import TopicPartitionKey
from fastrecover_tools.testing.broker import produce
from fastrecover_tools.testing.waiting import wait_for
from tests.fixtures.stores import hold_store_opens
from tests.integration.dropin import make_lag
from tests.integration.helpers import (
    close_as_crashed,
    consume_until,
    group_offsets,
    mode_of,
    offset_of,
    parallel_config,
)

pytestmark = pytest.mark.integration

COMMITTED = 20
LOG_END = 20_000  # a lag the first member cannot drain in the few calls it makes before its crash
FRESH = 10


def _config(bootstrap: str, group: str, store_url: str) -> dict[str, Any]:
    """Jumps on the marker while its store opens (the lag is above the replay limit); a slow backfill."""
    return parallel_config(
        bootstrap,
        group,
        store_url,
        **{
            "fastrecover.recovery.replay.max.offsets": 100,
            "fastrecover.recovery.jump.on.mirror": True,
            "fastrecover.backfill.queue.max.messages": 20,
            "fastrecover.backfill.batch.size": 10,
        },
    )


def _marker(bootstrap: str, group: str, topic: str) -> tuple[int, list[tuple[int, int]]]:
    (kafka,) = group_offsets(bootstrap, group, topic)
    marker = read_marker(kafka.metadata, context=mirror_context(group, TopicPartitionKey(topic, 0)))
    assert marker is not None, f"no fastrecover marker in Kafka's metadata {kafka.metadata!r}"
    return kafka.offset, [(r.start, r.end) for r in marker.ranges if not r.done]


def _commit_progress(consumer: Consumer, got: list[Message], bootstrap: str, group: str, topic: str, start: int) -> int:
    """Read ``FRESH`` new records (from offset ``start``), commit them, and wait for Kafka to show it."""
    produce(bootstrap, topic, [f"fresh{i}" for i in range(FRESH)], partition=0)
    want = set(range(start, start + FRESH))
    consume_until(consumer, got, lambda: want <= {offset_of(m) for m in got}, 30, "the fresh records")
    consumer.commit(asynchronous=True)

    def landed() -> bool:
        consumer.poll(0.05)
        return group_offsets(bootstrap, group, topic)[0].offset == start + FRESH

    wait_for(landed, 30, 0.01, "the primary's commit of its fresh records")
    return start + FRESH


def test_a_member_that_cannot_plan_keeps_the_ranges_only_the_marker_holds(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    topic = topic_factory(partitions=1)
    make_lag(bootstrap, topic, unique_group, committed=COMMITTED, log_end=LOG_END)
    hold_store_opens(store_gate)
    delivered: set[int] = set()

    first = Consumer(_config(bootstrap, unique_group, store_url))
    got: list[Message] = []
    try:
        first.assign([TopicPartition(topic, 0)])
        assert first.recoveries[0].primary_start == LOG_END, "the first member jumped on the marker"
        first_end = _commit_progress(first, got, bootstrap, unique_group, topic, LOG_END)
    finally:
        delivered |= {offset_of(m) for m in got}
        close_as_crashed(first)
    owed = set(range(COMMITTED, LOG_END)) - delivered
    assert owed, "the test needs records of the jumped range still owed at the crash"
    with open_store(store_url) as store:
        assert store.ranges(unique_group) == [], "the marker is the ranges' only record"
    store_gate.set()

    second = Consumer(_config(bootstrap, unique_group, store_url))
    mode_of(second).recoverer._reads._cluster_of = lambda _topic: None  # the broker cannot say its cluster id
    got = []
    try:
        second.assign([TopicPartition(topic, 0)])
        assert not second.recoveries, "no recovery: the partition starts at its committed offset"
        committed = _commit_progress(second, got, bootstrap, unique_group, topic, first_end)
        offset, ranges = _marker(bootstrap, unique_group, topic)
        assert offset == committed and ranges, "the second member's commit still carries the owed ranges"
    finally:
        delivered |= {offset_of(m) for m in got}
        close_as_crashed(second)

    third = Consumer(parallel_config(bootstrap, unique_group, store_url))
    got = []
    try:
        third.assign([TopicPartition(topic, 0)])
        consume_until(third, got, lambda: owed <= {offset_of(m) for m in got}, 60, "every owed record")
    finally:
        third.close()
