"""The store's open deferred past the first recovery, when no first recovery waits for it.

With ``fastrecover.recovery.replay.max.offsets`` above 0 and the commit mirror on (the defaults), the
first recovery never waits for the store: it replays a small lag or makes its ranges durable in Kafka's
commit metadata.  The open (SQLAlchemy's import, the schema check) then begins after that recovery, so
that its CPU does not compete with the group join and the first records; whoever needs the store
sooner gets it at once.  The moments the open begins are read on the ``store-open`` fault point.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message, TopicPartition

from fastrecover import Consumer, mode_state
from fastrecover.store import open_store
from fastrecover.store.models import TABLE_NAME
from fastrecover.tokens import TokenState
from fastrecover_tools.testing.broker import produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import consume_until, mode_of, offset_of, parallel_config

pytestmark = pytest.mark.integration

COMMITTED = 100
LOG_END = 400


@pytest.fixture
def slow_deferral(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deferral bound no test reaches, and a replay's delay long enough to tell from "at once"."""
    monkeypatch.setattr(mode_state, "STORE_OPEN_DEFER_S", 120.0)
    monkeypatch.setattr(mode_state, "STORE_OPEN_AFTER_REPLAY_S", 1.0)


def _lag_behind_a_plain_commit(bootstrap: str, topic: str, group: str, store_url: str) -> None:
    """Records 0..LOG_END-1, the group's offset at COMMITTED (a plain commit), the store's schema made."""
    produce(bootstrap, topic, [f"r{i}" for i in range(LOG_END)], partition=0)
    open_store(store_url).close()  # creates the schema, as an earlier incarnation did
    plain = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, COMMITTED)], asynchronous=False)
    finally:
        plain.close()


def _read_slowly(consumer: Consumer, count: int) -> list[int]:
    """An application slower than the open's delay: one record per poll, 10 ms of work each; the offsets read."""
    offsets: list[int] = []
    while len(offsets) < count:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            offsets.append(offset_of(msg))
            time.sleep(0.01)  # the application's work on the record
    return offsets


def _defaults(bootstrap: str, group: str, store_url: str, **extra: Any) -> dict[str, Any]:
    """The library's replay limit (10,000) and mirror, on the tests' other settings."""
    config = parallel_config(bootstrap, group, store_url)
    del config["fastrecover.recovery.replay.max.offsets"]
    config.update(extra)
    return config


@pytest.mark.usefixtures("slow_deferral")
def test_a_replay_leaves_the_store_closed_until_after_it_and_the_records_flow(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_opens: list[float]
) -> None:
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    consumer = Consumer(_defaults(bootstrap, unique_group, store_url))
    got: list[Message] = []
    try:
        link = mode_of(consumer).link
        assert link.opening and not store_opens, "constructed: the open waits for the first recovery"
        before = time.monotonic()
        consumer.assign([TopicPartition(topic, 0)])
        (report,) = consumer.recoveries
        assert report.primary_start is None and not report.stored, "replayed from the committed offset"
        consume_until(consumer, got, lambda: len(got) >= LOG_END - COMMITTED, 30, "the replayed lag")
        assert sorted(offset_of(m) for m in got) == list(range(COMMITTED, LOG_END))
        wait_for(lambda: not link.opening, 30, 0.01, "the deferred open to end")
        assert len(store_opens) == 1 and store_opens[0] >= before + mode_state.STORE_OPEN_AFTER_REPLAY_S, (
            "the open began only after the replay's delay"
        )
        assert link.get() is not None
    finally:
        consumer.close()


@pytest.mark.usefixtures("slow_deferral")
def test_a_replay_still_delivering_its_lag_keeps_the_store_closed_until_it_caught_up(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_opens: list[float]
) -> None:
    """The open's CPU must not fall inside a long replay: it waits until the lag is read, and the delay."""
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    consumer = Consumer(_defaults(bootstrap, unique_group, store_url))
    try:
        link = mode_of(consumer).link
        consumer.assign([TopicPartition(topic, 0)])
        (report,) = consumer.recoveries
        assert report.primary_start is None, "replayed from the committed offset"
        started = time.monotonic()
        offsets = _read_slowly(consumer, LOG_END - COMMITTED)
        caught_up = time.monotonic()
        assert offsets == list(range(COMMITTED, LOG_END))
        assert caught_up - started > 2 * mode_state.STORE_OPEN_AFTER_REPLAY_S, "the replay outlasted the delay"
        assert not store_opens, "the store stayed closed while the replay delivered its lag"

        def opened() -> bool:
            consumer.poll(0.05)  # the application polls on: ticks run
            return not link.opening

        wait_for(opened, 30, 0.001, "the deferred open to end")
        assert store_opens and store_opens[0] > caught_up, "it began once the replay had caught up"
    finally:
        consumer.close()


@pytest.mark.usefixtures("slow_deferral")
def test_a_jump_on_the_marker_keeps_the_store_closed_while_the_child_reads_early_and_it_takes_the_range_after(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, store_opens: list[float]
) -> None:
    """The open's CPU must not halve the child's rate: it waits until the early ranges are read, and the delay."""
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    config = _defaults(
        bootstrap,
        unique_group,
        store_url,
        **{
            "fastrecover.recovery.replay.max.offsets": 100,
            "fastrecover.recovery.jump.on.mirror": True,
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 200,
        },
    )
    consumer = Consumer(config)
    try:
        link = mode_of(consumer).link
        assert not store_opens
        consumer.assign([TopicPartition(topic, 0)])
        (report,) = consumer.recoveries
        assert report.primary_start == LOG_END and [(r.start, r.end) for r in report.new_ranges] == [
            (COMMITTED, LOG_END)
        ]
        started = time.monotonic()
        offsets = _read_slowly(consumer, LOG_END - COMMITTED)
        caught_up = time.monotonic()
        assert offsets == list(range(COMMITTED, LOG_END)), "the child read the range before the store opened"
        assert caught_up - started > 2 * mode_state.STORE_OPEN_AFTER_REPLAY_S, "the reading outlasted the delay"
        assert not store_opens, "the store stayed closed while the child read the range early"

        def opened() -> bool:
            consumer.poll(0.05)
            return not link.opening

        wait_for(opened, 30, 0.001, "the deferred open to end")
        assert store_opens and store_opens[0] > caught_up, "it began once the child had read the range"

        def done() -> bool:
            consumer.poll(0.05)
            with open_store(store_url) as store:
                tokens = store.ranges(unique_group)
            return len(tokens) == 1 and tokens[0].state is TokenState.DONE

        wait_for(done, 60, 0.01, "the store to take the range over, done, with no record read again")
        assert len(offsets) == LOG_END - COMMITTED
    finally:
        consumer.close()


@pytest.mark.usefixtures("slow_deferral")
def test_a_consumer_closed_before_its_deferred_open_began_opens_nothing(
    bootstrap: str, unique_group: str, store_url: str, store_opens: list[float]
) -> None:
    consumer = Consumer(_defaults(bootstrap, unique_group, store_url))
    began = time.monotonic()
    consumer.close()
    assert time.monotonic() - began < 30, "close did not wait for the deferral's bound"
    assert not store_opens, "nothing needed the store: it was never opened"


@pytest.mark.usefixtures("slow_deferral")
def test_with_the_replay_limit_at_zero_the_open_is_not_deferred(
    bootstrap: str, unique_group: str, store_url: str, store_opens: list[float]
) -> None:
    """Every recovery waits for the store then: its open begins at construction, as before."""
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))  # replay.max.offsets 0
    try:
        wait_for(lambda: bool(store_opens), 30, 0.005, "the open to begin with no recovery asking")
        assert mode_of(consumer).link.get() is not None
    finally:
        consumer.close()


@pytest.mark.usefixtures("slow_deferral")
def test_a_store_that_opened_then_fails_its_reads_is_asked_again_after_the_back_off_not_at_every_tick(
    bootstrap: str, topic_factory: Any, unique_group: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The store's part of a replay's recovery, on a store that opened and then cannot be read.

    Each tick (every 50 ms of polling) asked the store again and logged a warning: a hot loop on a store
    that is down.  It is asked once per ``fastrecover.store.retry.backoff.ms``, and the recovery's store
    part waits meanwhile; once the store answers, it is done.
    """
    path = tmp_path / "ranges.db"
    store_url = f"sqlite:///{path}"
    topic = topic_factory(partitions=1)
    _lag_behind_a_plain_commit(bootstrap, topic, unique_group, store_url)
    consumer = Consumer(_defaults(bootstrap, unique_group, store_url))
    broken_s = 2.5
    try:
        mode = mode_of(consumer)
        consumer.assign([TopicPartition(topic, 0)])
        got: list[Message] = []
        consume_until(consumer, got, lambda: len(got) >= LOG_END - COMMITTED, 30, "the replayed lag")
        assert mode.recoverer.pending, "the replay left its recovery's store part for later"
        wait_for(lambda: not mode.link.opening, 30, 0.01, "the deferred open to end (no poll: no tick uses it)")
        with sqlite3.connect(path) as admin:  # the store opened; now its ranges cannot be read
            admin.execute(f"ALTER TABLE {TABLE_NAME} RENAME TO {TABLE_NAME}_away")
        caplog.clear()
        caplog.set_level("DEBUG", logger="fastrecover")
        until = time.monotonic() + broken_s
        while time.monotonic() < until:
            consumer.poll(0.01)
        failures = [r for r in caplog.records if "range store unreadable" in r.getMessage()]
        tries = len(failures)
        assert 2 <= tries <= broken_s / mode.settings.retry_backoff_s + 1, (
            f"{tries} reads of a failing store in {broken_s} s (back-off {mode.settings.retry_backoff_s} s)"
        )
        # said once as a warning; the tries after it, within the minute, at debug level
        assert [r.levelname for r in failures] == ["WARNING"] + ["DEBUG"] * (tries - 1), failures
        assert mode.recoverer.pending, "nothing was recovered from a store that cannot be read"
        with sqlite3.connect(path) as admin:
            admin.execute(f"ALTER TABLE {TABLE_NAME}_away RENAME TO {TABLE_NAME}")

        def recovered() -> bool:
            consumer.poll(0.01)
            return not mode.recoverer.pending

        wait_for(recovered, 30, 0.001, "the store's part of the recovery once the store answers")
        assert any("range store readable during recovery again after" in r.getMessage() for r in caplog.records)
    finally:
        consumer.close()
