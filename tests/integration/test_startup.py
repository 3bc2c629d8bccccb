"""The first recovery after start, while the store is still opening (SQLAlchemy's import, the schema check).

Construction starts opening the store on a thread and returns.  A recovery whose lags a replay covers
(``fastrecover.recovery.replay.max.offsets``) does not wait for it: the primary reads from the committed
offset, as a plain consumer does, and what the store holds for those partitions (a range a crashed
member owed) is taken up as soon as the store is open.  The open is held on the ``store-open`` fault
point, so the test decides when it ends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Message, TopicPartition

from fastrecover import Consumer, hooks
from fastrecover.codec import cluster_label, lineage_cluster
from fastrecover.store import open_store
from fastrecover.store.models import VERSION_TABLE
from fastrecover.tokens import Token, TokenState
from fastrecover_tools.testing.broker import produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import consume_until, group_offsets, offset_of, parallel_config

pytestmark = pytest.mark.integration

OWED_FROM = 20
FIRST_END = 500
LOG_END = 700


@pytest.fixture
def store_gate() -> Iterator[threading.Event]:
    """Set it to let the held store opens through; the test arms the point with :func:`hold_store_opens`."""
    release = threading.Event()
    try:
        yield release
    finally:
        release.set()
        hooks.clear()


def hold_store_opens(release: threading.Event) -> None:
    def hold() -> None:
        release.wait(60)

    hooks.register("store-open", hold)


def _default_consumer(bootstrap: str, group: str, store_url: str, gate: threading.Event) -> Consumer:
    """A consumer with the library's replay default, its store held shut until ``gate`` is set."""
    config = parallel_config(bootstrap, group, store_url)
    del config["fastrecover.recovery.replay.max.offsets"]
    hold_store_opens(gate)
    return Consumer(config)


def _until_done(consumer: Consumer, store_url: str, token_id: int, what: str) -> Token:
    """Read and commit until the store shows range ``token_id`` done; the token then."""

    def done() -> bool:
        consumer.consume(100, 0.05)
        consumer.commit(asynchronous=False)
        with open_store(store_url) as store:
            return store.get(token_id).state is TokenState.DONE

    wait_for(done, 60, 0.01, what)
    with open_store(store_url) as store:
        return store.get(token_id)


def _a_crashed_member_owes_a_range(bootstrap: str, topic: str, group: str, store_url: str) -> int:
    """[20, 500) split off by a member that crashed before reading any of it; returns the range's id."""
    produce(bootstrap, topic, [f"r{i}" for i in range(FIRST_END)], partition=0)
    Consumer(parallel_config(bootstrap, group, store_url)).close()  # no partition: only the schema
    plain = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, OWED_FROM)], asynchronous=False)
    finally:
        plain.close()
    first = Consumer(parallel_config(bootstrap, group, store_url))
    try:
        first.assign([TopicPartition(topic, 0)])
        assert [(r.start, r.end) for r in first.recoveries[0].new_ranges] == [(OWED_FROM, FIRST_END)]
    finally:
        first._fr.handover.let_go = lambda keys, lost: None  # type: ignore[method-assign,union-attr]  # a crash
        first.close()
    with open_store(store_url) as store:
        (token,) = store.ranges(group)
    assert token.is_open and token.progress.committed == OWED_FROM
    return token.id


def test_a_small_lag_is_replayed_while_the_store_opens_and_the_owed_range_is_taken_up_after(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    topic = topic_factory(partitions=1)
    owed = _a_crashed_member_owes_a_range(bootstrap, topic, unique_group, store_url)
    produce(bootstrap, topic, [f"r{i}" for i in range(FIRST_END, LOG_END)], partition=0)

    # the library's default: a lag of 680 is replayed rather than waited for
    consumer = _default_consumer(bootstrap, unique_group, store_url, store_gate)
    got: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])
        (report,) = consumer.recoveries
        assert report.primary_start is None and report.new_ranges == () and not report.degraded and not report.stored
        # records flow while the store is still held shut: the primary replays from the committed offset
        consume_until(consumer, got, lambda: len(got) >= 100, 30, "records before the store is open")
        assert min(offset_of(m) for m in got) == OWED_FROM
        with open_store(store_url) as store:
            assert store.get(owed).epoch == 1, "nothing touched the store yet"

        store_gate.set()
        wanted = set(range(OWED_FROM, LOG_END))
        consume_until(consumer, got, lambda: {offset_of(m) for m in got} >= wanted, 60, "every record")

        token = _until_done(consumer, store_url, owed, "the owed range claimed and finished once the store opened")
        assert token.epoch == 2 and token.owner == consumer._fr.owner, "claimed by this consumer"  # type: ignore[union-attr]
    finally:
        consumer.close()
    (kafka,) = group_offsets(bootstrap, unique_group, topic)
    assert kafka.offset == LOG_END


def test_a_lag_beyond_the_replay_limit_waits_for_the_store_and_splits(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(LOG_END)], partition=0)
    Consumer(parallel_config(bootstrap, unique_group, store_url)).close()  # the schema
    plain = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_group})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, OWED_FROM)], asynchronous=False)
    finally:
        plain.close()
    config = parallel_config(bootstrap, unique_group, store_url, **{"fastrecover.recovery.replay.max.offsets": 100})
    hold_store_opens(store_gate)
    consumer = Consumer(config)
    opener = threading.Timer(0.5, store_gate.set)  # the store opens while the recovery waits for it
    try:
        opener.start()
        consumer.assign([TopicPartition(topic, 0)])
        assert store_gate.is_set(), "the recovery waited for the store"
        (report,) = consumer.recoveries
        assert report.primary_start == LOG_END and [(r.start, r.end) for r in report.new_ranges] == [
            (OWED_FROM, LOG_END)
        ]
    finally:
        opener.cancel()
        consumer.close()


def test_a_range_taken_up_after_a_replay_with_no_marker_carries_this_clusters_lineage(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    """No marker to compare, so the replay asked for no cluster id; the range it takes up later still names it.

    A range adopted under a lineage that names no cluster would look like another cluster's to every later
    recovery here: never believed, never retired, never read again.
    """
    topic = topic_factory(partitions=1)
    owed = _a_crashed_member_owes_a_range(bootstrap, topic, unique_group, store_url)
    produce(bootstrap, topic, [f"r{i}" for i in range(FIRST_END, LOG_END)], partition=0)
    plain = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_group})
    try:  # a plain member (or an operator) moves the offset past the owed range, with no marker
        plain.commit(offsets=[TopicPartition(topic, 0, 600)], asynchronous=False)
        cluster = plain.list_topics(timeout=30).cluster_id
    finally:
        plain.close()
    consumer = _default_consumer(bootstrap, unique_group, store_url, store_gate)
    got: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])
        assert consumer.recoveries[0].primary_start is None and not consumer.recoveries[0].stored
        store_gate.set()
        wanted = set(range(OWED_FROM, FIRST_END)) | set(range(600, LOG_END))
        consume_until(consumer, got, lambda: {offset_of(m) for m in got} >= wanted, 60, "the owed range and the lag")

        token = _until_done(consumer, store_url, owed, "the owed range to finish")
    finally:
        consumer.close()
    assert token.lineage is not None and lineage_cluster(token.lineage) == cluster_label(cluster)


def test_a_consumer_closed_before_it_saw_the_opens_error_still_closes(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    """The store turned out to be behind in schema after a replay began; close() releases and leaves the group."""
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(50)], partition=0)
    Consumer(parallel_config(bootstrap, unique_group, store_url)).close()  # the schema
    with open_store(store_url) as store, store.engine.begin() as conn:  # an older fastrecover's schema
        conn.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")
    consumer = _default_consumer(bootstrap, unique_group, store_url, store_gate)
    consumer.assign([TopicPartition(topic, 0)])
    assert consumer.recoveries[0].primary_start is None, "replayed while the store was held shut"
    store_gate.set()
    wait_for(lambda: not consumer._fr.link.opening, 30, 0.01, "the open to end")  # type: ignore[union-attr]
    consumer.close()  # no SchemaBehindError out of close(): the application never polled to see it
    with pytest.raises(RuntimeError):
        consumer.poll(0)  # closed as a plain consumer is
