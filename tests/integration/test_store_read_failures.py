"""committed() on a store that opened and then cannot be read: Kafka's answer, and a log an operator can read.

committed() reads the store for partitions this member does not hold (another member's open ranges
lower the merged answer).  When that read fails, the answer is Kafka's alone, and the failure is said
once, then once a minute with a count, at every call the application makes in between at debug level.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from fastrecover import Consumer
from fastrecover.store import open_store
from fastrecover.store.models import TABLE_NAME
from tests.integration.helpers import mode_of, parallel_config

pytestmark = pytest.mark.integration

KAFKA_OFFSET = 500
RANGE_START = 120
CALLS = 20


def test_committed_on_an_unreadable_store_answers_from_kafka_and_warns_once(
    bootstrap: str, topic_factory: Any, unique_group: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ranges.db"
    store_url = f"sqlite:///{path}"
    topic = topic_factory(partitions=1)
    store = open_store(store_url)  # another member's open range of partition 0, below Kafka's offset
    try:
        store.create_ranges(unique_group, [(topic, 0, RANGE_START, KAFKA_OFFSET)], "another-member")
    finally:
        store.close()
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, KAFKA_OFFSET)], asynchronous=False)
        mode_of(consumer)
        tp = [TopicPartition(topic, 0)]
        (merged,) = consumer.committed(tp, timeout=30)
        assert merged.offset == RANGE_START, "the open range lowers the merged answer while the store answers"

        with sqlite3.connect(path) as admin:  # the store stays open; its ranges can no longer be read
            admin.execute(f"ALTER TABLE {TABLE_NAME} RENAME TO {TABLE_NAME}_away")
        caplog.set_level(logging.DEBUG, logger="fastrecover")
        caplog.clear()
        answers = [consumer.committed(tp, timeout=30)[0].offset for _ in range(CALLS)]
        assert answers == [KAFKA_OFFSET] * CALLS, "Kafka's offset alone while the store cannot be read"
        said = [(r.levelname, r.getMessage()) for r in caplog.records if "range store unreadable" in r.getMessage()]
        assert [level for level, _ in said] == ["WARNING"] + ["DEBUG"] * (CALLS - 1), said
        assert "answering from Kafka only" in said[0][1]

        with sqlite3.connect(path) as admin:
            admin.execute(f"ALTER TABLE {TABLE_NAME}_away RENAME TO {TABLE_NAME}")
        caplog.clear()
        (merged,) = consumer.committed(tp, timeout=30)
        assert merged.offset == RANGE_START, "the range counts again once the store answers"
        assert [r.levelname for r in caplog.records if "readable again after" in r.getMessage()] == ["INFO"]
    finally:
        consumer.close()
