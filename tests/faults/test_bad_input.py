"""Fault 7: bad input gets a clear error naming the cause, and never corrupts the store.

Malformed configuration values, a topic that does not exist, a corrupt token row, a store at an older
schema version, and commit() of offsets for partitions that are not assigned.  For each, the range
store is compared before and after: nothing in it may change because of the bad input.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
import sqlalchemy as sa
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from fastrecover import Consumer
from fastrecover.errors import ConfigError, SchemaBehindError
from fastrecover.store import build_engine, open_store
from fastrecover.store.models import VERSION_TABLE
from fastrecover_tools.testing.broker import produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import crash_after_commit, offset_of, parallel_config, poll_until

pytestmark = pytest.mark.faults


def _rows(url: str) -> list[tuple[Any, ...]]:
    engine = build_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text("SELECT * FROM fastrecover_ranges ORDER BY id"))]
    finally:
        engine.dispose()


def _seeded_store(url: str) -> list[tuple[Any, ...]]:
    with open_store(url) as store:
        token = store.create_range("other-group", "other-topic", 0, 10, 50, "someone")
        store.claim(token.id, "someone-else")
    return _rows(url)


@pytest.mark.parametrize(
    ("key", "value", "error", "needle"),
    [
        ("fastrecover.backfill.min.offsets", "ten", ConfigError, "fastrecover.backfill.min.offsets"),
        ("fastrecover.backfill.batch.size", 0, ConfigError, "fastrecover.backfill.batch.size"),
        ("fastrecover.store.url", "not-a-url", ConfigError, "fastrecover.store.url"),
        ("enable.parallel.rebalance", "maybe", ConfigError, "enable.parallel.rebalance"),
        ("fastrecover.backfil.min.offsets", 5, ConfigError, "unknown fastrecover key 'fastrecover.backfil"),
        ("session.timeout.ms", "abc", KafkaException, "session.timeout.ms"),
    ],
)
def test_malformed_config_is_refused_by_name_and_touches_no_store(
    bootstrap: str, unique_group: str, tmp_path: Path, key: str, value: Any, error: type[Exception], needle: str
) -> None:
    url = f"sqlite:///{tmp_path / 'ranges.db'}"
    before = _seeded_store(url)
    with pytest.raises(error, match=re.escape(needle)):
        Consumer({**parallel_config(bootstrap, unique_group, url), key: value})
    assert _rows(url) == before


def test_topic_that_does_not_exist_is_reported_by_name(bootstrap: str, unique_group: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ranges.db'}"
    before = _seeded_store(url)
    missing = f"no-such-topic-{unique_group}"
    consumer = Consumer(parallel_config(bootstrap, unique_group, url))
    try:
        consumer.subscribe([missing])

        def error() -> Message | None:
            msg = consumer.poll(0.2)
            return msg if msg is not None and msg.error() is not None else None

        msg = wait_for(error, 60, 0.01, "the unknown-topic error")
        err = msg.error() if msg is not None else None  # wait_for returns a truthy value: never None
        assert err is not None
        assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        assert missing in err.str()
        assert consumer.recoveries == []
    finally:
        consumer.close()
    assert _rows(url) == before


def test_corrupt_token_row_is_named_never_rewritten_and_its_range_survives(
    bootstrap: str,
    topic_factory: Any,
    unique_group: str,
    store_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(50)], partition=0)
    crash_after_commit(bootstrap, topic, unique_group, store_url, tmp_path, commit_at=20, block_at=50)
    produce(bootstrap, topic, [f"r{i}" for i in range(50, 200)], partition=0)

    first = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        first.subscribe([topic])
        got: list[Message] = []
        poll_until(first, got, lambda: {m.offset() for m in got} >= set(range(20, 30)), 60, "backfill 20..29")
        for m in sorted((m for m in got if 20 <= offset_of(m) < 30), key=offset_of):
            first.commit(message=m, asynchronous=False)
    finally:
        first.close()
    with open_store(store_url) as store:
        (token,) = store.open_ranges(unique_group)
    assert (token.progress.start, token.progress.committed) == (20, 30)

    engine = build_engine(store_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE fastrecover_ranges SET completed = 'not a completion map' WHERE id = :i"),
                {"i": token.id},
            )
    finally:
        engine.dispose()
    corrupted = _rows(store_url)

    caplog.set_level(logging.WARNING, logger="fastrecover")
    second = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        second.subscribe([topic])
        more: list[Message] = []
        poll_until(second, more, lambda: second.recoveries, 60, "the recovery over the corrupt row")
        (report,) = second.recoveries
        assert report.degraded and report.new_ranges == ()
    finally:
        second.close()
    named = [r.getMessage() for r in caplog.records if f"row id={token.id}" in r.getMessage()]
    assert named and "completed" in named[0] and "not a completion map" in named[0], caplog.text[-3000:]
    assert _rows(store_url) == corrupted, "recovery never rewrites a row it cannot read"

    engine = build_engine(store_url)
    try:
        with engine.begin() as conn:  # the operator repairs the row
            conn.execute(sa.text("UPDATE fastrecover_ranges SET completed = '' WHERE id = :i"), {"i": token.id})
    finally:
        engine.dispose()
    third = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        third.subscribe([topic])
        last: list[Message] = []
        poll_until(
            third,
            last,
            lambda: {m.offset() for m in last} >= set(range(30, 200)),
            60,
            "the repaired range backfilled from its committed offset",
        )
        assert min(offset_of(m) for m in last) == 30
    finally:
        third.close()


def test_store_at_an_older_schema_is_refused_and_left_as_it_is(
    bootstrap: str, unique_group: str, store_url: str
) -> None:
    before = _seeded_store(store_url)
    engine = build_engine(store_url)
    try:
        with engine.begin() as conn:  # the unversioned schema of an older fastrecover
            conn.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")
    finally:
        engine.dispose()
    # The store opens on a thread while construction returns (a recovery need not wait for SQLAlchemy):
    # the refusal reaches the application at its first poll() after the open ended.
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        with pytest.raises(SchemaBehindError, match=r"fastrecover db upgrade --store-url"):
            wait_for(lambda: consumer.poll(0.05) and False, 30, 0.01, "poll() to raise SchemaBehindError")
    finally:
        consumer.close()
    assert _rows(store_url) == before
    engine = build_engine(store_url)
    try:
        assert not sa.inspect(engine).has_table(VERSION_TABLE), "never upgraded implicitly"
    finally:
        engine.dispose()


def test_commit_with_unassigned_partitions_behaves_as_plain_and_routes_the_rest(
    bootstrap: str, topic_factory: Any, unique_group: str, tmp_path: Path
) -> None:
    """Issue 10: no error of ours for a commit plain accepts; the valid parts reach their logs."""
    url = f"sqlite:///{tmp_path / 'ranges.db'}"
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(50)], partition=0)
    crash_after_commit(bootstrap, topic, unique_group, url, tmp_path, commit_at=10, block_at=50)
    produce(bootstrap, topic, [f"r{i}" for i in range(50, 100)], partition=0)
    consumer = Consumer(parallel_config(bootstrap, unique_group, url))
    plain = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": unique_group + "-plain"})
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        poll_until(consumer, got, lambda: {m.offset() for m in got} >= {10, 11, 12}, 60, "backfill records")

        def bad() -> list[TopicPartition]:
            # an offset inside the assigned partition's range, plus two strays
            return [
                TopicPartition(topic, 0, 13),
                TopicPartition("nope", 3, 10),
                TopicPartition(topic, 7, 1),
            ]

        def outcome(call: Any) -> Any:
            try:
                result = call()
            except Exception as exc:
                return type(exc), exc.args[0].code() if isinstance(exc, KafkaException) else None
            return [(tp.topic, tp.partition, tp.error.code() if tp.error else None) for tp in result or []]

        ours = outcome(lambda: consumer.commit(offsets=bad(), asynchronous=False))
        theirs = outcome(lambda: plain.commit(offsets=bad(), asynchronous=False))
        assert type(ours) is type(theirs)
        if isinstance(theirs, tuple):
            assert ours == theirs, "the same exception type and error code as confluent_kafka"
        assert consumer.backfill_progress()[0][1].committed == 13, "the range's part reached the store"
        assert consumer.commit(offsets=bad(), asynchronous=True) is None
    finally:
        consumer.close()
