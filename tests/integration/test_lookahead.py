"""The first recovery's reads, asked on the child's handle while the join runs (fastrecover/lookahead.py).

``subscribe()`` returns once the lookahead has read the subscribed topics' log ends; the assignment
comes at the first ``consume()``.  Records produced in between make the lookahead's log ends older
than the partition's, which is what its rules are about: a replay may rest on them (it starts at the
committed offset and reads on), a jump never does.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import Message, TopicPartition

from fastrecover import Consumer
from fastrecover import lookahead as lookahead_module
from fastrecover_tools.testing.broker import produce
from tests.integration.helpers import consume_until, offset_of, parallel_config

pytestmark = pytest.mark.integration

COMMITTED = 100
EARLY_END = 300
LATE_END = 800
#: the debug line of a recovery that replays on the lookahead's log ends (fastrecover/recoverer.py)
EARLY = "replays on the log ends read during the join"


@pytest.fixture(autouse=True)
def _ample_age(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new group's first join may take longer than a restart's: the age rule is a unit test's."""
    monkeypatch.setattr(lookahead_module, "MAX_AGE_S", 60.0)


def _committed_at(bootstrap: str, topic: str, group: str, offset: int) -> None:
    plain = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        plain.close()


def _subscribed(bootstrap: str, topic: str, group: str, store_url: str, replay_limit: int) -> Consumer:
    """Records [0, EARLY_END) and the group at COMMITTED; a consumer whose lookahead read EARLY_END."""
    produce(bootstrap, topic, [f"r{i}" for i in range(EARLY_END)], partition=0)
    _committed_at(bootstrap, topic, group, COMMITTED)
    consumer = Consumer(
        parallel_config(bootstrap, group, store_url, **{"fastrecover.recovery.replay.max.offsets": replay_limit})
    )
    consumer.subscribe([topic])
    return consumer


def _first_recovery(consumer: Consumer, got: list[Message]) -> Any:
    consume_until(consumer, got, lambda: bool(consumer.recoveries), 30, "the first recovery")
    return consumer.recoveries[0]  # (a jump's store part, once the store opened, reports again)


def test_a_replay_rests_on_the_log_ends_read_during_the_join_and_reads_on_past_them(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = topic_factory(partitions=1)
    caplog.set_level(logging.DEBUG, logger="fastrecover.recovery")
    consumer = _subscribed(bootstrap, topic, unique_group, store_url, replay_limit=10_000)
    got: list[Message] = []
    try:
        produce(bootstrap, topic, [f"r{i}" for i in range(EARLY_END, LATE_END)], partition=0)
        report = _first_recovery(consumer, got)
        assert report.primary_start is None and report.new_ranges == ()
        assert EARLY in caplog.text
        wanted = set(range(COMMITTED, LATE_END))
        consume_until(consumer, got, lambda: {offset_of(m) for m in got} >= wanted, 30, "every record")
        assert min(offset_of(m) for m in got) == COMMITTED
    finally:
        consumer.close()


def test_a_jump_reads_the_log_end_afresh(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = topic_factory(partitions=1)
    caplog.set_level(logging.DEBUG, logger="fastrecover.recovery")
    consumer = _subscribed(bootstrap, topic, unique_group, store_url, replay_limit=100)
    got: list[Message] = []
    try:
        produce(bootstrap, topic, [f"r{i}" for i in range(EARLY_END, LATE_END)], partition=0)
        report = _first_recovery(consumer, got)
        assert report.primary_start == LATE_END, "the jump started at the lookahead's log end"
        assert [(r.start, r.end) for r in report.new_ranges] == [(COMMITTED, LATE_END)]
        assert EARLY not in caplog.text
    finally:
        consumer.close()
