"""Planning the streaming source's batches: pure functions of offsets and watermarks.

Where :mod:`fastrecover.spark.offsets` says what an offset *is* (the delivered
set per partition and the batch between two offsets), this module decides what
the next offset *should be*: where a new query starts, which partitions a
restart jumps to the log end (recovery), how far live reading advances under
``maxOffsetsPerTrigger``, how much of the pending backfill a batch takes, and
how a batch's pieces are cut into Spark tasks.  Everything is a function of
its arguments, so a decision can be replayed and property-tested; the data
source in :mod:`fastrecover.spark.source` only fetches watermarks and calls
these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from fastrecover.ranges import OffsetRange
from fastrecover.spark.offsets import LogBounds, PartitionState, Piece, SourceOffset
from fastrecover.tokens import TopicPartitionKey

__all__ = [
    "advance_live",
    "apply_jumps",
    "chunk_tasks",
    "discover",
    "fair_shares",
    "has_fresh",
    "initial_offset",
    "plan_next",
    "recovery_jumps",
    "take_backfill",
]


def initial_offset(
    bounds: Mapping[TopicPartitionKey, LogBounds],
    starting: str,
    specific: Mapping[TopicPartitionKey, int] | None = None,
) -> SourceOffset:
    """Where a new query starts: every partition at its log end ("latest"), log start ("earliest"), or,
    for ``starting == "json"``, at ``specific[key]`` (-2 earliest, -1 latest), clamped into the log.

    Under "json" every partition must be named, as with Spark's Kafka source.
    """
    if starting not in ("latest", "earliest", "json"):
        raise ValueError(f"startingOffsets must be 'latest', 'earliest' or 'json', got {starting!r}")
    parts = {}
    for key, b in bounds.items():
        if starting == "json":
            if specific is None or key not in specific:
                raise ValueError(f"startingOffsets names no offset for {key.topic}[{key.partition}]")
            want = specific[key]
            at = b.low if want == -2 else b.high if want == -1 else min(max(want, b.low), b.high)
        else:
            at = b.high if starting == "latest" else b.low
        parts[key] = PartitionState(at, at)
    return SourceOffset(parts)


def discover(offset: SourceOffset, bounds: Mapping[TopicPartitionKey, LogBounds]) -> SourceOffset:
    """Add partitions the offset has not seen yet, starting at their log start (as Spark's Kafka source).

    A new partition has an empty delivered set until the next batch delivers
    its records from ``base = log start``.
    """
    new = {k: PartitionState(b.low, b.low) for k, b in bounds.items() if offset.get(k) is None}
    return offset.with_partitions(new) if new else offset


def recovery_jumps(
    offset: SourceOffset, ends: Mapping[TopicPartitionKey, int], min_lag: int
) -> dict[TopicPartitionKey, int]:
    """Partitions whose live position lags the log end by at least ``min_lag``: key -> jump point."""
    jumps: dict[TopicPartitionKey, int] = {}
    for key in offset.keys_sorted():
        state = offset.partitions[key]
        end = ends.get(key)
        if end is not None and end - state.live >= max(1, min_lag):
            jumps[key] = end
    return jumps


def apply_jumps(offset: SourceOffset, jumps: Mapping[TopicPartitionKey, int]) -> SourceOffset:
    """Move ``[live, jump)`` into pending and continue live from the jump point (delivered set unchanged)."""
    updates: dict[TopicPartitionKey, PartitionState] = {}
    for key, point in jumps.items():
        state = offset.get(key)
        if state is None or point <= state.live:
            continue
        # Never merged with an adjacent older range: each pending range keeps its own end,
        # which is how the store mirror (state.mirror_plan) recognises it as it shrinks.
        updates[key] = PartitionState(state.base, point, (*state.pending, OffsetRange(state.live, point)))
    return offset.with_partitions(updates) if updates else offset


def advance_live(offset: SourceOffset, ends: Mapping[TopicPartitionKey, int], limit: int | None = None) -> SourceOffset:
    """Every partition's live position follows its log end (never moving backwards).

    With ``limit`` (maxOffsetsPerTrigger) at most that many live offsets in total,
    shared between partitions in proportion to what each has waiting (rounded
    down, at least one offset for a partition with records, remainder in key
    order), as Spark's Kafka source shares its limit.
    """
    waiting = {}
    for key in offset.keys_sorted():
        end = ends.get(key)
        if end is not None and end > offset.partitions[key].live:
            waiting[key] = end - offset.partitions[key].live
    if not waiting:
        return offset
    total = sum(waiting.values())
    if limit is None or total <= limit:
        grant = waiting
    else:
        grant = {k: min(n, max(1, n * limit // total)) for k, n in waiting.items()}
        over = sum(grant.values()) - limit
        for key in sorted(grant, key=lambda k: (-grant[k], k.topic, k.partition)):
            if over <= 0:
                break
            take = min(over, grant[key] - 1)
            grant[key] -= take
            over -= take
        spare = limit - sum(grant.values())
        for key in sorted(grant, key=lambda k: (k.topic, k.partition)):
            if spare <= 0:
                break
            extra = min(spare, waiting[key] - grant[key])
            grant[key] += extra
            spare -= extra
    updates = {k: replace(offset.partitions[k], live=offset.partitions[k].live + n) for k, n in grant.items() if n > 0}
    return offset.with_partitions(updates) if updates else offset


def take_backfill(offset: SourceOffset, budget: int | None) -> SourceOffset:
    """Deliver up to ``budget`` pending offsets (None: all), oldest first within each partition.

    The budget is shared fairly between partitions (water-filling: a partition
    that needs less than its share leaves the rest to the others), so one huge
    lag cannot starve a small one.
    """
    owed = {k: s.pending_count for k, s in offset.partitions.items() if s.pending}
    if not owed:
        return offset
    if budget is not None and budget <= 0:
        return offset
    grant = fair_shares(owed, budget)
    updates = {}
    for key, count in grant.items():
        if count > 0:
            state = offset.partitions[key]
            updates[key] = replace(state, pending=_consume_front(state.pending, count))
    return offset.with_partitions(updates) if updates else offset


def fair_shares(owed: Mapping[TopicPartitionKey, int], budget: int | None) -> dict[TopicPartitionKey, int]:
    """Split ``budget`` offsets between partitions owed ``owed[key]`` (None: everything owed).

    Water-filling: a partition that needs less than its share leaves the rest to
    the others, so one huge lag cannot starve a small one; the sum is
    ``min(budget, sum(owed))`` and no partition gets more than it is owed.
    """
    if budget is None:
        return dict(owed)
    grant: dict[TopicPartitionKey, int] = {}
    remaining = max(0, budget)
    order = sorted(owed, key=lambda k: (owed[k], k.topic, k.partition))
    for i, key in enumerate(order):
        share = remaining if i == len(order) - 1 else remaining // (len(order) - i)
        give = min(owed[key], share)
        grant[key] = give
        remaining -= give
    # Integer division can leave a few offsets unassigned: hand them out in key order.
    for key in sorted(owed, key=lambda k: (k.topic, k.partition)):
        if remaining <= 0:
            break
        extra = min(owed[key] - grant[key], remaining)
        grant[key] += extra
        remaining -= extra
    return grant


def has_fresh(offset: SourceOffset, ends: Mapping[TopicPartitionKey, int]) -> bool:
    """Whether any partition has records beyond its live position."""
    return any(ends.get(k, s.live) > s.live for k, s in offset.partitions.items())


def plan_next(
    start: SourceOffset,
    ends: Mapping[TopicPartitionKey, int],
    *,
    jumps: Mapping[TopicPartitionKey, int] | None,
    backfill_budget: int | None,
    live_limit: int | None = None,
) -> SourceOffset:
    """The end offset of the next batch from ``start`` (partitions already discovered).

    With ``jumps`` (the recovery batch) the batch carries live records only;
    otherwise live records plus at most ``backfill_budget`` pending offsets.
    """
    offset = start
    if jumps:
        offset = apply_jumps(offset, jumps)
        return advance_live(offset, ends, live_limit)
    offset = advance_live(offset, ends, live_limit)
    return take_backfill(offset, backfill_budget)


def chunk_tasks(
    pieces: Iterable[Piece],
    backfill_tasks: int,
    max_live_per_task: int | None = None,
    min_live_tasks: int | None = None,
) -> list[list[Piece]]:
    """Group a batch's pieces into Spark tasks.

    Live pieces get a task per partition (cut every ``max_live_per_task``
    offsets when set).  Backfill pieces are cut and packed into at most
    ``backfill_tasks`` tasks of near-equal size, so the backfill of one batch
    runs in parallel on that many executor cores.
    """
    if backfill_tasks < 1:
        raise ValueError(f"backfill_tasks must be >= 1, got {backfill_tasks}")
    live: list[Piece] = []
    backfill: list[Piece] = []
    for p in pieces:
        if len(p) > 0:
            (backfill if p.backfill else live).append(p)
    tasks: list[list[Piece]] = []
    if min_live_tasks is not None and live and len(live) < min_live_tasks:
        # minPartitions: cut the live pieces so the batch has at least that many live tasks.
        size = max(1, math.ceil(sum(len(p) for p in live) / min_live_tasks))
        max_live_per_task = size if max_live_per_task is None else min(size, max_live_per_task)
    for p in live:
        if max_live_per_task is None or len(p) <= max_live_per_task:
            tasks.append([p])
        else:
            tasks.extend([[q] for q in _cut(p, max_live_per_task)])
    total = sum(len(p) for p in backfill)
    if total:
        target = math.ceil(total / backfill_tasks)
        current: list[Piece] = []
        room = target
        for p in backfill:
            rest = p
            while len(rest) > 0:
                take = min(room, len(rest))
                current.append(replace(rest, end=rest.start + take))
                rest = replace(rest, start=rest.start + take)
                room -= take
                if room == 0:
                    tasks.append(current)
                    current, room = [], target
        if current:
            tasks.append(current)
    return tasks


# -- helpers -----------------------------------------------------------------------------------


def _cut(p: Piece, size: int) -> list[Piece]:
    return [replace(p, start=s, end=min(s + size, p.end)) for s in range(p.start, p.end, size)]


def _consume_front(pending: tuple[OffsetRange, ...], count: int) -> tuple[OffsetRange, ...]:
    out: list[OffsetRange] = []
    for r in pending:
        if count >= len(r):
            count -= len(r)
            continue
        out.append(OffsetRange(r.start + count, r.end) if count > 0 else r)
        count = 0
    return tuple(out)
