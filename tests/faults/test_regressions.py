"""Regressions found by the fault campaign, each reduced to the smallest reproduction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message

from fastrecover import Consumer
from fastrecover.ranges import RangeProgress
from fastrecover.store import ProgressUpdate, open_store
from fastrecover_tools.testing.broker import produce
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
    """
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(50)], partition=0)
    crash_after_commit(bootstrap, topic, unique_group, store_url, tmp_path, commit_at=10, block_at=50)
    produce(bootstrap, topic, [f"r{i}" for i in range(50, 100)], partition=0)
    with open_store(store_url) as store:  # the dead incarnation's range, finished in the store only
        token = store.create_range(unique_group, topic, 0, 10, 60, "dead-incarnation")
        done = store.commit_one(ProgressUpdate(token.id, "dead-incarnation", token.epoch, RangeProgress(10, 60, 60)))
        assert not done.is_open

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
