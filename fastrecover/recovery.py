"""The recovery decision: what to do with a partition the primary was just given.

Pure: it sees the group's committed offset, the partition's watermarks, the
ranges the store knows and the ranges mirrored into the commit metadata, and
returns a plan.  The consumer carries the plan out in a fixed order that keeps
at-least-once: first persist every new or restored range, and only when that
succeeded start the primary at the log end (``fallback_start`` otherwise).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from fastrecover.ranges import OffsetRange, RangeProgress, subtract
from fastrecover.tokens import Token


@dataclass(frozen=True)
class PartitionPlan:
    """What recovery does for one partition.

    ``primary_start`` None means "leave the primary where Kafka puts it" (the
    committed offset, or auto.offset.reset when there is none).
    """

    primary_start: int | None
    new_ranges: tuple[OffsetRange, ...] = ()
    restored: tuple[RangeProgress, ...] = ()
    backfill: tuple[Token, ...] = field(default_factory=tuple)
    fallback_start: int | None = None

    @property
    def lag(self) -> int:
        return sum(len(r) for r in self.new_ranges)


def plan_partition(
    *,
    committed: int | None,
    log_end: int,
    min_offsets: int,
    store_tokens: Sequence[Token] = (),
    mirrored: Sequence[RangeProgress] = (),
) -> PartitionPlan:
    """Decide how the primary starts on a partition and which ranges to backfill.

    ``store_tokens`` are every token the store has for the partition, open and
    done: a done token tells us a mirrored range needs no restoring.
    ``mirrored`` comes from the commit metadata and is untrusted: see
    :func:`_restore` for why it can add re-reads but never remove any.

    Invariant (property-tested): every offset in ``[committed, log_end)`` is read
    by the primary (at or above ``primary_start``), lies in a new, restored or
    resumed (open store) range, or lies in a done store range.
    """
    open_tokens = tuple(t for t in store_tokens if t.is_open)
    known_spans = [t.span for t in store_tokens]
    restored = tuple(_restore(mirrored, known_spans, max(log_end, 0)))
    # done ranges count as covered too: their records are finished (by the child or a Spark job)
    covered = known_spans + [r.span for r in restored]

    if committed is None or committed < 0 or log_end - committed < min_offsets:
        return PartitionPlan(primary_start=None, restored=restored, backfill=open_tokens)

    new_ranges = tuple(subtract(OffsetRange(committed, log_end), covered))
    return PartitionPlan(
        primary_start=log_end,
        new_ranges=new_ranges,
        restored=restored,
        backfill=open_tokens,
        fallback_start=committed,
    )


def _restore(mirrored: Sequence[RangeProgress], known: Sequence[OffsetRange], log_end: int) -> list[RangeProgress]:
    """Mirrored ranges the store has no record of (it was wiped or replaced), started fresh.

    The mirror is untrusted (anyone who may commit for the group writes it), so
    only its *spans* are used, and only as a hint of what to re-read:

    * each span is clipped to the log end (a range past it would swallow the
      primary's commits and could never finish);
    * overlapping or duplicate spans are merged into one;
    * any part the store knows (open or done) is dropped: the store is the
      authority there;
    * every restored piece starts fresh at its start.  The mirror's committed
      offset and completion map are ignored, so a forged "almost done" row
      costs duplicates, never a skipped record.

    A row that claims to be done restores nothing: ignoring it is what a consumer
    without a mirror would do.
    """
    spans = _union(
        OffsetRange(entry.start, min(entry.end, log_end))
        for entry in mirrored
        if not entry.done and entry.start < min(entry.end, log_end)
    )
    restored: list[RangeProgress] = []
    for span in spans:
        for piece in subtract(span, known):
            restored.append(RangeProgress.fresh(piece.start, piece.end))
    return restored


def _union(spans: Iterable[OffsetRange]) -> list[OffsetRange]:
    """Sorted, disjoint spans covering exactly the offsets of ``spans``."""
    out: list[OffsetRange] = []
    for span in sorted(spans, key=lambda r: r.start):
        if out and span.start <= out[-1].end:
            if span.end > out[-1].end:
                out[-1] = OffsetRange(out[-1].start, span.end)
        else:
            out.append(span)
    return out
