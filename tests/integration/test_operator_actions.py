"""What operators do to a consumer group, on the real broker and both stores.

Operators reset offsets to reprocess, delete and re-create topics, and share a
store between clusters.  A range token is a fact about offsets of one log at
one time: when Kafka's committed offset was moved by someone other than
fastrecover, a finished range above it must not hide a record (the worst bug
fastrecover can have).  Each test builds the state the way an operator meets it
(a range backfilled to the end, then the operator's action through the admin
API, as ``kafka-consumer-groups`` does), then asks a new fastrecover consumer
for every record at or after the new position.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import ConsumerGroupTopicPartitions, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from fastrecover import Consumer
from fastrecover.ranges import RangeProgress
from fastrecover.store import open_store
from fastrecover.store.models import RANGES
from fastrecover.store.updates import ProgressUpdate
from fastrecover.tokens import TokenState
from fastrecover_tools.testing.broker import create_topic, delete_topic, group_is_empty, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import (
    consume_until,
    delivered_from,
    group_offsets,
    mode_of,
    offset_of,
    parallel_config,
    poll_until,
)

LOG_END = 1_100
FIRST_COMMIT = 100


def _commit_plain(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """Commit ``offset`` for partition 0 with empty metadata, as a plain client or an admin tool does."""
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        plain.close()


def _reset_offset(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """``kafka-consumer-groups --reset-offsets --execute``: the admin API's alter, with no metadata."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, offset)])
    (future,) = admin.alter_consumer_group_offsets([request]).values()
    future.result(timeout=30)


def _finish_a_range(bootstrap: str, topic: str, group: str, store_url: str) -> None:
    """Records 0..LOG_END-1; the group at FIRST_COMMIT; a fastrecover consumer backfills the rest and closes.

    Leaves a *done* range [FIRST_COMMIT, LOG_END) in the store, and Kafka's offset at or above LOG_END.
    """
    produce(bootstrap, topic, [f"r{i}" for i in range(LOG_END)], partition=0)
    _commit_plain(bootstrap, group, topic, FIRST_COMMIT)
    consumer = Consumer(parallel_config(bootstrap, group, store_url))
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        wanted = set(range(FIRST_COMMIT, LOG_END))
        poll_until(consumer, got, lambda: {offset_of(m) for m in got} >= wanted, 60, "the backfilled range")
        consumer.poll(0)  # the records returned so far count as done (auto offset store)
        consumer.commit(asynchronous=False)
        with open_store(store_url) as store:
            (token,) = store.ranges(group)
            assert (token.span.start, token.span.end, token.state) == (FIRST_COMMIT, LOG_END, TokenState.DONE)
    finally:
        consumer.close()
    wait_for(lambda: group_is_empty(bootstrap, group), 30, 0.2, "the first consumer to leave")


def _superseded(store_url: str, group: str) -> list[tuple[int, int]]:
    with open_store(store_url) as store:
        return [(t.span.start, t.span.end) for t in store.ranges(group) if t.is_superseded]


def _timestamp_offset(bootstrap: str, topic: str, offset: int) -> int:
    """The offset ``--to-datetime`` finds for the time record ``offset`` was written."""
    probe = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": "probe-timestamps", "enable.auto.commit": False})
    try:
        probe.assign([TopicPartition(topic, 0, offset)])
        msg = None
        deadline = time.monotonic() + 30
        while msg is None or msg.error() is not None:
            assert time.monotonic() < deadline, f"no record at offset {offset}"
            msg = probe.poll(0.5)
        _kind, stamp = msg.timestamp()
        (found,) = probe.offsets_for_times([TopicPartition(topic, 0, stamp)], timeout=10)
        return int(found.offset)
    finally:
        probe.close()


@pytest.mark.parametrize("reset", ["to-earliest", "by-shift", "to-datetime"])
def test_an_offset_reset_below_a_finished_range_delivers_every_record_again(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, reset: str
) -> None:
    topic = topic_factory(partitions=1)
    _finish_a_range(bootstrap, topic, unique_group, store_url)
    (before,) = group_offsets(bootstrap, unique_group, topic)
    target = {
        "to-earliest": 0,
        "by-shift": before.offset - 700,
        "to-datetime": _timestamp_offset(bootstrap, topic, 250),
    }[reset]
    assert 0 <= target < FIRST_COMMIT + 500, f"the reset goes below the finished range's end ({target})"
    _reset_offset(bootstrap, unique_group, topic, target)

    delivered = delivered_from(bootstrap, topic, unique_group, store_url, set(range(target, LOG_END)))

    assert set(range(target, LOG_END)) <= delivered
    assert _superseded(store_url, unique_group) == [(FIRST_COMMIT, LOG_END)], "the old range is kept for audit"


def test_a_reset_into_an_open_range_still_delivers_what_the_range_owed_below_it(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    """``--shift-by -N`` into a range nobody finished: its records below the new offset are still owed.

    The operator believes everything below Kafka's offset was processed and asks for the last records
    again; the range's unfinished records below the new offset were never delivered at all.
    """
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(2_000)], partition=0)
    _commit_plain(bootstrap, unique_group, topic, FIRST_COMMIT)
    first = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        first.assign([TopicPartition(topic, 0)])
        assert [(r.start, r.end) for r in first.recoveries[0].new_ranges] == [(FIRST_COMMIT, 2_000)]
    finally:
        mode_of(first).handover.let_go = lambda keys, lost: None  # type: ignore[method-assign]  # a crash
        first.close()
    with open_store(store_url) as store:
        (token,) = store.ranges(unique_group)
    assert token.is_open and token.progress.committed == FIRST_COMMIT, "nothing of the range was delivered"
    _reset_offset(bootstrap, unique_group, topic, 1_500)

    delivered = delivered_from(bootstrap, topic, unique_group, store_url, set(range(FIRST_COMMIT, 2_000)))

    assert set(range(FIRST_COMMIT, 2_000)) <= delivered
    assert _superseded(store_url, unique_group) == [(FIRST_COMMIT, 2_000)], "the straddling range is retired"


def test_a_re_created_topic_is_not_hidden_by_the_old_incarnations_ranges(
    bootstrap: str, unique_group: str, store_url: str
) -> None:
    topic = f"t-recreated-{unique_group[-24:]}"
    create_topic(bootstrap, topic, 1)
    try:
        _finish_a_range(bootstrap, topic, unique_group, store_url)
        delete_topic(bootstrap, topic)
        create_topic(bootstrap, topic, 1)
        produce(bootstrap, topic, [f"new{i}" for i in range(3_000)], partition=0)
        # the group's offsets went with the old topic; it consumed the new one to 500, then crashed
        _commit_plain(bootstrap, unique_group, topic, 500)

        delivered = delivered_from(bootstrap, topic, unique_group, store_url, set(range(500, 3_000)))

        assert set(range(500, 3_000)) <= delivered
        assert _superseded(store_url, unique_group) == [(FIRST_COMMIT, LOG_END)]
    finally:
        delete_topic(bootstrap, topic)


def test_ranges_of_another_cluster_sharing_the_store_are_neither_believed_nor_retired(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    """One store, two clusters with the same group and topic names: each recovers on its own facts."""
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(LOG_END)], partition=0)
    _commit_plain(bootstrap, unique_group, topic, FIRST_COMMIT)
    elsewhere = "AnotherClusterId000000/0123456789abcdef"
    with open_store(store_url) as store:
        token = store.create_range(unique_group, topic, 0, FIRST_COMMIT, LOG_END, "other-member", elsewhere)
        store.commit_one(
            ProgressUpdate(token.id, "other-member", token.epoch, RangeProgress(FIRST_COMMIT, LOG_END, LOG_END))
        )

    delivered = delivered_from(bootstrap, topic, unique_group, store_url, set(range(FIRST_COMMIT, LOG_END)))

    assert set(range(FIRST_COMMIT, LOG_END)) <= delivered
    with open_store(store_url) as store:
        theirs = store.get(token.id)
    assert (theirs.state, theirs.lineage) == (TokenState.DONE, elsewhere), "the other cluster's range is untouched"


def test_a_range_fastrecover_vouched_for_is_still_not_read_twice(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    """The other side of the rule: Kafka's offset moved down by fastrecover's own hand-back keeps its ranges.

    A graceful close mid-backfill hands the range back (Kafka's offset moves down to the range's
    lowest unfinished offset, with the marker); the successor claims the range instead of retiring it.
    """
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(20_000)], partition=0)
    _commit_plain(bootstrap, unique_group, topic, FIRST_COMMIT)
    first = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        first.subscribe([topic])
        got: list[Message] = []
        poll_until(first, got, lambda: len(got) >= 50, 60, "the first backfilled records")
    finally:
        first.close()
    wait_for(lambda: group_is_empty(bootstrap, unique_group), 30, 0.2, "the first consumer to leave")
    with open_store(store_url) as store:
        (handed_back,) = store.open_ranges(unique_group)
    (offset,) = group_offsets(bootstrap, unique_group, topic)
    assert offset.offset == handed_back.progress.committed, "hand-back moved Kafka's offset down to the range"
    assert (offset.metadata or "").startswith("fr2:"), "with fastrecover's marker"

    delivered = delivered_from(bootstrap, topic, unique_group, store_url, set(range(offset.offset, 20_000)))

    assert set(range(offset.offset, 20_000)) <= delivered
    assert _superseded(store_url, unique_group) == [], "nothing was retired"
    with open_store(store_url) as store:
        claimed = store.get(handed_back.id)
    assert not claimed.is_superseded and claimed.epoch > handed_back.epoch, "the successor claimed the range"


def _delete_rows(store_url: str, group: str) -> None:
    """The store restored from a backup taken before ``group`` had any range: its rows are gone."""
    with open_store(store_url) as store, store.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM fastrecover_ranges WHERE group_id = :g"), {"g": group})


def _backup(store_url: str, group: str) -> list[dict[str, Any]]:
    with open_store(store_url) as store, store.engine.connect() as conn:
        rows = conn.execute(sa.select(RANGES).where(RANGES.c.group_id == group)).mappings().all()
    return [dict(r) for r in rows]


def _restore(store_url: str, group: str, rows: list[dict[str, Any]]) -> None:
    with open_store(store_url) as store, store.engine.begin() as conn:
        conn.execute(sa.delete(RANGES).where(RANGES.c.group_id == group))
        conn.execute(sa.insert(RANGES), rows)


def test_a_backup_from_before_a_reset_does_not_excuse_what_the_reset_asked_for_again(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    """A done range restored from a backup that predates an offset reset still gets its records read again.

    After the reset, a recovery split the whole log off as one range and mirrored it in Kafka's marker; the
    store was then restored from a backup taken before the reset, which holds the old, finished range.
    That range lies below Kafka's offset and its lineage is not the marker's: it says nothing about what
    the reset asked for, and the mirrored range is restored whole.
    """
    topic = topic_factory(partitions=1)
    _finish_a_range(bootstrap, topic, unique_group, store_url)  # done [100, 1100)
    backup = _backup(store_url, unique_group)
    _reset_offset(bootstrap, unique_group, topic, 0)
    after_reset = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        after_reset.assign([TopicPartition(topic, 0)])
        assert [(r.start, r.end) for r in after_reset.recoveries[0].new_ranges] == [(0, LOG_END)]
        produce(bootstrap, topic, ["fresh"], partition=0)
        got: list[Message] = []
        poll_until(after_reset, got, lambda: any(offset_of(m) == LOG_END for m in got), 30, "the fresh record")
        after_reset.commit(offsets=[TopicPartition(topic, 0, LOG_END + 1)], asynchronous=False)
    finally:
        mode_of(after_reset).handover.let_go = lambda keys, lost: None  # type: ignore[method-assign]  # a crash
        after_reset.close()
    (marked,) = group_offsets(bootstrap, unique_group, topic)
    assert marked.offset == LOG_END + 1 and (marked.metadata or "").startswith("fr2:"), "the marker mirrors [0, 1100)"
    _restore(store_url, unique_group, backup)

    delivered = delivered_from(bootstrap, topic, unique_group, store_url, set(range(LOG_END)))

    assert set(range(LOG_END)) <= delivered


def test_a_store_restored_from_an_older_backup_takes_the_ranges_back_from_kafkas_marker(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    """A mirror-restored range finishes under assign(): committed() and Kafka's offset reach its end."""
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(2_000)], partition=0)
    _commit_plain(bootstrap, unique_group, topic, 0)
    first = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        first.assign([TopicPartition(topic, 0)])
        assert first.recoveries and first.recoveries[0].new_ranges, "the lag [0, 2000) became a range"
    finally:
        mode_of(first).handover.let_go = lambda keys, lost: None  # type: ignore[method-assign]  # a crash
        first.close()
    (marked,) = group_offsets(bootstrap, unique_group, topic)
    assert marked.offset == 0 and (marked.metadata or "").startswith("fr2:"), "Kafka carries the marker"
    _delete_rows(store_url, unique_group)

    second = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        second.assign([TopicPartition(topic, 0)])
        got: list[Message] = []

        def commit_each() -> bool:
            msg = second.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg)
                second.commit(message=msg, asynchronous=False)
            return {offset_of(m) for m in got} >= set(range(2_000))

        wait_for(commit_each, 90, interval=0.001, what="the restored range, each record committed")

        def at_the_end() -> bool:
            second.poll(0.05)
            (answer,) = second.committed([TopicPartition(topic, 0)], timeout=10)
            return answer.offset == 2_000

        wait_for(at_the_end, 30, interval=0.01, what="committed() to reach the restored range's end")
        (kafka,) = group_offsets(bootstrap, unique_group, topic)
        wait_for(
            lambda: group_offsets(bootstrap, unique_group, topic)[0].offset == 2_000,
            30,
            0.1,
            f"Kafka's offset to follow the finished range (it is {kafka.offset})",
        )
    finally:
        second.close()


def test_a_deleted_group_whose_name_is_reused_starts_afresh(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    topic = topic_factory(partitions=1)
    _finish_a_range(bootstrap, topic, unique_group, store_url)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.delete_consumer_groups([unique_group], request_timeout=30).values()
    future.result(timeout=30)

    delivered = delivered_from(bootstrap, topic, unique_group, store_url, set(range(LOG_END)))

    assert set(range(LOG_END)) <= delivered, "auto.offset.reset=earliest: everything, as for a plain consumer"
    assert _superseded(store_url, unique_group) == [(FIRST_COMMIT, LOG_END)], "the old group's range is retired"


def test_partitions_added_while_a_member_runs_are_read_from_their_start(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(500)], partition=0)
    _commit_plain(bootstrap, unique_group, topic, 100)
    consumer = Consumer(
        parallel_config(bootstrap, unique_group, store_url, **{"topic.metadata.refresh.interval.ms": 500})
    )
    got: list[Message] = []
    try:
        consumer.subscribe([topic])
        consume_until(consumer, got, lambda: len(got) >= 400, 60, "the lag of partition 0")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        (future,) = admin.create_partitions([NewPartitions(topic, 3)]).values()
        future.result(timeout=30)
        for partition in (1, 2):
            produce(bootstrap, topic, [f"n{i}" for i in range(200)], partition=partition)

        def every_new_record() -> bool:
            return all({offset_of(m) for m in got if m.partition() == p} >= set(range(200)) for p in (1, 2))

        consume_until(consumer, got, every_new_record, 90, "every record of the two new partitions")
    finally:
        consumer.close()
    assert {offset_of(m) for m in got if m.partition() == 0} >= set(range(100, 500))
