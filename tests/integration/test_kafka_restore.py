"""Kafka's side restored from a backup: a topic's records and its group's offsets, metadata included.

A full-cluster snapshot restore (every broker's disks) does this, and so do backup tools that restore a
topic and its consumer groups' offsets together.  The restored committed offset carries the marker it was
committed with, so it names a lineage fastrecover wrote; the store, kept outside Kafka, still holds the
ranges written *after* the snapshot.  Their offsets above the snapshot's log end now hold records produced
after the restore, which nobody has read: a range believed there would hide them for good.

Each test takes the "snapshot" (the records up to now and the group's committed offset with its metadata),
lets fastrecover go on, restores the snapshot the way the tools do (topic re-created, the same records at
the same offsets, the offset committed with the old metadata), produces new records, and asks a new
fastrecover consumer for every record at or after the restored offset.
"""

from __future__ import annotations

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Message, TopicPartition

from fastrecover import Consumer
from fastrecover.store import open_store
from fastrecover.tokens import TokenState
from fastrecover_tools.testing.broker import create_topic, delete_topic, group_is_empty, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import (
    close_as_crashed,
    delivered_from,
    group_offsets,
    offset_of,
    parallel_config,
    poll_until,
)

FIRST_COMMIT = 100


def _restore(bootstrap: str, topic: str, group: str, records: list[str], snapshot: TopicPartition) -> None:
    """The topic re-created with ``records`` at their old offsets, and the group's offset as the snapshot had it."""
    delete_topic(bootstrap, topic)
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, records, partition=0)
    _commit(bootstrap, group, TopicPartition(topic, 0, snapshot.offset, metadata=snapshot.metadata))
    (restored,) = group_offsets(bootstrap, group, topic)
    assert (restored.offset, restored.metadata) == (snapshot.offset, snapshot.metadata), "the snapshot's marker"


def _log_at_first_commit(bootstrap: str, topic: str, group: str, count: int) -> list[str]:
    """A new topic of ``count`` records, the group's offset at FIRST_COMMIT (plain); returns the records."""
    records = [f"r{i}" for i in range(count)]
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, records, partition=0)
    _commit(bootstrap, group, TopicPartition(topic, 0, FIRST_COMMIT))
    return records


def _commit(bootstrap: str, group: str, tp: TopicPartition) -> None:
    """Commit ``tp`` (its metadata too) for ``group``, as a plain client or a restore tool does."""
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        plain.commit(offsets=[tp], asynchronous=False)
    finally:
        plain.close()


def _restore_then_read(
    bootstrap: str, topic: str, group: str, store_url: str, old: list[str], snapshot: TopicPartition, new: range
) -> None:
    """Restore the snapshot, produce records at the offsets ``new`` (nobody has read them), and ask for them."""
    _restore(bootstrap, topic, group, old, snapshot)
    produced = produce(bootstrap, topic, [f"new{i}" for i in new], partition=0)
    assert [d.offset for d in produced] == list(new), "the new records land where the ranges written since lie"

    delivered = delivered_from(bootstrap, topic, group, store_url, set(new))

    assert set(new) <= delivered


def _backfill_to_the_end(bootstrap: str, topic: str, group: str, store_url: str, lag: range) -> None:
    """A fastrecover member recovers, backfills ``lag`` to its end, commits (at the log end) and leaves."""
    consumer = Consumer(parallel_config(bootstrap, group, store_url))
    got: list[Message] = []
    try:
        consumer.subscribe([topic])

        def backfilled() -> bool:
            if not {offset_of(m) for m in got} >= set(lag):
                return False
            consumer.poll(0)  # the records returned so far count as done (auto offset store)
            consumer.commit(asynchronous=False)
            return _all_done(store_url, group)

        poll_until(consumer, got, backfilled, 90, f"the lag {lag}")
    finally:
        consumer.close()
    wait_for(lambda: group_is_empty(bootstrap, group), 30, 0.2, "the member to leave")


def _all_done(store_url: str, group: str) -> bool:
    with open_store(store_url) as store:
        tokens = store.ranges(group)
    return bool(tokens) and all(t.state is TokenState.DONE for t in tokens if not t.is_superseded)


def test_a_range_written_after_the_snapshot_does_not_hide_records_produced_after_the_restore(
    bootstrap: str, unique_group: str, store_url: str
) -> None:
    topic = f"t-restored-{unique_group[-24:]}"
    try:
        old = _log_at_first_commit(bootstrap, topic, unique_group, 1_100)
        first = Consumer(parallel_config(bootstrap, unique_group, store_url))
        try:
            first.assign([TopicPartition(topic, 0)])
            assert [(r.start, r.end) for r in first.recoveries[0].new_ranges] == [(FIRST_COMMIT, 1_100)]
        finally:
            close_as_crashed(first)
        # the snapshot: Kafka's offset with the marker of the range's lineage, the log up to 1100
        (snapshot,) = group_offsets(bootstrap, unique_group, topic)
        assert snapshot.offset == FIRST_COMMIT and (snapshot.metadata or "").startswith("fr2:"), "the marker"

        # after the snapshot: a lag, and a recovery that backfills [100, 3000) to the end
        produce(bootstrap, topic, [f"m{i}" for i in range(1_900)], partition=0)
        _backfill_to_the_end(bootstrap, topic, unique_group, store_url, range(FIRST_COMMIT, 3_000))

        _restore_then_read(bootstrap, topic, unique_group, store_url, old, snapshot, new=range(1_100, 3_000))
    finally:
        delete_topic(bootstrap, topic)


def test_a_hand_back_after_the_snapshot_does_not_hide_records_produced_after_the_restore(
    bootstrap: str, unique_group: str, store_url: str
) -> None:
    """The done tokens a graceful close writes over the primary's records are not the snapshot's to vouch for.

    The member closes mid-backfill: the records its primary read above the open range become done tokens,
    and Kafka's offset moves down to the range.  Restored, the log ends where it did at the snapshot, and
    the offsets those done tokens cover hold new records.
    """
    topic = f"t-restored-{unique_group[-24:]}"
    try:
        old = _log_at_first_commit(bootstrap, topic, unique_group, 20_000)
        member = Consumer(parallel_config(bootstrap, unique_group, store_url))
        try:
            member.subscribe([topic])
            got: list[Message] = []
            poll_until(member, got, lambda: bool(member.recoveries), 60, "the recovery")
            (snapshot,) = group_offsets(bootstrap, unique_group, topic)
            assert snapshot.offset == FIRST_COMMIT and (snapshot.metadata or "").startswith("fr2:"), "the marker"
            produce(bootstrap, topic, [f"live{i}" for i in range(500)], partition=0)
            poll_until(member, got, lambda: {offset_of(m) for m in got} >= set(range(20_000, 20_500)), 60, "live")
            member.poll(0)  # the records returned so far count as done (auto offset store)
            member.commit(asynchronous=False)
        finally:
            member.close()  # graceful: the hand-back writes done tokens over [20000, 20500)
        wait_for(lambda: group_is_empty(bootstrap, unique_group), 30, 0.2, "the member to leave")
        with open_store(store_url) as store:
            done = [t.span for t in store.ranges(unique_group) if t.state is TokenState.DONE]
        assert any(span.end >= 20_500 for span in done), f"the hand-back wrote the primary's records done: {done}"

        _restore_then_read(bootstrap, topic, unique_group, store_url, old, snapshot, new=range(20_000, 20_500))
    finally:
        delete_topic(bootstrap, topic)
