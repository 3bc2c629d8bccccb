"""Spark as the backfill engine of a consumer group: ``format("fastrecover-ranges")`` + complete_ranges."""

from __future__ import annotations

import os
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import TopicPartition
from pyspark.sql import SparkSession

from fastrecover import Consumer
from fastrecover.codec import new_lineage
from fastrecover.errors import FencedError
from fastrecover.spark import abandon_ranges, complete_ranges
from fastrecover.store import open_store
from fastrecover.tokens import TokenState
from fastrecover_tools.testing.broker import produce
from fastrecover_tools.testing.waiting import wait_for
from tests.fixtures.broker import TopicFactory
from tests.integration.helpers import offset_of

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def consumer_config(bootstrap: str, group: str, store_url: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
        "enable.parallel.rebalance": True,
        "fastrecover.store.url": store_url,
        "fastrecover.backfill.min.offsets": 10,
        "fastrecover.recovery.replay.max.offsets": 0,  # ranges at the first recovery, open store or not
        "fastrecover.backfill.queue.max.messages": 50,
    }


def commit_at(bootstrap: str, group: str, topic: str, offset: int) -> None:
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        plain.close()


def test_a_spark_job_drains_a_consumers_open_ranges_and_hands_them_back_done(
    spark: SparkSession, bootstrap: str, topic_factory: TopicFactory, unique_group: str, store_url: str
) -> None:
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"done-{i}" for i in range(100)], partition=0)
    commit_at(bootstrap, unique_group, topic, 100)
    produce(bootstrap, topic, [f"lag-{i}" for i in range(2000)], partition=0)

    # The consumer recovers: it jumps to the log end and opens the range [100, 2100).
    consumer = Consumer(consumer_config(bootstrap, unique_group, store_url))
    consumer.subscribe([topic])
    delivered: list[int] = []

    def holds_and_delivered() -> bool:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            delivered.append(offset_of(msg))
        return bool(consumer.backfill_progress()) and bool(delivered)

    wait_for(holds_and_delivered, 60, 0.01, "the consumer to open a range and backfill a record")
    ((token, _),) = consumer.backfill_progress()
    assert (token.span.start, token.span.end) == (100, 2100)

    # The Spark job claims the range (the consumer is fenced from now on) and reads all of it.
    reader = (
        spark.read.format("fastrecover-ranges")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("fastrecover.store.url", store_url)
        .option("group", unique_group)
        .option("backfillTasks", 3)
    )
    df = reader.load()
    rows = df.select("partition", "offset", "backfill", "value").collect()
    assert sorted(r.offset for r in rows) == list(range(100, 2100))
    assert all(r.backfill and r.value.decode().startswith("lag-") for r in rows)
    assert df.rdd.getNumPartitions() == 3
    # Planning again (a second action on the same job) reads the same claim: no new epoch.
    with open_store(store_url) as store:
        claimed = store.get(token.id)
    assert claimed.owner == "spark-ranges:default" and claimed.epoch == token.epoch + 1
    assert reader.load().count() == 2000
    with open_store(store_url) as store:
        assert store.get(token.id).epoch == claimed.epoch

    done = complete_ranges(store_url, unique_group)
    assert [t.id for t in done.completed] == [token.id] and done.fenced == [] and done.records == 2000
    with open_store(store_url) as store:
        assert store.get(token.id).state is TokenState.DONE
    assert complete_ranges(store_url, unique_group).completed == []  # the claim is closed

    # The consumer learns the hand-off on its next commit of the range: fenced, and it drops the range.
    with pytest.raises(FencedError):
        consumer.commit(asynchronous=False)
    assert consumer.backfill_progress() == []
    consumer.close()

    # A successor of the group finds nothing left to backfill and reads live from the log end.
    successor = Consumer(consumer_config(bootstrap, unique_group, store_url))
    successor.subscribe([topic])
    seen: list[int] = []

    def recovered() -> bool:
        msg = successor.poll(0.2)
        if msg is not None and msg.error() is None:
            seen.append(offset_of(msg))
        return bool(successor.recoveries)

    # (The fresh record is produced after the successor's recovery: produced before it, it would fall
    # into a new range [100, 2101) that the store's done token [100, 2100) shadows; see docs/spark.md.)
    wait_for(recovered, 60, 0.01, "the successor to be assigned and recover")
    produce(bootstrap, topic, ["fresh"], partition=0)

    def got_fresh() -> bool:
        msg = successor.poll(0.2)
        if msg is not None and msg.error() is None:
            seen.append(offset_of(msg))
        return 2100 in seen

    try:
        wait_for(got_fresh, 60, 0.01, "the successor to read the fresh record")
        assert successor.backfill_progress() == []
        assert seen == [2100]
    finally:
        successor.close()
    # A job with nothing open claims nothing; abandoning without a claim is a no-op.
    assert (
        spark.read.format("fastrecover-ranges")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("fastrecover.store.url", store_url)
        .option("group", unique_group)
        .load()
        .count()
        == 0
    )
    assert abandon_ranges(store_url, unique_group) is not None
    assert abandon_ranges(store_url, unique_group) is None


def test_a_ranges_job_leaves_the_ranges_of_another_cluster_sharing_the_store_alone(
    spark: SparkSession, bootstrap: str, topic_factory: TopicFactory, unique_group: str, store_url: str
) -> None:
    """Two clusters, one store, the same group and topic names: a job reads only its own cluster's ranges."""
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(500)], partition=0)
    probe = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": unique_group})
    try:
        here = probe.list_topics(timeout=30).cluster_id
    finally:
        probe.close()
    with open_store(store_url) as store:
        ours = store.create_range(unique_group, topic, 0, 100, 300, "gone", new_lineage(here, os.urandom(8)))
        theirs = store.create_range(unique_group, topic, 0, 300, 500, "far", new_lineage("OtherClusterId", bytes(8)))

    rows = (
        spark.read.format("fastrecover-ranges")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("fastrecover.store.url", store_url)
        .option("group", unique_group)
        .load()
        .select("offset")
        .collect()
    )

    assert sorted(r.offset for r in rows) == list(range(100, 300)), "only this cluster's range is read"
    done = complete_ranges(store_url, unique_group)
    assert [t.id for t in done.completed] == [ours.id] and done.fenced == []
    with open_store(store_url) as store:
        after = store.get(theirs.id)
    assert (after.state, after.owner, after.epoch) == (TokenState.OPEN, "far", theirs.epoch), "never claimed"
