"""The recovery decision: what to do with a partition the primary was just given.

Pure: it sees the group's committed offset, the partition's watermarks, the
ranges the store knows and the ranges mirrored into the commit metadata, and
returns a plan.  The consumer carries the plan out in a fixed order that keeps
at-least-once: first persist every new or restored range, and only when that
succeeded start the primary at the log end (``fallback_start`` otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
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
    """
    open_tokens = tuple(t for t in store_tokens if t.is_open)
    known_spans = [t.span for t in store_tokens]
    restored = tuple(_restore(mirrored, known_spans))
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


def _restore(mirrored: Sequence[RangeProgress], known: Sequence[OffsetRange]) -> list[RangeProgress]:
    """Mirrored ranges the store has no record of (it was wiped or replaced).

    Any part of a mirrored range the store knows is dropped; the unknown parts
    keep the mirror's progress, clipped to the part.
    """
    restored: list[RangeProgress] = []
    for entry in mirrored:
        if entry.done:
            continue
        for piece in subtract(entry.span, known):
            # commit_upto/mark_done clip to the piece and advance over a completed offset
            # that lands on the clipped committed offset (piece.start of a later piece).
            progress = (
                RangeProgress.fresh(piece.start, piece.end).commit_upto(entry.committed).mark_done(entry.completed)
            )
            if not progress.done:
                restored.append(progress)
    return restored
