"""The records the child fetched and has not handed out yet: one segment per range, in fetch order.

A fetched record counts as delivered only once it is handed out, and a range's delivery cursor
(``RangeWork.next_offset``) moves with it.  What is still buffered when a partition is paused,
sought or revoked is purged, and the child points its handle back at the cursor: nothing buffered
is ever counted as read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from typing import TYPE_CHECKING

from fastrecover.batches import Run, Segment, batch_offsets, cut_batch

if TYPE_CHECKING:
    from confluent_kafka import Message

    from fastrecover.book import RangeWork
    from fastrecover.tokens import TopicPartitionKey


class FetchBuffer:
    """Segments of fetched records, each of one range, in the order they were fetched."""

    def __init__(self) -> None:
        self._segments: deque[Segment] = deque()

    def __bool__(self) -> bool:
        return bool(self._segments)

    def count(self) -> int:
        """Records buffered, not handed out yet."""
        return sum(len(s.msgs) - s.pos for s in self._segments)

    def accept(self, head: RangeWork, msgs: list[Message]) -> list[tuple[int, int]]:
        """Buffer the records of ``msgs`` (one partition's, in offset order) that belong to the range
        ``head``, which the partition reads now; the offsets in it that hold no record (its gaps)."""
        offsets = batch_offsets(msgs)
        cut = cut_batch(offsets, head.fetch_next, head.end)
        head.fetch_next, head.fetched_all = cut.fetch_next, cut.fetched_all
        if cut.lo < cut.hi:
            kept, kept_offsets = msgs[cut.lo : cut.hi], offsets[cut.lo : cut.hi]
            if head.skip:  # delivered already, out of order (an application seek inside the range)
                pairs = [(m, o) for m, o in zip(kept, kept_offsets, strict=True) if o not in head.skip]
                kept, kept_offsets = [m for m, _ in pairs], [o for _, o in pairs]
            if kept:
                self._segments.append(Segment(head, kept, kept_offsets))
        return cut.gaps

    def hand_out(self, limit: int, out: list[Message], runs: list[Run]) -> None:
        """Records of the first segment into ``out`` until it holds ``limit``, with the run they form;
        their range's delivery cursor moves past them."""
        seg = self._segments[0]
        stop = min(len(seg.msgs), seg.pos + limit - len(out))
        out.extend(seg.msgs[seg.pos : stop])
        work = seg.work
        first, last = seg.offsets[seg.pos], seg.offsets[stop - 1]
        runs.append(Run(work.token_id, work.key, first, last))
        work.next_offset = last + 1
        seg.pos = stop
        if stop == len(seg.msgs):
            self._segments.popleft()

    def purge(self, keys: Collection[TopicPartitionKey]) -> list[RangeWork]:
        """Give back what is buffered of ``keys``; the ranges it was of, each once."""
        purged = [s for s in self._segments if s.work.key in keys]
        if purged:
            self._segments = deque(s for s in self._segments if s.work.key not in keys)
        return list({id(s.work): s.work for s in purged}.values())

    def clear(self) -> None:
        self._segments.clear()
