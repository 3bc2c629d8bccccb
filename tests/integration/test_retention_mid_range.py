"""Retention removes records of a range the child is part-way through: it reads on from the new log start.

The child's handle is made with ``auto.offset.reset=error``: when its next fetch falls below the log
start, it learns so, moves the range's committed offset to the log start, counts what retention
removed on the token, and reads every record still in the log.  Overridden to reset to the log end,
the child left the range open for good and never delivered the records still in the log (why
``fastrecover.child.auto.offset.reset`` cannot be overridden: tests/unit/test_child_config.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Message, TopicPartition
from confluent_kafka.admin import AdminClient

from fastrecover import Consumer
from fastrecover.store import open_store
from fastrecover_tools.testing.broker import produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.dropin import commit_offsets
from tests.integration.helpers import drain_and_commit, offset_of, parallel_config

pytestmark = pytest.mark.integration

COMMITTED = 100
LOG_END = 400
#: records of the range the application has before retention runs
READ_FIRST = 40
#: the log start retention leaves (delete_records), inside what the range still owes
CUT = 300
LIVE = 10


def test_records_deleted_under_the_childs_cursor_are_counted_and_the_rest_of_the_range_is_read(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(LOG_END)], partition=0)
    commit_offsets(bootstrap, unique_group, [TopicPartition(topic, 0, COMMITTED)])

    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url, **{"fastrecover.backfill.batch.size": 10}))
    got: list[Message] = []
    partition = [TopicPartition(topic, 0)]
    try:
        consumer.assign(partition)  # recovery: range [COMMITTED, LOG_END), the primary at LOG_END
        (report,) = consumer.recoveries
        assert [(r.start, r.end) for r in report.new_ranges] == [(COMMITTED, LOG_END)], report

        def read_some() -> bool:
            got.extend(m for m in consumer.consume(5, 0.2) if m.error() is None)  # a few at a time
            return sum(1 for m in got if offset_of(m) < LOG_END) >= READ_FIRST

        wait_for(read_some, 60, 0.001, f"{READ_FIRST} records of the range")
        consumer.pause(partition)  # what the child fetched and did not hand out is given back: its cursor stays
        cursor = max(offset_of(m) for m in got if offset_of(m) < LOG_END) + 1
        assert cursor < CUT, "retention must take records the range still owes"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.delete_records([TopicPartition(topic, 0, CUT)]).values():
            future.result(timeout=30)
        consumer.resume(partition)
        live = produce(bootstrap, topic, [f"live{i}" for i in range(LIVE)], partition=0)
        wanted = set(range(CUT, LOG_END)) | {d.offset for d in live}
        drain_and_commit(consumer, got, partition[0], wanted)
    finally:
        consumer.close()
    delivered = {offset_of(m) for m in got}
    assert not delivered & set(range(cursor, CUT)), "records retention removed cannot have been delivered"
    store = open_store(store_url)
    try:
        (token,) = [t for t in store.ranges(unique_group) if t.topic == topic]
        assert not token.is_open, "the range finished"
        assert token.skipped == CUT - cursor, "what retention removed under the cursor is counted on the token"
    finally:
        store.close()
