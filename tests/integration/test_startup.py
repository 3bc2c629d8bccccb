"""The first recovery after start, while the store is still opening (SQLAlchemy's import, the schema check).

Construction starts opening the store on a thread and returns.  A recovery whose lags a replay covers
(``fastrecover.recovery.replay.max.offsets``) does not wait for it: the primary reads from the committed
offset, as a plain consumer does, and what the store holds for those partitions is taken up as soon
as the store is open.  A recovery whose marker mirrors unfinished ranges waits for it instead.  The
open is held on the ``store-open`` fault point, so the test decides when it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from fastrecover import Consumer, hooks
from fastrecover.book import mirror_context
from fastrecover.codec import cluster_label, lineage_cluster, read_marker
from fastrecover.errors import StoreError
from fastrecover.store import open_store
from fastrecover.store.models import VERSION_TABLE
from fastrecover.tokens import Token, TokenState, TopicPartitionKey
from fastrecover_tools.testing.broker import produce
from fastrecover_tools.testing.waiting import wait_for
from tests.fixtures.stores import hold_store_opens
from tests.integration.helpers import consume_until, group_offsets, mode_of, offset_of, parallel_config

pytestmark = pytest.mark.integration

OWED_FROM = 20
FIRST_END = 500
LOG_END = 700


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
        mode_of(first).handover.let_go = lambda keys, lost: None  # type: ignore[method-assign]  # a crash
        first.close()
    with open_store(store_url) as store:
        (token,) = store.ranges(group)
    assert token.is_open and token.progress.committed == OWED_FROM
    return token.id


def test_a_small_lag_whose_marker_names_an_owed_range_waits_for_the_store_and_claims_it_first(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    """A small lag is replayed while the store opens, unless the marker mirrors unfinished ranges.

    Those may be in the commit metadata alone (their member jumped on it and died before its store
    had them): the recovery waits for the store and claims them before a record is delivered, so
    that no later commit or offset reset can erase them.
    """
    topic = topic_factory(partitions=1)
    owed = _a_crashed_member_owes_a_range(bootstrap, topic, unique_group, store_url)
    produce(bootstrap, topic, [f"r{i}" for i in range(FIRST_END, LOG_END)], partition=0)
    _, mirrored = _marker_ranges(bootstrap, unique_group, topic)
    assert mirrored == [(OWED_FROM, FIRST_END)], "the crashed member's marker names the range it owed"

    # the library's default replays a lag of 680 while the store opens; the open is let through once it begins
    consumer = _default_consumer(bootstrap, unique_group, store_url, store_gate)
    began = threading.Event()

    def held_open() -> None:
        began.set()
        store_gate.wait(60)

    hooks.register("store-open", held_open)

    def release_once_begun() -> None:
        if began.wait(30):
            store_gate.set()

    threading.Thread(target=release_once_begun, daemon=True).start()
    got: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])
        assert began.is_set(), "the recovery waited for the store's open"
        (report,) = consumer.recoveries
        assert report.stored and not report.degraded and report.resumed == (owed,), report
        with open_store(store_url) as store:
            claimed = store.get(owed)
        assert claimed.epoch == 2 and claimed.owner == mode_of(consumer).owner, "claimed before any record"

        wanted = set(range(OWED_FROM, LOG_END))
        consume_until(consumer, got, lambda: {offset_of(m) for m in got} >= wanted, 60, "every record")
        token = _until_done(consumer, store_url, owed, "the owed range finished")
        assert token.owner == mode_of(consumer).owner
    finally:
        consumer.close()
    (kafka,) = group_offsets(bootstrap, unique_group, topic)
    assert kafka.offset == LOG_END


def _lag_behind_a_plain_commit(bootstrap: str, topic: str, group: str, store_url: str) -> None:
    """Records 0..LOG_END-1, the group's offset at OWED_FROM (a plain commit, no marker), the store's schema made."""
    produce(bootstrap, topic, [f"r{i}" for i in range(LOG_END)], partition=0)
    Consumer(parallel_config(bootstrap, group, store_url)).close()  # the schema
    plain = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, OWED_FROM)], asynchronous=False)
    finally:
        plain.close()


def _jumping_config(bootstrap: str, group: str, store_url: str, **extra: Any) -> dict[str, Any]:
    """A consumer whose first recovery, while its store opens, jumps on the marker (the lag is above its limit)."""
    jumps = {"fastrecover.recovery.replay.max.offsets": 100, "fastrecover.recovery.jump.on.mirror": True}
    return parallel_config(bootstrap, group, store_url, **{**jumps, **extra})


def _marker_ranges(bootstrap: str, group: str, topic: str) -> tuple[int, list[tuple[int, int]]]:
    """Kafka's committed offset of partition 0 and the ranges its marker's mirror holds."""
    (kafka,) = group_offsets(bootstrap, group, topic)
    marker = read_marker(kafka.metadata, context=mirror_context(group, TopicPartitionKey(topic, 0)))
    assert marker is not None, f"no fastrecover marker in Kafka's metadata {kafka.metadata!r}"
    return kafka.offset, [(r.start, r.end) for r in marker.ranges]


def test_with_the_replay_limit_at_zero_a_recovery_waits_for_the_store_and_splits(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    hold_store_opens(store_gate)
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))  # replay.max.offsets 0
    opener = threading.Timer(0.5, store_gate.set)  # the store opens while the recovery waits for it
    try:
        opener.start()
        consumer.assign([TopicPartition(topic, 0)])
        assert store_gate.is_set(), "the recovery waited for the store"
        (report,) = consumer.recoveries
        assert report.stored and report.primary_start == LOG_END
        assert [(r.start, r.end) for r in report.new_ranges] == [(OWED_FROM, LOG_END)]
    finally:
        opener.cancel()
        consumer.close()


def _late_consumer(bootstrap: str, topic: str, group: str, store_url: str, gate: threading.Event) -> Consumer:
    """A default consumer (no jump on the mirror) assigned partition 0, whose lag is above its replay limit,
    its store's open held until ``gate`` is set."""
    hold_store_opens(gate)
    consumer = Consumer(
        parallel_config(bootstrap, group, store_url, **{"fastrecover.recovery.replay.max.offsets": 100})
    )
    consumer.assign([TopicPartition(topic, 0)])
    return consumer


def _replaying_until_the_store_opens(
    bootstrap: str, topic: str, group: str, store_url: str, gate: threading.Event, got: list[Message]
) -> Consumer:
    """A default consumer (no jump on the mirror) whose lag is above its replay limit, its store held shut:
    it replays from C; once it has handed out ``REPLAYED`` records, the store is let open (nothing read meanwhile,
    up to the next tick)."""
    consumer = _late_consumer(bootstrap, topic, group, store_url, gate)
    (report,) = consumer.recoveries
    assert (report.primary_start, report.stored, report.new_ranges) == (None, False, ()), "it replays first"
    while len(got) < REPLAYED:
        got.extend(m for m in consumer.consume(REPLAYED - len(got), 1.0) if m.error() is None)
    assert [offset_of(m) for m in got] == list(range(OWED_FROM, OWED_FROM + REPLAYED)), "in order, from C"
    gate.set()
    mode = mode_of(consumer)
    wait_for(lambda: not mode.link.opening, 30, 0.005, "the store's open (deferred: 0.5 s after the recovery)")
    # the next call's tick takes the store's part up (the replay would outrun it with no record to process)
    wait_for(lambda: mode.gate.tick_due(time.monotonic()), 30, 0.005, "the next tick")
    return consumer


REPLAYED = 100  # records the replay hands out before the store opens


def test_by_default_a_large_lag_replays_while_the_store_opens_then_jumps_from_where_the_replay_got_to(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    """Without ``jump.on.mirror`` no range lives in Kafka's commit metadata alone (an operator's offset reset
    after a crash would erase it), and the first fresh record still comes no later than a plain consumer's:
    the primary replays while the store opens, and skips the rest of the lag once its token is written."""
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    got: list[Message] = []
    consumer = _replaying_until_the_store_opens(bootstrap, topic, unique_group, store_url, store_gate, got)
    try:
        produce(bootstrap, topic, [f"fresh{i}" for i in range(50)], partition=0)
        wanted = set(range(OWED_FROM, LOG_END + 50))
        consume_until(consumer, got, lambda: {offset_of(m) for m in got} >= wanted, 30, "lag and fresh")
        late = consumer.recoveries[-1]
        jump_from = OWED_FROM + REPLAYED
        assert (late.primary_start, late.stored) == (LOG_END, True), "the primary skipped, the token written first"
        assert [(r.start, r.end) for r in late.new_ranges] == [(jump_from, LOG_END)], "from where the replay was"
        with open_store(store_url) as store:
            (token,) = store.ranges(unique_group)
        assert (token.span.start, token.span.end) == (jump_from, LOG_END)
        assert sorted(offset_of(m) for m in got) == sorted(wanted), "every record once: none skipped, none twice"
    finally:
        consumer.close()


def test_a_partition_the_application_seeks_while_it_replays_does_not_jump(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    """Its primary reads where the application told it to; no range is made of what lies after."""
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    got: list[Message] = []
    consumer = _late_consumer(bootstrap, topic, unique_group, store_url, store_gate)
    try:
        consume_until(consumer, got, lambda: len(got) >= 10, 30, "the first replayed records")
        consumer.seek(TopicPartition(topic, 0, OWED_FROM))  # the application reads the lag again, from C
        store_gate.set()
        wait_for(lambda: not mode_of(consumer).link.opening, 30, 0.005, "the store's open")
        again: list[Message] = []
        consume_until(consumer, again, lambda: LOG_END - 1 in {offset_of(m) for m in again}, 30, "the lag again")
        assert [offset_of(m) for m in again] == list(range(OWED_FROM, LOG_END)), "the primary read it all, in order"
        assert all(r.primary_start is None for r in consumer.recoveries), "no jump"
        with open_store(store_url) as store:
            assert store.ranges(unique_group) == []
    finally:
        consumer.close()


def test_a_lag_beyond_the_replay_limit_jumps_on_kafkas_marker_while_the_store_opens(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    """The range is durable in the marker committed with C before the primary skips; the store takes it after."""
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    config = _jumping_config(bootstrap, unique_group, store_url)
    hold_store_opens(store_gate)
    consumer = Consumer(config)
    got: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])
        assert not store_gate.is_set()
        (report,) = consumer.recoveries
        assert (report.primary_start, report.stored, report.degraded) == (LOG_END, False, False)
        assert [(r.start, r.end) for r in report.new_ranges] == [(OWED_FROM, LOG_END)]
        assert _marker_ranges(bootstrap, unique_group, topic) == (OWED_FROM, [(OWED_FROM, LOG_END)])
        with open_store(store_url) as store:
            assert store.ranges(unique_group) == [], "nothing in the store yet: the marker is the token"

        produce(bootstrap, topic, [f"fresh{i}" for i in range(50)], partition=0)
        # the child reads the lag at once, next to the fresh records: the marker made it durable
        wanted = set(range(OWED_FROM, LOG_END + 50))
        consume_until(consumer, got, lambda: {offset_of(m) for m in got} >= wanted, 30, "lag and fresh, store shut")
        assert not store_gate.is_set()
        consumer.commit(asynchronous=True)  # the backfill's part stays in memory: the store is not open

        def marked_fresh() -> bool:
            consumer.poll(0.05)
            return _marker_ranges(bootstrap, unique_group, topic)[0] == LOG_END + 50

        wait_for(marked_fresh, 30, 0.01, "the primary's commit with its marker")
        assert _marker_ranges(bootstrap, unique_group, topic)[1] == [(OWED_FROM, LOG_END)], "the mirror names it all"
        with open_store(store_url) as store:
            assert store.ranges(unique_group) == [], "what the child read early is in memory only"

        store_gate.set()
        # a synchronous commit waits for the store and makes the early progress durable: the range is done at once
        consumer.commit(asynchronous=False)
        with open_store(store_url) as store:
            (token,) = store.ranges(unique_group)
        assert (token.span.start, token.span.end, token.state) == (OWED_FROM, LOG_END, TokenState.DONE)
        assert len(got) == len({offset_of(m) for m in got}) == LOG_END + 50 - OWED_FROM, "each record once"
    finally:
        consumer.close()


def test_a_member_gone_before_its_store_opened_leaves_its_ranges_in_kafkas_marker(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    """What its child read and the application committed early is in memory only: the next member reads it all."""
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    config = _jumping_config(bootstrap, unique_group, store_url)
    hold_store_opens(store_gate)
    first = Consumer(config)
    early: list[Message] = []
    try:
        first.assign([TopicPartition(topic, 0)])
        assert first.recoveries[0].primary_start == LOG_END
        consume_until(first, early, lambda: len(early) >= 200, 30, "part of the lag, read early")
        assert min(offset_of(m) for m in early) == OWED_FROM
        first.commit(asynchronous=True)
        first.poll(0.1)
    finally:
        mode_of(first).handover.let_go = lambda keys, lost: None  # type: ignore[method-assign]  # a crash
        first.close()
    assert _marker_ranges(bootstrap, unique_group, topic) == (OWED_FROM, [(OWED_FROM, LOG_END)])

    store_gate.set()
    second = Consumer(parallel_config(bootstrap, unique_group, store_url))
    got: list[Message] = []
    try:
        second.assign([TopicPartition(topic, 0)])
        wanted = set(range(OWED_FROM, LOG_END))
        consume_until(second, got, lambda: {offset_of(m) for m in got} >= wanted, 60, "the range the marker kept")
    finally:
        second.close()


def test_a_marker_kafka_refuses_leaves_the_partition_to_a_replay(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    config = _jumping_config(bootstrap, unique_group, store_url)

    def refuse() -> None:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "injected: the marker commit timed out"))

    hooks.register("mirror-first-commit", refuse)
    hold_store_opens(store_gate)
    consumer = Consumer(config)
    got: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])
        (report,) = consumer.recoveries
        assert report.primary_start is None and report.degraded
        consume_until(consumer, got, lambda: len(got) >= 100, 30, "the replay from the committed offset")
        assert [offset_of(m) for m in got[:100]] == list(range(OWED_FROM, OWED_FROM + 100)), "in order, from C"
        store_gate.set()
        wanted = set(range(OWED_FROM, LOG_END))
        consume_until(consumer, got, lambda: {offset_of(m) for m in got} >= wanted, 60, "every record")
    finally:
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
    wait_for(lambda: not mode_of(consumer).link.opening, 30, 0.01, "the open to end")
    consumer.close()  # no SchemaBehindError out of close(): the application never polled to see it
    with pytest.raises(RuntimeError):
        consumer.poll(0)  # closed as a plain consumer is


def test_a_store_write_that_fails_after_the_jump_keeps_the_ranges_in_kafkas_marker(
    bootstrap: str,
    topic_factory: Any,
    unique_group: str,
    store_url: str,
    store_gate: threading.Event,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The primary is past the lag: until the store has the ranges, every commit must carry them."""
    caplog.set_level(logging.WARNING, logger="fastrecover.recovery")
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    config = _jumping_config(bootstrap, unique_group, store_url, **{"fastrecover.store.retry.backoff.ms": 200})
    failing = threading.Event()
    failing.set()
    attempts: list[float] = []

    def refuse() -> None:
        if failing.is_set():
            attempts.append(time.monotonic())
            raise StoreError("injected: the store's part of the recovery could not be written")

    hooks.register("token-write", refuse)
    hold_store_opens(store_gate)
    consumer = Consumer(config)
    got: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])
        assert consumer.recoveries[0].primary_start == LOG_END
        produce(bootstrap, topic, [f"fresh{i}" for i in range(20)], partition=0)
        store_gate.set()
        wanted = set(range(OWED_FROM, LOG_END + 20))
        consume_until(
            consumer, got, lambda: {offset_of(m) for m in got} >= wanted and bool(attempts), 30, "a failed store write"
        )
        # what the child read early cannot be made durable: a synchronous commit says so, and sends nothing
        with pytest.raises(StoreError, match="ranges read while it opened"):
            consumer.commit(asynchronous=False)
        consumer.commit(asynchronous=True)  # the primary's own offset, above the lag

        def marked_fresh() -> bool:
            consumer.poll(0.05)
            return _marker_ranges(bootstrap, unique_group, topic)[0] == LOG_END + 20

        wait_for(marked_fresh, 30, 0.01, "the primary's commit with its marker")
        assert _marker_ranges(bootstrap, unique_group, topic)[1] == [(OWED_FROM, LOG_END)], "the marker holds the lag"
        # what the operator reads: the primary stays past the lag, it does not fall back to the committed offset
        said = [r.getMessage() for r in caplog.records if "recovery of" in r.getMessage()]
        assert said and all("reads on where it is" in m for m in said), said
        assert not any("instead of the log end" in r.getMessage() for r in caplog.records)

        failing.clear()
        consumer.commit(asynchronous=False)  # the store answers again: the early progress is written
        with open_store(store_url) as store:
            (token,) = store.ranges(unique_group)
        assert token.state is TokenState.DONE, "nothing of the lag is read again"
        assert len(got) == len({offset_of(m) for m in got}), "each record once"
    finally:
        consumer.close()


def test_a_store_that_opens_mid_range_takes_it_over_where_the_child_is(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    hold_store_opens(store_gate)
    consumer = Consumer(_jumping_config(bootstrap, unique_group, store_url, **{"enable.auto.commit": True}))
    got: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])

        def some() -> bool:
            got.extend(m for m in consumer.consume(20, 0.2) if m.error() is None)
            return len(got) >= 100

        wait_for(some, 30, 0.001, "part of the lag, read early")
        assert max(offset_of(m) for m in got) < LOG_END - 100, "the child is in the middle of the range"
        # paused, so that the ticks take the range over before the child has read the rest of it
        consumer.pause([TopicPartition(topic, 0)])
        store_gate.set()

        def stored() -> list[Token]:
            assert consumer.poll(0.05) is None, "a paused partition yields nothing"
            with open_store(store_url) as store:
                return store.ranges(unique_group)

        (token,) = wait_for(stored, 30, 0.01, "the store's part of the recovery")
        consumer.resume([TopicPartition(topic, 0)])
        wanted = set(range(OWED_FROM, LOG_END))
        consume_until(consumer, got, lambda: {offset_of(m) for m in got} >= wanted, 60, "the rest of the lag")
        _until_done(consumer, store_url, token.id, "the range finished in the store")
        assert len(got) == len({offset_of(m) for m in got}), "read on from the cursor: each record once"
    finally:
        consumer.close()


def test_close_while_the_child_reads_early_writes_its_progress_to_the_store(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_gate: threading.Event
) -> None:
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    hold_store_opens(store_gate)
    consumer = Consumer(_jumping_config(bootstrap, unique_group, store_url))
    got: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consume_until(consumer, got, lambda: len(got) >= 200, 30, "part of the lag, read early")
        consumer.commit(asynchronous=True)
        read = max(offset_of(m) for m in got if offset_of(m) < LOG_END) + 1
    finally:
        store_gate.set()
        consumer.close()  # waits for the store: the early progress is written before the range is released
    with open_store(store_url) as store:
        (token,) = store.ranges(unique_group)
    assert (token.span.start, token.span.end) == (OWED_FROM, LOG_END)
    assert token.progress.committed >= read, "what the application committed early is the store's"
    assert token.owner is None or token.state is TokenState.DONE, "released"
