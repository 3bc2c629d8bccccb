"""close() hands unfinished ranges back AFTER the application's on_revoke, so a plain successor loses nothing.

close() revokes the partitions (librdkafka calls the application's ``on_revoke``) and hands the open
ranges back by moving Kafka's committed offset down to the lowest unfinished offset.  An application
that commits in ``on_revoke`` (the common pattern) must not undo the hand-back: after close(), Kafka's
committed offset is at or below the lowest offset never delivered, and a plain confluent_kafka
consumer of the same group starting there delivers every record the closed consumer never delivered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from fastrecover import Consumer
from fastrecover_tools.testing.broker import produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.dropin import make_lag
from tests.integration.helpers import group_offsets, offset_of, parallel_config, poll_until

COMMITTED = 10  # the group's offset the "crashed" member left
BACKLOG_END = 2020  # log end at the restart: the backfill owes [COMMITTED, BACKLOG_END)
FRESH = 50  # live records produced after the restart, delivered by the primary
LOG_END = BACKLOG_END + FRESH


@dataclass
class Revokes:
    """What the application's on_revoke saw and did, and whether close() was running at the time."""

    closing: bool = False
    last_fresh: Message | None = None
    calls: list[tuple[bool, list[int], str]] = field(default_factory=list)


def _on_revoke(app_commit: str, revokes: Revokes) -> Any:
    """The application's on_revoke: a synchronous commit, of everything stored or of its last fresh record."""

    def on_revoke(consumer: Any, partitions: list[TopicPartition]) -> None:
        try:
            if app_commit == "message":
                assert revokes.last_fresh is not None, "on_revoke before any fresh record was delivered"
                result = consumer.commit(message=revokes.last_fresh, asynchronous=False)
            else:
                result = consumer.commit(asynchronous=False)
            outcome = f"committed {[(tp.partition, tp.offset) for tp in result or []]}"
        except KafkaException as exc:  # reported in the assertions below, not swallowed silently
            outcome = f"commit raised {exc!r}"
        revokes.calls.append((revokes.closing, [tp.partition for tp in partitions], outcome))

    return on_revoke


def _plain_successor_reads(bootstrap: str, group: str, topic: str) -> set[int]:
    """Offsets a plain consumer of ``group`` delivers from Kafka's committed offset to the log end.

    ``enable.partition.eof`` tells when it reached the log end, whatever offset it started at (a
    successor that starts at the log end delivers nothing, and must still be seen to have finished).
    """
    successor = PlainConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    seen: set[int] = set()
    at_end: list[bool] = []

    def step() -> bool:
        for msg in successor.consume(500, 0.2):
            err = msg.error()
            if err is None:
                seen.add(offset_of(msg))
            elif err.code() == KafkaError._PARTITION_EOF and (msg.offset() or 0) >= LOG_END:
                at_end.append(True)
        return bool(at_end)

    try:
        successor.subscribe([topic])
        wait_for(step, 60, 0.001, "the plain successor to reach the log end")
    finally:
        successor.close()
    return seen


CASES = [
    pytest.param(False, "stored", id="manual-commit-no-args"),
    pytest.param(False, "message", id="manual-commit-last-message"),
    pytest.param(True, "message", id="auto-commit-control"),
]


@pytest.mark.parametrize(("auto_commit", "app_commit"), CASES)
def test_commit_in_on_revoke_during_close_does_not_undo_the_hand_back(
    auto_commit: bool, app_commit: str, bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    """A commit the application makes in on_revoke during close() cannot lift Kafka's offset over the owed range.

    The primary delivers fresh records past the range (its stored offset is above it), the backfill
    is held back by a small queue so most of the range is still undelivered when close() runs.
    """
    _close_after_a_commit_in_on_revoke(
        auto_commit, app_commit, bootstrap, topic_factory(partitions=1), unique_group, store_url, {}
    )


@pytest.mark.parametrize(("auto_commit", "app_commit"), CASES)
def test_with_the_consumer_group_protocol_close_hands_back_after_on_revoke(
    auto_commit: bool,
    app_commit: str,
    kip848_bootstrap: str,
    kip848_topic_factory: Any,
    unique_group: str,
    store_url: str,
) -> None:
    """The same under KIP-848 (``group.protocol=consumer``), whose close revokes through the callback too."""
    topic = kip848_topic_factory(partitions=1)
    _close_after_a_commit_in_on_revoke(
        auto_commit, app_commit, kip848_bootstrap, topic, unique_group, store_url, {"group.protocol": "consumer"}
    )


def _close_after_a_commit_in_on_revoke(
    auto_commit: bool, app_commit: str, bootstrap: str, topic: str, group: str, store_url: str, extra: dict[str, Any]
) -> set[int]:
    """Close during the backfill; the plain successor's check.  Returns the offsets never delivered."""
    make_lag(bootstrap, topic, group, committed=COMMITTED, log_end=BACKLOG_END)
    config = parallel_config(
        bootstrap,
        group,
        store_url,
        **{
            "enable.auto.commit": auto_commit,
            "enable.auto.offset.store": True,
            "fastrecover.backfill.queue.max.messages": 20,
            "fastrecover.backfill.batch.size": 10,
            **extra,
        },
    )
    if config.get("group.protocol") == "consumer":  # the broker owns these there: librdkafka refuses them
        for key in ("session.timeout.ms", "heartbeat.interval.ms"):
            config.pop(key, None)
    revokes = Revokes()
    consumer = Consumer(config)
    delivered: list[Message] = []

    def seen_fresh() -> set[int]:
        fresh = [m for m in delivered if offset_of(m) >= BACKLOG_END]
        if fresh:
            revokes.last_fresh = max(fresh, key=offset_of)
        return {offset_of(m) for m in fresh}

    try:
        consumer.subscribe([topic], on_revoke=_on_revoke(app_commit, revokes))
        poll_until(consumer, delivered, lambda: consumer.recoveries, 60, "the recovery of the lag")
        produce(bootstrap, topic, [f"fresh{i}" for i in range(FRESH)], partition=0)
        poll_until(
            consumer,
            delivered,
            lambda: seen_fresh() == set(range(BACKLOG_END, LOG_END)),
            60,
            "every fresh record from the primary",
        )
    finally:
        revokes.closing = True
        consumer.close()

    got = {offset_of(m) for m in delivered}
    never = set(range(COMMITTED, LOG_END)) - got
    assert never and min(never) < BACKLOG_END, "the test needs part of the backlog undelivered at close()"
    owed = min(never)
    assert any(closing for closing, _, _ in revokes.calls), f"on_revoke did not run during close(): {revokes.calls}"

    (committed,) = group_offsets(bootstrap, group, topic)
    successor = _plain_successor_reads(bootstrap, group, topic)
    lost = sorted(never - successor)
    assert committed.offset <= owed, (
        f"Kafka's committed offset after close() is {committed.offset}, above the lowest offset never "
        f"delivered ({owed}); on_revoke during close(): {revokes.calls}; a plain successor then lost "
        f"{len(lost)} of {len(never)} undelivered records"
    )
    assert not lost, f"a plain successor lost {len(lost)} undelivered records: {lost[:5]}...{lost[-5:]}"
    return never


@pytest.mark.parametrize(("auto_commit", "app_commit"), CASES)
def test_close_records_what_the_primary_returned_so_a_fastrecover_successor_does_not_read_it_again(
    auto_commit: bool, app_commit: str, bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    """The fresh records the primary returned above the open range are handed back as done, not only Kafka's offset.

    Inside the revoke that librdkafka's close runs, the primary's positions and committed offsets
    cannot be read; they are read before it.  Under auto-commit that read holds every fresh record
    returned; with manual commits they are committed only by the application's on_revoke, inside
    close, and what it commits there counts too.  A fastrecover successor then backfills only what
    the closed member never delivered: a rolling restart during a backfill re-reads no fresh record.
    """
    topic = topic_factory(partitions=1)
    never = _close_after_a_commit_in_on_revoke(auto_commit, app_commit, bootstrap, topic, unique_group, store_url, {})
    successor = Consumer(parallel_config(bootstrap, unique_group, store_url, **{"enable.auto.commit": True}))
    delivered: list[Message] = []

    def backfilled() -> bool:
        got = {offset_of(m) for m in delivered}
        return (
            never <= got
            and bool(successor.recoveries)
            and not any(not progress.done for _, progress in successor.backfill_progress())
        )

    try:
        successor.subscribe([topic])
        poll_until(successor, delivered, backfilled, 60, "the successor's backfill of what was never delivered")
        recoveries = successor.recoveries
    finally:
        successor.close()
    again = sorted(o for o in (offset_of(m) for m in delivered) if o >= BACKLOG_END)
    assert not again, (
        f"the successor read {len(again)} fresh records the closed consumer had returned and committed again "
        f"(offsets {again[:3]}...{again[-3:]}); its recovery: {recoveries}"
    )
