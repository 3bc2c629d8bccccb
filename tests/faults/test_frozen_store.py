"""A store that stops answering without failing: every wait on it is bounded on the client's side.

Networks freeze more often than they fail: a proxy between the consumer and
PostgreSQL stops passing bytes while every socket stays open, so the server
never sees a statement and its timeouts never fire.  A synchronous commit must
raise ``StoreUnavailableError`` within ``lock + statement timeout + 5 s``,
``poll()`` must go on serving records, ``close()`` must return within the same
bound, and nothing may be reported committed that the store does not have.
SQLite's counterpart is a file whose write lock another process holds.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Message, TopicPartition
from sqlalchemy.engine import Engine, make_url

from fastrecover import Consumer
from fastrecover.errors import StoreUnavailableError
from fastrecover.store import open_store
from fastrecover_tools.testing.broker import produce
from fastrecover_tools.testing.proxy import freezable_proxy
from tests.integration.helpers import consume_until, offset_of, parallel_config

LOCK_MS = 1_000
STATEMENT_MS = 2_000
#: the documented bound: lock timeout + statement timeout + 5 s
BOUND_S = (LOCK_MS + STATEMENT_MS) / 1000 + 5
#: what a loaded CI machine may add to it (scheduling, the broker round trips of close())
SLACK_S = 5.0


@pytest.fixture
def pg_database(pg_admin_engine: Engine, pg_url: str) -> Iterator[str]:
    name = f"fr_frozen_{uuid.uuid4().hex[:12]}"
    with pg_admin_engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with pg_admin_engine.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _backfilling(bootstrap: str, topic: str, group: str, store_url: str) -> tuple[Consumer, list[Message]]:
    """A consumer in the middle of a 3000-record backfill, its schema and first writes done."""
    produce(bootstrap, topic, [f"r{i}" for i in range(3_000)], partition=0)
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        plain.close()
    consumer = Consumer(
        parallel_config(
            bootstrap,
            group,
            store_url,
            **{"fastrecover.store.lock.timeout.ms": LOCK_MS, "fastrecover.store.statement.timeout.ms": STATEMENT_MS},
        )
    )
    consumer.subscribe([topic])
    got: list[Message] = []
    consume_until(consumer, got, lambda: len(got) >= 300, 60, "the first 300 backfilled records")
    consumer.commit(asynchronous=False)  # the store answers: the range's progress is durable up to here
    return consumer, got


def _bounded(what: str, call: Any) -> tuple[float, BaseException | None]:
    began = time.monotonic()
    try:
        call()
        error: BaseException | None = None
    except Exception as exc:
        error = exc
    took = time.monotonic() - began
    assert took <= BOUND_S + SLACK_S, f"{what} took {took:.1f} s, beyond the bound of {BOUND_S:g} s"
    return took, error


def test_a_frozen_postgresql_network_keeps_commit_and_close_bounded(
    bootstrap: str, topic_factory: Any, unique_group: str, pg_database: str
) -> None:
    real = make_url(pg_database)
    with freezable_proxy(real.host or "127.0.0.1", real.port or 5432) as proxy:
        via_proxy = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        topic = topic_factory(partitions=1)
        consumer, got = _backfilling(bootstrap, topic, unique_group, via_proxy)
        try:
            consume_until(consumer, got, lambda: len(got) >= 600, 60, "more backfilled records")
            proxy.freeze()

            _took, error = _bounded("commit(asynchronous=False)", lambda: consumer.commit(asynchronous=False))
            assert isinstance(error, StoreUnavailableError), f"expected StoreUnavailableError, got {error!r}"
            (answer,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)

            before = len(got)
            consume_until(consumer, got, lambda: len(got) >= before + 200, 60, "records while the store is frozen")
        finally:
            _took, error = _bounded("close()", consumer.close)
        assert error is None, f"close() raised {error!r}"
        proxy.thaw()

    with open_store(pg_database) as store:
        (token,) = store.ranges(unique_group)
    assert answer.offset <= token.progress.committed, "committed() never claims progress the store lacks"
    assert answer.offset >= 300, "what the store had before the freeze still counts"
    assert max(offset_of(m) for m in got) > 600


def test_a_locked_sqlite_file_makes_a_synchronous_commit_raise_within_the_bound(
    bootstrap: str, topic_factory: Any, unique_group: str, tmp_path: Path
) -> None:
    path = tmp_path / "ranges.db"
    topic = topic_factory(partitions=1)
    consumer, got = _backfilling(bootstrap, topic, unique_group, f"sqlite:///{path}")
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        consume_until(consumer, got, lambda: len(got) >= 600, 60, "more backfilled records")
        holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock and does not let go

        _took, error = _bounded("commit(asynchronous=False)", lambda: consumer.commit(asynchronous=False))
        assert isinstance(error, StoreUnavailableError), f"expected StoreUnavailableError, got {error!r}"
    finally:
        _took, error = _bounded("close()", consumer.close)
        holder.execute("ROLLBACK")
        holder.close()
    assert error is None, f"close() raised {error!r}"
