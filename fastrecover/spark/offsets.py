"""The streaming source's offset model: pure values and functions, no Spark, no Kafka.

An offset of ``format("fastrecover")`` describes, per topic-partition, the SET
of records delivered so far::

    delivered(p) = [base, live) minus pending

``base`` is where the query started caring about the partition (fixed when the
partition is first seen), ``live`` is the live position and ``pending`` the
backfill ranges still owed (sorted, disjoint, inside ``[base, live)``).  A
micro-batch is the set difference ``delivered(end) - delivered(start)``, so
what a batch reads depends on its two offsets alone: Spark can replay it after
a failure and get exactly the same records, whatever happened since.

Recovery moves ``[live, log end)`` into ``pending`` and sets ``live`` to the
log end.  That does not change the delivered set (nothing is delivered by the
jump itself); the records of the lag are then delivered by later batches, each
taking at most a budget of offsets from the front (oldest first) of the pending
ranges, while ``live`` keeps following the log end.

Everything here is a function of its arguments; the data source classes in
:mod:`fastrecover.spark.source` only fetch watermarks and call these.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastrecover.errors import OffsetFormatError as OffsetFormatError  # re-exported: it was defined here
from fastrecover.ranges import OffsetRange, subtract
from fastrecover.tokens import TopicPartitionKey

__all__ = [
    "OFFSET_VERSION",
    "LogBounds",
    "OffsetFormatError",
    "PartitionState",
    "Piece",
    "SourceOffset",
    "advance_live",
    "apply_jumps",
    "batch_pieces",
    "chunk_tasks",
    "delivered",
    "discover",
    "has_fresh",
    "initial_offset",
    "lost_between",
    "pending_total",
    "plan_next",
    "recovery_jumps",
    "take_backfill",
]

OFFSET_VERSION = 1


@dataclass(frozen=True, slots=True)
class PartitionState:
    """What one partition has delivered: ``[base, live)`` minus ``pending``."""

    base: int
    live: int
    pending: tuple[OffsetRange, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.base <= self.live:
            raise ValueError(f"need 0 <= base <= live, got base={self.base} live={self.live}")
        cursor = self.base
        for r in self.pending:
            if len(r) == 0:
                raise ValueError(f"empty pending range [{r.start}, {r.end})")
            if r.start < cursor:
                raise ValueError(f"pending ranges overlap, are unsorted or start below base: {self.pending}")
            cursor = r.end
        if cursor > self.live:
            raise ValueError(f"pending range ends at {cursor}, beyond live position {self.live}")

    @property
    def pending_count(self) -> int:
        return sum(len(r) for r in self.pending)


@dataclass(frozen=True, slots=True)
class SourceOffset:
    """The offset of the whole source: one PartitionState per topic-partition."""

    partitions: Mapping[TopicPartitionKey, PartitionState]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SourceOffset) and dict(self.partitions) == dict(other.partitions)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.partitions.items(), key=lambda kv: (kv[0].topic, kv[0].partition))))

    def keys_sorted(self) -> list[TopicPartitionKey]:
        return sorted(self.partitions, key=lambda k: (k.topic, k.partition))

    def get(self, key: TopicPartitionKey) -> PartitionState | None:
        return self.partitions.get(key)

    def with_partitions(self, updates: Mapping[TopicPartitionKey, PartitionState]) -> SourceOffset:
        merged = dict(self.partitions)
        merged.update(updates)
        return SourceOffset(merged)

    # -- JSON, as Spark stores it in the checkpoint's offset log ----------------------------

    def to_json(self) -> dict[str, Any]:
        """A canonical dict (sorted topics and partitions): equal offsets give equal JSON.

        Spark decides "no new data" by comparing the JSON of two offsets, so the
        order of keys must never depend on how the offset was built.
        """
        topics: dict[str, dict[str, Any]] = {}
        for key in self.keys_sorted():
            state = self.partitions[key]
            topics.setdefault(key.topic, {})[str(key.partition)] = {
                "base": state.base,
                "live": state.live,
                "pending": [[r.start, r.end] for r in state.pending],
            }
        return {"v": OFFSET_VERSION, "topics": topics}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> SourceOffset:
        """Parse what :meth:`to_json` wrote; OffsetFormatError names what is wrong."""
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise OffsetFormatError(f"source offset is not JSON: {exc}") from exc
        if not isinstance(data, Mapping):
            raise OffsetFormatError(f"source offset must be a JSON object, got {data!r}")
        if data.get("v") != OFFSET_VERSION:
            raise OffsetFormatError(
                f"source offset version {data.get('v')!r} is not {OFFSET_VERSION}: the checkpoint was "
                "written by another fastrecover version or by another source"
            )
        topics = data.get("topics")
        if not isinstance(topics, Mapping):
            raise OffsetFormatError(f"source offset has no 'topics' object: {data!r}")
        parts: dict[TopicPartitionKey, PartitionState] = {}
        for topic, partitions in topics.items():
            if not isinstance(partitions, Mapping):
                raise OffsetFormatError(f"topic {topic!r}: expected an object of partitions")
            for pkey, raw in partitions.items():
                try:
                    partition = int(pkey)
                    pending = tuple(OffsetRange(int(s), int(e)) for s, e in raw["pending"])
                    parts[TopicPartitionKey(topic, partition)] = PartitionState(
                        int(raw["base"]), int(raw["live"]), pending
                    )
                except (KeyError, TypeError, ValueError) as exc:
                    raise OffsetFormatError(f"{topic}[{pkey}]: invalid partition offset {raw!r}: {exc}") from exc
        return cls(parts)


@dataclass(frozen=True, slots=True)
class LogBounds:
    """A partition's log start (low watermark) and log end (high watermark)."""

    low: int
    high: int


@dataclass(frozen=True, slots=True)
class Piece:
    """A contiguous offset range of one partition that a task reads; ``backfill`` marks lag records."""

    topic: str
    partition: int
    start: int
    end: int
    backfill: bool

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def key(self) -> TopicPartitionKey:
        return TopicPartitionKey(self.topic, self.partition)


# -- sets ------------------------------------------------------------------------------------


def delivered(state: PartitionState | None) -> list[OffsetRange]:
    """The delivered set of one partition as sorted disjoint ranges (empty for an unseen one)."""
    if state is None or state.live == state.base:
        return []
    return subtract(OffsetRange(state.base, state.live), state.pending)


def _difference(a: Sequence[OffsetRange], b: Sequence[OffsetRange]) -> list[OffsetRange]:
    out: list[OffsetRange] = []
    for r in a:
        out.extend(subtract(r, b))
    return out


def lost_between(start: SourceOffset, end: SourceOffset) -> dict[TopicPartitionKey, list[OffsetRange]]:
    """Records delivered at ``start`` that ``end`` no longer counts as delivered (must be empty).

    Offsets never take anything back; a non-empty answer means the offsets do
    not belong to the same query (or a topic was deleted and re-created).
    """
    out: dict[TopicPartitionKey, list[OffsetRange]] = {}
    for key in start.keys_sorted():
        gone = _difference(delivered(start.get(key)), delivered(end.get(key)))
        if gone:
            out[key] = gone
    return out


def batch_pieces(start: SourceOffset, end: SourceOffset) -> list[Piece]:
    """The records of the batch ``(start, end]``: ``delivered(end) - delivered(start)``.

    A record below the start's live position was pending at the start, so it
    is backfill; a record at or above it is live.  Partitions appear in key
    order, pieces in offset order.
    """
    pieces: list[Piece] = []
    for key in end.keys_sorted():
        before = start.get(key)
        new = _difference(delivered(end.get(key)), delivered(before))
        split = before.live if before is not None else None
        for r in new:
            if split is not None and r.start < split < r.end:
                pieces.append(Piece(key.topic, key.partition, r.start, split, True))
                pieces.append(Piece(key.topic, key.partition, split, r.end, False))
            else:
                backfill = split is not None and r.end <= split
                pieces.append(Piece(key.topic, key.partition, r.start, r.end, backfill))
    return pieces


def pending_total(offset: SourceOffset) -> int:
    return sum(s.pending_count for s in offset.partitions.values())


# -- planning ----------------------------------------------------------------------------------


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
    if budget is None:
        grant = owed
    else:
        if budget <= 0:
            return offset
        grant = {}
        remaining = budget
        order = sorted(owed, key=lambda k: (owed[k], k.topic, k.partition))
        for i, key in enumerate(order):
            share = remaining // (len(order) - i)
            if i == len(order) - 1:
                share = remaining
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
    updates = {}
    for key, count in grant.items():
        if count > 0:
            state = offset.partitions[key]
            updates[key] = replace(state, pending=_consume_front(state.pending, count))
    return offset.with_partitions(updates) if updates else offset


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
