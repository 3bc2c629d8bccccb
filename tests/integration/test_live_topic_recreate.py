"""A topic deleted and re-created under its name while a mode-on member stays up.

docs/design.md, "Which ranges recovery believes".  The member's primary is sent back to the new
topic's start by ``auto.offset.reset``; its commits there must not carry a marker that vouches for
the old topic's ranges, or the next recovery believes their *done* facts and skips the new records
they cover.  A plain consumer resumes at the committed offset and reads them all; so must the next
fastrecover member.  Found by an audit (a member that crashed after the re-create lost records).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import pytest
from confluent_kafka import KafkaException, Message, TopicPartition

from fastrecover import Consumer
from fastrecover.store import open_store
from fastrecover.tokens import Token, TokenState
from fastrecover_tools.testing.broker import create_topic, delete_topic, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.dropin import commit_offsets
from tests.integration.helpers import (
    close_as_crashed,
    consume_until,
    group_offsets,
    mode_of,
    offset_of,
    parallel_config,
    poll_until,
)

pytestmark = pytest.mark.integration

OWED_FROM = 100  # the group's offset when member A recovers
OLD_FIRST = 1000  # A splits off [OWED_FROM, OLD_FIRST) and crashes before reading any of it
OLD_END = 2000  # B resumes A's range and splits off [OLD_FIRST, OLD_END)
NEW_END = 1500  # the re-created topic's log end: below the old one, so the primary's offset is out of range
NEW_COMMIT = 300  # where B's explicit commits put the group on the new topic: inside the old done range
WARNING = "is below the ranges this member holds"


def _ranges(store_url: str, group: str) -> list[Token]:
    with open_store(store_url) as store:
        return list(store.ranges(group))


def _recreate(bootstrap: str, topic: str) -> None:
    """The operator's delete and create under the same name, then the new topic's records."""
    delete_topic(bootstrap, topic)

    def created() -> bool:
        create_topic(bootstrap, topic, 1, exist_ok=True)  # the broker may still be finishing the delete
        return True

    wait_for(created, 60, 0.2, f"topic {topic} to be created again", ignore=(KafkaException,))
    produce(bootstrap, topic, [f"new{i}" for i in range(NEW_END)], partition=0)


def _a_crashed_member_owes_a_range(bootstrap: str, topic: str, group: str, store_url: str) -> None:
    """Member A splits [OWED_FROM, OLD_FIRST) off and crashes before reading any of it."""
    produce(bootstrap, topic, [f"old{i}" for i in range(OLD_FIRST)], partition=0)
    commit_offsets(bootstrap, group, [TopicPartition(topic, 0, OWED_FROM)])
    a = Consumer(parallel_config(bootstrap, group, store_url))
    try:
        a.assign([TopicPartition(topic, 0)])
        assert [(r.start, r.end) for r in a.recoveries[0].new_ranges] == [(OWED_FROM, OLD_FIRST)]
    finally:
        close_as_crashed(a)
    produce(bootstrap, topic, [f"old{i}" for i in range(OLD_FIRST, OLD_END)], partition=0)


def _finish_resumed_range(b: Consumer, topic: str, store_url: str) -> int:
    """B resumes A's range (its lineage vouched for), splits the new lag off, and reads and commits
    the resumed range to done: a done range of the old topic, the one a stale marker would hide behind."""
    b.assign([TopicPartition(topic, 0)])
    (report,) = b.recoveries
    assert [(r.start, r.end) for r in report.new_ranges] == [(OLD_FIRST, OLD_END)], report
    assert len(report.resumed) == 1, report
    with open_store(store_url) as store:

        def done() -> bool:
            b.consume(500, 0.05)
            b.commit(asynchronous=False)
            return store.get(report.resumed[0]).state is TokenState.DONE

        wait_for(done, 60, 0.01, "B's child to finish the range it resumed")
    return report.resumed[0]


def _commit_on_new_topic(b: Consumer, topic: str, how: str) -> None:
    """B goes on after the re-create: its primary, reset to the new topic's start, returns records
    up to NEW_COMMIT, and the application commits its position the way ``how`` says."""
    got: list[Message] = []
    last = f"new{NEW_COMMIT - 1}".encode()
    poll_until(b, got, lambda: bool(got) and got[-1].value() == last, 90, "B's primary to read the new topic")
    if how == "message":
        b.commit(message=got[-1], asynchronous=False)
    elif how == "offsets":
        b.commit(offsets=[TopicPartition(topic, 0, NEW_COMMIT)], asynchronous=False)
    else:  # the offset-less commit of what was returned (auto offset store)
        b.commit(asynchronous=False)


@pytest.mark.parametrize("how", ["message", "offsets", "offsetless"])
def test_a_topic_recreated_under_a_live_member_is_read_again_from_its_committed_offset(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """After B commits on the re-created topic and crashes, C delivers every new record from there.

    B's commits on the new topic sit below a done range of the old one: they must take a new
    lineage, so C retires the old ranges instead of skipping the new records they cover.
    """
    caplog.set_level(logging.WARNING, logger="fastrecover.consumer")
    topic = topic_factory(partitions=1)
    _a_crashed_member_owes_a_range(bootstrap, topic, unique_group, store_url)

    b = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        finished = _finish_resumed_range(b, topic, store_url)
        held = [t for t in _ranges(store_url, unique_group) if t.owner == mode_of(b).owner]
        _recreate(bootstrap, topic)
        _commit_on_new_topic(b, topic, how)
        (after_b,) = group_offsets(bootstrap, unique_group, topic)
    finally:
        close_as_crashed(b)
    committed = after_b.offset
    # what makes the test mean something: B held an old range above the offset it committed
    assert 0 <= committed < NEW_END, f"B committed {committed} on the new topic (log end {NEW_END})"
    above = [t for t in held if t.state in (TokenState.DONE, TokenState.OPEN) and t.span.end > committed]
    assert finished in {t.id for t in held if t.state is TokenState.DONE}, held
    assert above, f"B held no range of the old topic above its commit at {committed}: {held}"

    c = Consumer(parallel_config(bootstrap, unique_group, store_url))
    got: list[Message] = []
    try:
        c.assign([TopicPartition(topic, 0)])
        (report,) = c.recoveries
        assert (report.committed, report.log_end) == (committed, NEW_END), report
        wanted = set(range(committed, report.log_end))
        with contextlib.suppress(TimeoutError):  # the assertion below names what is missing
            consume_until(c, got, lambda: {offset_of(m) for m in got} >= wanted, 60, "C to read the new topic")
    finally:
        c.close()
    delivered = {offset_of(m): m.value() for m in got}
    missing = sorted(wanted - delivered.keys())
    assert not missing, (
        f"C delivered {len(wanted) - len(missing)} of {len(wanted)} records of [{committed}, {NEW_END}); "
        f"missing {len(missing)} ({missing[0]}..{missing[-1]}); recovery {report}"
    )
    assert delivered == {o: f"new{o}".encode() for o in wanted}, "exactly the new topic's records from the offset"
    assert {t.id for t in above} <= set(report.retired), f"C retired {report.retired}, not all of {above}"
    assert any(WARNING in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING), caplog.text
