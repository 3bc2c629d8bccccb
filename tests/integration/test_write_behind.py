"""Write-behind range commits (issue 9) on a real broker and real stores.

An asynchronous commit of backfilled records only marks progress in memory; the
store has it after the next write-behind flush.  These tests pin the contract:
a crash before the flush re-delivers (nothing lost), a synchronous commit is
durable when it returns, and a revoke (here: close) writes what is pending.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Message

from fastrecover import Consumer
from fastrecover.store import open_store
from fastrecover_tools.testing.broker import group_is_empty, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import (
    SESSION_MS,
    consume_until,
    group_offsets,
    lag_after_crash,
    parallel_config,
    poll_until,
)
from tests.integration.procs import WorkerProcess

#: long enough that no write-behind flush happens while a test looks
_NEVER_MS = 60_000


def _range_committed(store_url: str, group: str) -> int:
    with open_store(store_url) as store:
        (token,) = [t for t in store.ranges(group) if t.progress.start == 20]  # the lag's range
        return token.progress.committed


def test_sigkill_between_async_commits_and_their_flush_loses_nothing(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=1)
    lag_after_crash(
        bootstrap, topic, unique_group, store_url, tmp_path, produced=100, commit_at=20, block_at=40, log_end=3000
    )
    # a second incarnation backfills 20..499, committing each record asynchronously, and dies
    # before any write-behind flush
    worker = WorkerProcess(
        [
            "--bootstrap", bootstrap, "--topic", topic, "--group", unique_group, "--parallel",
            "--store-url", store_url, "--min-offsets", "10", "--ledger", str(tmp_path / "ledger2"),
            "--commit", "message-async", "--block-at", "500", "--session-ms", str(SESSION_MS),
            "--set", f"fastrecover.backfill.commit.interval.ms={_NEVER_MS}",
        ],
        tmp_path / "worker2.log",
    )  # fmt: skip
    try:
        blocked = worker.wait_event("blocked", 90)
        assert blocked["offset"] == 500
    finally:
        worker.sigkill()
    wait_for(lambda: group_is_empty(bootstrap, unique_group), 30, 0.2, "the killed member to leave")
    assert _range_committed(store_url, unique_group) == 20, "async progress was never flushed before the kill"

    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        consume_until(consumer, got, lambda: {m.offset() for m in got} >= set(range(20, 3000)), 120, "the lag")
    finally:
        consumer.close()


@contextlib.contextmanager
def _backfilling(
    bootstrap: str, topic: str, group: str, store_url: str, tmp_path: Path
) -> Iterator[tuple[Consumer, list[Message]]]:
    """A restarted consumer with a range [20, 2000) that has returned the backfill 20..119 (no flush yet)."""
    lag_after_crash(bootstrap, topic, group, store_url, tmp_path, produced=100, commit_at=20, block_at=40, log_end=2000)
    consumer = Consumer(
        parallel_config(bootstrap, group, store_url, **{"fastrecover.backfill.commit.interval.ms": _NEVER_MS})
    )
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        poll_until(consumer, got, lambda: {m.offset() for m in got} >= set(range(20, 120)), 60, "backfill 20..119")
        yield consumer, got
    finally:
        consumer.close()


def test_sync_commit_is_durable_when_it_returns_and_close_flushes_async_ones(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    with _backfilling(bootstrap, topic_factory(partitions=1), unique_group, store_url, tmp_path) as (consumer, got):
        by_offset = {m.offset(): m for m in got}
        for offset in range(20, 60):
            assert consumer.commit(message=by_offset[offset], asynchronous=True) is None
        assert _range_committed(store_url, unique_group) == 20, "asynchronous: in memory until the flush"
        consumer.commit(message=by_offset[60], asynchronous=False)
        assert _range_committed(store_url, unique_group) == 61, "synchronous: everything pending is durable"
        for offset in range(61, 120):
            consumer.commit(message=by_offset[offset], asynchronous=True)
    assert _range_committed(store_url, unique_group) == 120, "close() (a revoke) writes what was pending"


def test_a_sync_commit_of_backfilled_and_fresh_records_is_durable_in_both_logs_when_it_returns(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    """The batch-sync pattern: one commit(asynchronous=False) after records of both consumers.

    The store transaction and Kafka's commit overlap (the writer thread runs the first while the
    caller waits on the second); when the call returns, both must hold what was returned.
    """
    topic = topic_factory(partitions=1)
    with _backfilling(bootstrap, topic, unique_group, store_url, tmp_path) as (consumer, got):
        produce(bootstrap, topic, [f"fresh-{i}" for i in range(10)])  # offsets 2000..2009: the primary's
        poll_until(consumer, got, lambda: {m.offset() for m in got} >= set(range(2000, 2010)), 60, "fresh 2000..2009")
        offsets = {m.offset() or 0 for m in got}
        backfilled = 20
        while backfilled in offsets:
            backfilled += 1
        fresh = max(offsets) + 1
        assert 120 <= backfilled <= 2000 and fresh == 2010
        result = consumer.commit(asynchronous=False)
        assert _range_committed(store_url, unique_group) == backfilled, "the store has the backfilled prefix"
        (kafka,) = group_offsets(bootstrap, unique_group, topic)
        assert kafka.offset == fresh, "Kafka has the fresh records"
        assert result is not None
        returned = {tp.offset for tp in result}
        assert {backfilled, fresh} <= returned, f"both logs' commits are returned, got {result}"
