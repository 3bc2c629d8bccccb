"""Cutting a fetched batch at a range's end: pure, so every case is tested without a broker.

Records of one partition arrive in offset order, so where a range's records
start and stop in a batch is found with two bisects, and offsets the batch skips
(compaction, transaction markers) are reported as gaps: offsets that hold no
record, and so count as done.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable, Sequence
from itertools import compress, count, islice, pairwise
from operator import ne
from typing import TYPE_CHECKING, cast

from confluent_kafka import Message

from fastrecover.tokens import TopicPartitionKey
from fastrecover.values import field, record, value

if TYPE_CHECKING:
    from fastrecover.book import RangeWork


def batch_offsets(msgs: list[Message]) -> Sequence[int]:
    """The ascending offsets of one partition's records, without a call per record when it can.

    Records of a partition arrive in offset order, so when the last offset is the
    first plus the count, the offsets are exactly that ``range``: no per-record
    ``Message.offset`` call and no list.  Otherwise (compaction, transaction markers
    leave holes) the list of them.
    """
    first, last = msgs[0].offset(), msgs[-1].offset()
    if first is not None and last is not None and last - first + 1 == len(msgs):
        return range(first, last + 1)
    return cast(list[int], list(map(Message.offset, msgs)))  # records, never events: always set


def runs(keys: Sequence[Hashable]) -> list[tuple[int, int]]:
    """``[lo, hi)`` index spans of ``keys`` holding one key each, in order.

    A fetch returns each partition's records in runs, so a batch is cut at every
    change of key: the neighbours are compared by C-level ``map``/``compress``,
    never a Python step per record, and the work per batch is per run.
    """
    if not keys:
        return []
    cuts = [0, *compress(count(1), map(ne, keys, islice(keys, 1, None))), len(keys)]
    return list(pairwise(cuts))


def partition_runs(msgs: list[Message]) -> list[tuple[TopicPartitionKey, int, int]]:
    """``(partition, lo, hi)`` for each run of one partition's records in ``msgs``, in order.

    ``msgs`` are records, never error events (their topic and partition are always set). The keys
    are taken from the records themselves: partition numbers alone when every message
    is of one topic (one C-level pass fewer), (topic, partition) pairs otherwise.
    """
    if not msgs:
        return []
    topics = cast(list[str], list(map(Message.topic, msgs)))
    partitions = cast(list[int], list(map(Message.partition, msgs)))
    size = len(msgs)
    if topics.count(topics[0]) == size:
        topic = topics[0]
        if partitions.count(partitions[0]) == size:
            # one partition: what a consume() from librdkafka's queue mostly returns, and
            # list.count compares in C without a call per record, where runs() makes two
            return [(TopicPartitionKey(topic, partitions[0]), 0, size)]
        return [(TopicPartitionKey(topic, partitions[lo]), lo, hi) for lo, hi in runs(partitions)]
    pairs = list(zip(topics, partitions, strict=True))
    return [(TopicPartitionKey(*pairs[lo]), lo, hi) for lo, hi in runs(pairs)]


@value
class SkipEvent:
    """Retention removed ``[next offset, low)`` of a range before it was read."""

    token_id: int
    low: int


@value
class GapEvent:
    """Offsets in ``[start, end)`` of a range hold no record (compaction, transaction markers)."""

    token_id: int
    start: int
    end: int


ChildEvent = SkipEvent | GapEvent


@value
class Run:
    """Records of one range just handed out: ``[first, last]`` of its delivery order."""

    token_id: int
    key: TopicPartitionKey
    first: int
    last: int


@value
class Cut:
    """Where a range's records lie in a batch: ``offsets[lo:hi]``, and what follows for the range."""

    lo: int
    hi: int
    fetch_next: int
    fetched_all: bool
    gaps: list[tuple[int, int]] = field(default_factory=list)


def cut_batch(offsets: Sequence[int], fetch_next: int, end: int) -> Cut:
    """Cut the ascending ``offsets`` of one partition for a range read up to ``fetch_next``, ending at ``end``.

    Offsets below ``fetch_next`` were delivered already (``lo`` skips them); an offset at or past
    ``end`` means the fetcher went past the range (``fetched_all``), and whatever the range never
    saw up to its end is a gap.
    """
    lo = bisect_left(offsets, fetch_next)
    hi = bisect_left(offsets, end, lo)
    fetched_all = hi < len(offsets)
    gaps: list[tuple[int, int]] = []
    if lo < hi:
        first, last = offsets[lo], offsets[hi - 1]
        if first > fetch_next:
            gaps.append((fetch_next, first))
        if last - first + 1 != hi - lo:  # holes inside the run: rare, so a loop is fine here
            expected = first
            for offset in offsets[lo:hi]:
                if offset > expected:
                    gaps.append((expected, offset))
                expected = offset + 1
        fetch_next = last + 1
    if fetched_all and fetch_next < end:
        gaps.append((fetch_next, end))
        fetch_next = end
    return Cut(lo, hi, fetch_next, fetched_all, gaps)


@record
class Segment:
    """Buffered records of one range, in offset order; ``pos`` is the next one to hand out."""

    work: RangeWork
    msgs: list[Message]
    #: a ``range`` when the records are consecutive offsets (the common case), else the list of them
    offsets: Sequence[int]
    pos: int = 0
