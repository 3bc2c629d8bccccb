"""``Consumer.metrics()`` and its Prometheus exposition (issue 14): every metric moves when its event happens.

A real broker, a real store, the KIP's crash set-up (:func:`lag_after_crash`), and the
library's named fault points (:mod:`fastrecover.hooks`) for the failures.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Message, TopicPartition
from prometheus_client import CollectorRegistry, generate_latest

from fastrecover import Consumer, hooks
from fastrecover.errors import FencedError, StoreError, StoreUnavailableError
from fastrecover.metrics import PartitionBackfill
from fastrecover.prometheus import register
from fastrecover.store import open_store
from fastrecover_tools.testing.broker import produce
from tests.integration.helpers import lag_after_crash, parallel_config, poll_until

LAG_START, LOG_END = 20, 2000


@pytest.fixture(autouse=True)
def _no_hooks() -> Iterator[None]:
    hooks.clear()
    yield
    hooks.clear()


def _once(exc: BaseException) -> Any:
    """A fault action that raises ``exc`` the first time only."""
    fired: list[bool] = []

    def action() -> None:
        if not fired:
            fired.append(True)
            raise exc

    return action


def _crash_with_lag(bootstrap: str, topic_factory: Any, group: str, store_url: str, tmp_path: Path) -> str:
    """A one-partition topic whose consumer committed LAG_START and died; the log ends at LOG_END."""
    topic: str = topic_factory(partitions=1)
    lag_after_crash(
        bootstrap, topic, group, store_url, tmp_path, produced=100, commit_at=LAG_START, block_at=40, log_end=LOG_END
    )
    return topic


def _backfilled(got: list[Message]) -> list[Message]:
    return [m for m in got if LAG_START <= (m.offset() or 0) < LOG_END]


def test_a_backfill_moves_the_range_stream_child_and_store_metrics(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    topic = _crash_with_lag(bootstrap, topic_factory, unique_group, store_url, tmp_path)
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    registry = CollectorRegistry()
    register(consumer, "m1", registry)
    try:
        before = consumer.metrics()
        assert before.parallel_rebalance and before.ranges_open == 0 and before.recoveries == 0
        assert before.primary_messages == 0 and before.child_records == 0 and before.store_commits == 0
        consumer.subscribe([topic])
        got: list[Message] = []
        poll_until(consumer, got, lambda: _backfilled(got), 60, "the first backfilled record")
        during = consumer.metrics()
        assert during.recoveries == 1 and during.degraded_recoveries == 0
        assert during.ranges_open == 1 and during.child_alive and during.child_records >= 1
        assert during.backfill == (PartitionBackfill(topic, 0, 1, LOG_END - LAG_START),)
        scrape = generate_latest(registry).decode()
        assert 'fastrecover_ranges_open{consumer="m1"} 1.0' in scrape
        assert f'fastrecover_backfill_remaining_offsets{{consumer="m1",partition="0",topic="{topic}"}} 1980.0' in scrape

        produce(bootstrap, topic, [f"fresh{i}" for i in range(10)], partition=0)
        wanted = set(range(LAG_START, LOG_END + 10))
        poll_until(consumer, got, lambda: {m.offset() for m in got} >= wanted, 120, "the lag and the fresh records")
        consumer.poll(0)  # the last record counts as done once the next call begins (auto offset store)
        consumer.commit(asynchronous=False)
        after = consumer.metrics()
        assert after.ranges_open == 0 and after.ranges_done == 1 and after.backfill == ()
        assert after.store_commits >= 1 and after.store_commit_failures == 0
        assert after.store_commit_latency.count >= after.store_commits
        assert after.store_commit_latency.sum_seconds > 0
        assert after.primary_messages >= 10 and after.child_records >= LOG_END - LAG_START
        assert after.as_dict()["backfill_remaining"] == 0
        scrape = generate_latest(registry).decode()
        assert 'fastrecover_ranges_done_total{consumer="m1"} 1.0' in scrape
        assert f'fastrecover_delivered_messages_total{{consumer="m1",stream="child"}} {after.child_records}.0' in scrape
        assert 'fastrecover_store_commit_duration_seconds_count{consumer="m1"}' in scrape
    finally:
        consumer.close()
    assert consumer.metrics().parallel_rebalance is False  # closed: nothing is counted any more


def test_failures_move_the_child_store_and_fencing_metrics(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    topic = _crash_with_lag(bootstrap, topic_factory, unique_group, store_url, tmp_path)
    consumer = Consumer(
        parallel_config(bootstrap, unique_group, store_url, **{"fastrecover.store.retry.backoff.ms": 100})
    )
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        poll_until(consumer, got, lambda: _backfilled(got), 60, "the first backfilled record")
        assert consumer.metrics().child_restarts == 0

        hooks.register("child-batch", _once(RuntimeError("injected child failure")))
        poll_until(consumer, got, lambda: consumer.metrics().child_restarts >= 1, 60, "the child to be restarted")
        assert consumer.metrics().child_alive  # the replacement handle is up

        first = _backfilled(got)[0]
        hooks.register("store-commit", _once(RuntimeError("injected store failure")))
        with pytest.raises(StoreError):
            consumer.commit(message=first, asynchronous=False)
        failed = consumer.metrics()
        assert failed.store_commit_failures == 1 and failed.store_commit_latency.count >= 1

        with open_store(store_url) as store:
            (token,) = [t for t in store.ranges(unique_group) if t.progress.start == LAG_START]
            store.claim(token.id, "another-host:1:intruder")
        with pytest.raises(FencedError):
            consumer.commit(message=first, asynchronous=False)
        fenced = consumer.metrics()
        assert fenced.fencings == 1 and fenced.ranges_open == 0
    finally:
        consumer.close()


def test_a_store_that_fails_the_token_write_counts_a_degraded_recovery(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    topic = _crash_with_lag(bootstrap, topic_factory, unique_group, store_url, tmp_path)
    hooks.register("token-write", _once(StoreUnavailableError("injected: the store went away mid-write")))
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        poll_until(consumer, got, lambda: got, 60, "the first record")
        m = consumer.metrics()
        assert m.degraded_recoveries == 1 and m.recoveries == 0 and m.ranges_open == 0
        assert got[0].offset() == LAG_START  # degraded: the lag is replayed by the primary, nothing skipped
        assert m.primary_messages >= 1 and m.child_records == 0
    finally:
        consumer.close()


def test_a_partition_with_more_ranges_than_a_mirror_holds_counts_a_mirror_degradation(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    """Many crashes leave many open ranges on one partition: their mirror must merge some (more re-delivery)."""
    from fastrecover.codec import MIRROR_MAX_ROWS

    topic = topic_factory(partitions=1)
    count = MIRROR_MAX_ROWS + 2
    produce(bootstrap, topic, [f"r{i}" for i in range(count * 10)], partition=0)
    with open_store(store_url, create=True) as store:
        for i in range(count):  # left open by earlier incarnations, all dead now
            store.create_range(unique_group, topic, 0, i * 10, i * 10 + 5, owner="dead-host:1:gone")
    config = parallel_config(bootstrap, unique_group, store_url)
    committer = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": unique_group})
    try:  # the group's Kafka offset is past every range: only the store knows what is unfinished
        committer.commit(offsets=[TopicPartition(topic, 0, count * 10)], asynchronous=False)
    finally:
        committer.close()
    consumer = Consumer(config)
    try:
        assert consumer.metrics().mirror_degradations == 0
        consumer.subscribe([topic])
        got: list[Message] = []
        poll_until(consumer, got, lambda: consumer.metrics().ranges_open == count, 60, "the ranges to be resumed")
        poll_until(consumer, got, lambda: got, 60, "a backfilled record")
        consumer.commit(message=got[0], asynchronous=False)  # writes the partition's mirror with the commit
        m = consumer.metrics()
        assert m.mirror_degradations >= 1, m
        scrape_registry = CollectorRegistry()
        register(consumer, "m3", scrape_registry)
        assert 'fastrecover_mirror_degradations_total{consumer="m3"}' in generate_latest(scrape_registry).decode()
    finally:
        consumer.close()
