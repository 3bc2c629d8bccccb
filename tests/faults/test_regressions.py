"""Regressions found by the fault campaign, each reduced to the smallest reproduction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Message, TopicPartition

from fastrecover import Consumer
from fastrecover.codec import MARKED_MIRROR_LIMIT, encode_mirror, mark, new_lineage
from fastrecover.ranges import RangeProgress
from fastrecover.store import ProgressUpdate, open_store
from fastrecover_tools.chaos.driver import ChaosDriver
from fastrecover_tools.testing.broker import produce
from fastrecover_tools.testing.waiting import wait_for
from tests.faults.conftest import SCRIPTED, DriverFactory, crash_with_lag, verdict_ok
from tests.integration.helpers import crash_after_commit, parallel_config, poll_until

pytestmark = pytest.mark.faults


def test_new_range_starting_where_a_done_range_starts_is_not_cut_short(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    """Lost records 1468..1555 in the 300-cycle campaign (seed 333).

    An incarnation recovered a partition at committed offset C, created range [C, E1), backfilled and
    committed it to the store (done), and was SIGKILLed between the store commit and the Kafka commit:
    the group's committed offset stayed C.  The next recovery planned the new range [C, E2) (done
    ranges are not subtracted), and create_range, idempotent on the range's start, handed back the
    done [C, E1): nothing was held, the primary started at E2, and [E1, E2) was never read.

    The dead incarnation's recovery had committed C again with its marker (its lineage, and the
    range in the mirror), so the range is one the offset vouches for, as in the campaign.
    """
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(50)], partition=0)
    crash_after_commit(bootstrap, topic, unique_group, store_url, tmp_path, commit_at=10, block_at=50)
    produce(bootstrap, topic, [f"r{i}" for i in range(50, 100)], partition=0)
    probe = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": unique_group, "enable.auto.commit": False})
    try:
        lineage = new_lineage(probe.list_topics(topic, timeout=30).cluster_id, bytes(8))
        with open_store(store_url) as store:  # the dead incarnation's range, finished in the store only
            token = store.create_range(unique_group, topic, 0, 10, 60, "dead-incarnation", lineage)
            update = ProgressUpdate(token.id, "dead-incarnation", token.epoch, RangeProgress(10, 60, 60))
            assert not store.commit_one(update).is_open
        marker = mark(encode_mirror([RangeProgress(10, 60, 10)], limit=MARKED_MIRROR_LIMIT), lineage, 10)
        probe.commit(offsets=[TopicPartition(topic, 0, 10, metadata=marker)], asynchronous=False)
    finally:
        probe.close()

    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        poll_until(
            consumer,
            got,
            lambda: {m.offset() for m in got} >= set(range(60, 100)),
            30,
            "the records after the done range",
        )
        assert not {m.offset() for m in got} & set(range(10, 60)), "the done range is not read again"
    finally:
        consumer.close()
    with open_store(store_url) as store:
        spans = sorted((t.span.start, t.span.end) for t in store.ranges(unique_group))
    assert spans == [(10, 60), (60, 100)]


def test_drain_keeps_members_running_until_ranges_whose_records_are_all_finished_are_closed(
    chaos_driver: DriverFactory,
) -> None:
    """CI failure (seed 402565968): "6 ranges still open at the end", 0 lost.

    An incarnation killed after processing a range's last record but before committing it leaves
    the range open with every record of it in the ledger.  The drain took "every record finished"
    as done and stopped the members within a second, before they had recovered and re-read the
    range, five times over.  The members must run until the store has no open range.
    """
    driver = chaos_driver(**SCRIPTED, rate=150.0)
    crash_with_lag(driver, finished=150, lag=300)  # about 100 records per partition
    driver.stop_producer()
    lag = _backfill_lag(driver)
    assert lag > 0

    # the second incarnation finishes every backfilled record and dies before committing the last one
    second = driver.spawn(
        0, faults=False, extra=["--commit", "message", "--stall-at", "backfill", "--stall-after", str(lag)]
    )
    wait_for(lambda: second.has("stalled"), 60, 0.05, "the second incarnation to stall at its last record")
    driver.kill(0)
    with open_store(driver.config.store_url) as store:
        assert store.open_ranges(driver.group), "the kill must leave a range open"

    result = driver.finish()
    table = verdict_ok(result)
    assert result.verdict.ok, table
    assert result.verdict.ranges_open == 0, table
    assert result.drain_passes == 1, table


def _backfill_lag(driver: ChaosDriver) -> int:
    """Records the next recovery backfills: the lag of each partition that gets a range (lag >= min)."""
    c = driver.config
    probe = PlainConsumer({"bootstrap.servers": c.bootstrap, "group.id": driver.group})
    try:
        total = 0
        for topic in driver.topics:
            tps = [TopicPartition(topic, p) for p in range(c.partitions)]
            for tp in probe.committed(tps, timeout=30):
                _low, high = probe.get_watermark_offsets(tp, timeout=30)
                lag = high - tp.offset if tp.offset >= 0 else 0
                total += lag if lag >= c.min_offsets else 0
        return total
    finally:
        probe.close()
