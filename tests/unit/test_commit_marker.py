"""What the primary's commits carry while its partition holds ranges (ModeParts, no broker).

Two rules keep a commit from erasing or misusing the marker, the record of which ranges Kafka's
committed offset vouches for:

* while a range is parked (the store does not have it yet), the mirror is its only durable record,
  so the application's own metadata does not replace it;
* progress below the ranges a partition holds (the primary went back: a seek, or auto.offset.reset
  after the log was truncated or the topic re-created) renews the partition's lineage once, so the
  old ranges' facts are not vouched for by an offset that now counts other records.
"""

from __future__ import annotations

import logging

import pytest

from fastrecover.book import RangeBook, mirror_context
from fastrecover.codec import lineage_cluster, new_lineage, read_marker
from fastrecover.config import split_config
from fastrecover.mode_state import ModeParts
from fastrecover.partitions import Partitions
from fastrecover.ranges import RangeProgress
from fastrecover.tokens import Token, TopicPartitionKey

KEY = TopicPartitionKey("t", 0)
LINEAGE = new_lineage("cluster-a", b"12345678")


def _parts(book: RangeBook) -> ModeParts:
    """The commit-shaping part of a mode: its book, partitions and settings, nothing that talks to Kafka."""
    parts = object.__new__(ModeParts)
    parts.book = book
    parts.partitions = Partitions(book)
    parts.partitions.assign([KEY])
    _, parts.settings = split_config({"group.id": "g", "enable.parallel.rebalance": True})
    parts._metadata_deferred = set()
    parts._lineage_renewed = {}
    book.set_lineage(KEY, LINEAGE)
    return parts


def _claimed(book: RangeBook, start: int, end: int) -> None:
    book.add(Token(1, "g", KEY.topic, KEY.partition, RangeProgress(start, end, start), owner="me", epoch=1))


def test_the_applications_metadata_goes_to_kafka_when_the_store_has_the_ranges() -> None:
    book = RangeBook("g")
    _claimed(book, 100, 400)
    tp = _parts(book).with_mirror(KEY, 500, "app-x")
    assert tp.metadata == "app-x"


def test_a_parked_range_keeps_the_marker_and_the_applications_metadata_waits_in_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    book = RangeBook("g")
    book.park(KEY, "g", RangeProgress(100, 400, 100))
    parts = _parts(book)
    with caplog.at_level(logging.WARNING, logger="fastrecover.consumer"):
        first = parts.with_mirror(KEY, 500, "app-x")
        second = parts.with_mirror(KEY, 510, "app-y")
    for tp, offset in ((first, 500), (second, 510)):
        marker = read_marker(tp.metadata, context=mirror_context("g", KEY))
        assert marker is not None and marker.offset == offset and marker.lineage == LINEAGE
        assert [(r.start, r.end) for r in marker.ranges] == [(100, 400)], "the parked range is mirrored"
    assert parts.partitions.meta(KEY) == "app-y", "committed() returns the application's latest metadata"
    assert sum("kept in memory" in r.getMessage() for r in caplog.records) == 1, "warned once per partition"


@pytest.mark.parametrize("offset", [0, 150, 399])
def test_progress_below_a_held_range_renews_the_lineage_once(offset: int, caplog: pytest.LogCaptureFixture) -> None:
    book = RangeBook("g")
    _claimed(book, 100, 400)
    parts = _parts(book)
    with caplog.at_level(logging.WARNING, logger="fastrecover.consumer"):
        tp = parts.progress_mirror(KEY, offset, None)
        renewed = book.lineage(KEY)
        assert renewed is not None and renewed != LINEAGE and lineage_cluster(renewed) == "cluster-a"
        marker = read_marker(tp.metadata, context=mirror_context("g", KEY))
        assert marker is not None and marker.lineage == renewed, "the commit names the new lineage"
        parts.progress_mirror(KEY, offset + 1, None)
    assert book.lineage(KEY) == renewed, "renewed once, not at every commit"
    assert sum("is below the ranges" in r.getMessage() for r in caplog.records) == 1


def test_progress_at_or_above_the_ranges_and_marker_commits_keep_the_lineage() -> None:
    book = RangeBook("g")
    _claimed(book, 100, 400)
    parts = _parts(book)
    parts.progress_mirror(KEY, 400, None)
    parts.progress_mirror(KEY, 900, None)
    parts.with_mirror(KEY, 100, None)  # the recovery's marker at C, the hand-back's at the lowest offset
    assert book.lineage(KEY) == LINEAGE


def test_a_recovery_that_sets_a_lineage_again_lets_a_later_rewind_renew_it() -> None:
    book = RangeBook("g")
    _claimed(book, 100, 400)
    parts = _parts(book)
    parts.progress_mirror(KEY, 10, None)
    again = new_lineage("cluster-a", b"abcdefgh")
    book.set_lineage(KEY, again)  # the partition recovered anew
    parts.progress_mirror(KEY, 20, None)
    assert book.lineage(KEY) not in (LINEAGE, again)
