"""A recovery that jumps names its Kafka cluster from what the primary's client already knows.

The lineage of every new range names the cluster, so a jump needs the cluster's id.  Once the
primary's client has had a metadata response, it holds the id: the consumer reads it between the
waits of the join, and the recovery in the rebalance callback uses it, with no child handle and no
metadata request made for it.  Here the client has metadata before the join starts (the test lists
the topic through it first), so the first wait of the join finds the id whatever the join's timing.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Message, TopicPartition

from fastrecover import Consumer
from fastrecover.child import ChildReader
from fastrecover.codec import cluster_label, lineage_cluster
from fastrecover.store import open_store
from fastrecover_tools.testing.broker import produce
from tests.integration.helpers import consume_until, offset_of, parallel_config

pytestmark = pytest.mark.integration

COMMITTED, LOG_END = 20, 700


def test_a_jump_after_the_join_names_this_cluster_without_the_childs_handle(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(LOG_END)], partition=0)
    Consumer(parallel_config(bootstrap, unique_group, store_url)).close()  # no partition: only the schema
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": unique_group})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, COMMITTED)], asynchronous=False)
        cluster = plain.list_topics(timeout=30).cluster_id
    finally:
        plain.close()

    def refuse(self: ChildReader, topic: str) -> str | None:
        raise AssertionError(f"the cluster of {topic} was asked through the child's handle")

    monkeypatch.setattr(ChildReader, "cluster_id", refuse)
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    got: list[Message] = []
    try:
        assert consumer.list_topics(topic, timeout=30).cluster_id == cluster
        consumer.subscribe([topic])
        consume_until(consumer, got, lambda: bool(consumer.recoveries), 60, "the join and its recovery")
        (report,) = consumer.recoveries
        assert (report.primary_start, report.degraded) == (LOG_END, False), "jumped on the stored token"
        assert [(r.start, r.end) for r in report.new_ranges] == [(COMMITTED, LOG_END)]
        wanted = set(range(COMMITTED, LOG_END))
        consume_until(consumer, got, lambda: {offset_of(m) for m in got} >= wanted, 60, "the lag, backfilled")
        with open_store(store_url) as store:
            (token,) = store.ranges(unique_group)
    finally:
        consumer.close()
    assert token.lineage is not None and lineage_cluster(token.lineage) == cluster_label(cluster)
