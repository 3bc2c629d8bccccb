"""enable.auto.offset.store=false with the mode on: no record is kept by the consumer, explicit stores commit.

Without the auto offset store, poll()/consume() used to append every returned
record to a list that nothing reads in that mode (a leak of every message).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import Message

from fastrecover import Consumer
from fastrecover.store import open_store
from fastrecover_tools.testing.broker import produce
from tests.integration.helpers import consume_until, group_offsets, lag_after_crash, parallel_config


def test_manual_store_keeps_no_records_and_commits_what_was_stored(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=1)
    lag_after_crash(
        bootstrap, topic, unique_group, store_url, tmp_path, produced=50, commit_at=20, block_at=50, log_end=2000
    )
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url, **{"enable.auto.offset.store": False}))
    store = open_store(store_url)
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        consume_until(consumer, got, lambda: len(got) >= 1, 60, "the first record after the restart")
        produce(bootstrap, topic, [f"live{i}" for i in range(50)], partition=0)  # for the primary: 2000..2049
        consume_until(
            consumer,
            got,
            lambda: {m.offset() for m in got} >= set(range(20, 2050)),
            60,
            "the backfill and the live records",
        )
        for _ in range(5):
            consumer.consume(500, 0.05)
        # nothing reads them without the auto offset store, so nothing beyond one call is kept
        assert consumer._fr is not None
        assert len(consumer._fr.offsets.unsettled) <= 500
        assert len(consumer._fr.child_runs) <= 500
        for msg in got:
            consumer.store_offsets(message=msg)
        consumer.commit(asynchronous=False)
        assert group_offsets(bootstrap, unique_group, topic)[0].offset == 2050
        assert store.open_ranges(unique_group) == []
    finally:
        store.close()
        consumer.close()
