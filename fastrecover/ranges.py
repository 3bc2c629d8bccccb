"""Offset-range arithmetic: the pure heart of fast recovery.

A *range* is a half-open interval of partition offsets ``[start, end)`` that the
primary consumer skipped over when it jumped to the log end, and that the child
consumer must backfill.  ``RangeProgress`` is what the child's commit log
remembers of one range: the *committed* offset (everything below it is done) and
the set of offsets above it that finished out of order.  Nothing here does I/O;
the consumer, the child thread and the store only carry these values around.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from fastrecover.values import value

K = TypeVar("K")


@value
class OffsetRange:
    """Half-open offset interval ``[start, end)``."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"invalid offset range [{self.start}, {self.end}): need 0 <= start <= end")

    def __len__(self) -> int:
        return self.end - self.start

    def __contains__(self, offset: object) -> bool:
        return isinstance(offset, int) and self.start <= offset < self.end

    def overlaps(self, other: OffsetRange) -> bool:
        """True when the two ranges share at least one offset (an empty range shares none)."""
        return max(self.start, other.start) < min(self.end, other.end)


def subtract(whole: OffsetRange, holes: Iterable[OffsetRange]) -> list[OffsetRange]:
    """The parts of ``whole`` not covered by any of ``holes``, in offset order.

    Recovery uses it so that a new range never overlaps a range that is already
    open (e.g. a second crash before the primary ever committed).
    """
    pieces: list[OffsetRange] = []
    cursor = whole.start
    for hole in sorted(holes, key=lambda r: r.start):
        if len(hole) == 0 or hole.end <= cursor or hole.start >= whole.end:
            continue
        if hole.start > cursor:
            pieces.append(OffsetRange(cursor, hole.start))
        cursor = max(cursor, hole.end)
        if cursor >= whole.end:
            break
    if cursor < whole.end:
        pieces.append(OffsetRange(cursor, whole.end))
    return [p for p in pieces if len(p) > 0]


@value
class RangeProgress:
    """How far the backfill of one range has got.

    Invariants: ``start <= committed <= end`` and every offset in ``completed``
    lies strictly between ``committed`` and ``end`` (an offset equal to
    ``committed`` would already have advanced it).  ``committed`` only moves over
    a contiguous prefix of finished offsets, so a crash can re-deliver but never
    skip a record.
    """

    start: int
    end: int
    committed: int
    completed: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"invalid range [{self.start}, {self.end}): need 0 <= start <= end")
        if not self.start <= self.committed <= self.end:
            raise ValueError(f"committed offset {self.committed} outside range [{self.start}, {self.end}]")
        for offset in self.completed:
            if not self.committed < offset < self.end:
                raise ValueError(
                    f"completed offset {offset} outside ({self.committed}, {self.end}) "
                    f"of range [{self.start}, {self.end})"
                )

    @classmethod
    def fresh(cls, start: int, end: int) -> RangeProgress:
        return cls(start, end, start)

    @property
    def span(self) -> OffsetRange:
        return OffsetRange(self.start, self.end)

    @property
    def done(self) -> bool:
        return self.committed >= self.end

    @property
    def remaining(self) -> int:
        """Records still to finish (the out-of-order completed ones excluded)."""
        return self.end - self.committed - len(self.completed)

    def is_finished(self, offset: int) -> bool:
        """True when ``offset`` needs no (re)delivery: below committed or completed."""
        return offset < self.committed or offset in self.completed

    def mark_done(self, offsets: Iterable[int]) -> RangeProgress:
        """Record finished offsets (any order); advance over the contiguous prefix.

        Offsets outside the range or already finished are ignored: a duplicate
        delivery finishing twice is normal under at-least-once.
        """
        if isinstance(offsets, list) and offsets and max(offsets) < self.committed:
            return self  # all finished already (e.g. the stored view ran ahead)
        if isinstance(offsets, list) and offsets and not self.completed:
            first, last = offsets[0], offsets[-1]
            # an in-order run (the common case) advances at once; first, last and the length alone
            # are not proof of one: [0, 0, 2] or [0, -3, 5, ...] have them too, and would finish
            # offsets nobody marked, so the run itself is compared (in C)
            if first == self.committed and last < self.end and offsets == [*range(first, last + 1)]:
                return RangeProgress(self.start, self.end, last + 1)
        fresh = {o for o in offsets if self.committed <= o < self.end and o not in self.completed}
        if not fresh:
            return self
        return self._advanced(self.committed, set(self.completed) | fresh)

    def commit_upto(self, next_offset: int) -> RangeProgress:
        """Kafka commit semantics: every record below ``next_offset`` is done.

        A commit below the current committed offset changes nothing: the range
        never moves backwards, so an old, re-ordered commit cannot lose records.
        """
        target = min(max(next_offset, self.committed), self.end)
        if target == self.committed:
            return self
        return self._advanced(target, {o for o in self.completed if o >= target})

    def skip_to(self, low: int) -> tuple[RangeProgress, int]:
        """Retention removed offsets below ``low``: give them up, return how many.

        The returned count is what could not be backfilled; callers must record it.
        """
        if low <= self.committed:
            return self, 0
        target = min(low, self.end)
        lost = sum(1 for o in range(self.committed, target) if o not in self.completed)
        return self._advanced(target, {o for o in self.completed if o >= target}), lost

    def _advanced(self, committed: int, pending: set[int]) -> RangeProgress:
        while committed in pending:
            pending.discard(committed)
            committed += 1
        return RangeProgress(self.start, self.end, committed, frozenset(pending))


def route_commit(next_offset: int, ranges: Sequence[tuple[K, OffsetRange]]) -> K | None:
    """Which range a committed *next offset* belongs to, or None for the primary.

    A Kafka commit of ``o`` says "records below ``o`` are done", so it belongs to
    the range holding record ``o - 1``: ``start < o <= end``.
    """
    for key, span in ranges:
        if span.start < next_offset <= span.end:
            return key
    return None


def route_record(offset: int, ranges: Sequence[tuple[K, OffsetRange]]) -> K | None:
    """Which range a record offset belongs to, or None when the primary owns it."""
    for key, span in ranges:
        if span.start <= offset < span.end:
            return key
    return None


def route_records(
    offsets: Sequence[int], ranges: Sequence[tuple[K, OffsetRange]]
) -> tuple[dict[K, list[int]], list[int]]:
    """Split record offsets of one partition between its ranges and the primary.

    The batch form of :func:`route_record`: one sort and two bisects per range
    instead of a scan of the ranges per record.  Returns, per range, its offsets
    in ascending order, and the offsets no range holds (the primary's).
    """
    ordered = sorted(offsets)
    by_range: dict[K, list[int]] = {}
    taken: list[tuple[int, int]] = []
    for key, span in ranges:
        lo = bisect_left(ordered, span.start)
        hi = bisect_left(ordered, span.end, lo)
        if lo < hi:
            by_range.setdefault(key, []).extend(ordered[lo:hi])
            taken.append((lo, hi))
    if not taken:
        return by_range, ordered
    primary: list[int] = []
    cursor = 0
    for lo, hi in sorted(taken):
        primary.extend(ordered[cursor:lo])
        cursor = max(cursor, hi)
    primary.extend(ordered[cursor:])
    return by_range, primary


def merged_committed(primary: int | None, open_ranges: Iterable[RangeProgress]) -> int | None:
    """The KIP's committed(): the lowest committed offset of the open ranges, if any.

    Everything below the returned offset is checkpointed in one log or the other.
    A primary commit that lies inside a range's span (typically its start: the
    offset the primary had committed when the range was split off) says nothing
    beyond the range, so the range's own committed offset answers.  A primary
    commit outside every open range's span (below the lowest range, or in a gap
    between ranges) marks where the primary's own checkpoint stops, so it counts.
    No primary commit at all means nothing below the ranges is checkpointed: None.
    """
    ranges = [r for r in open_ranges if not r.done]
    if not ranges or primary is None:
        return primary
    lows = [r.committed for r in ranges]
    if not any(r.start <= primary <= r.end for r in ranges):
        lows.append(primary)
    return min(lows)


def split_commit(
    offsets: Sequence[tuple[K, int]], ranges: Mapping[K, Sequence[tuple[int, OffsetRange]]]
) -> tuple[list[tuple[K, int]], dict[int, int]]:
    """Route commit offsets to the two commit logs.

    ``offsets`` are (partition key, next offset) pairs; ``ranges`` maps a
    partition key to its open (range id, span) pairs.  Returns the pairs the
    primary commits to Kafka and, per range id, the highest next offset
    committed into that range.
    """
    primary: list[tuple[K, int]] = []
    routed: dict[int, int] = {}
    for key, next_offset in offsets:
        range_id = route_commit(next_offset, ranges.get(key, ()))
        if range_id is None:
            primary.append((key, next_offset))
        else:
            routed[range_id] = max(next_offset, routed.get(range_id, next_offset))
    return primary, routed
