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

This module holds the values (offsets, their JSON in Spark's checkpoint, the
pieces a batch reads) and the set algebra on them; the decisions that move an
offset forward (recovery jumps, live and backfill budgets, task layout) are in
:mod:`fastrecover.spark.planning`.  Both are pure: the data source classes in
:mod:`fastrecover.spark.source` only fetch watermarks and call them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    "batch_pieces",
    "delivered",
    "lost_between",
    "partition_number",
    "pending_total",
]

OFFSET_VERSION = 1


def partition_number(key: object) -> int | None:
    """A partition number written as a JSON object key, or None when ``key`` is not one.

    Only the canonical decimal form counts: ``"00"`` or a non-ASCII digit would alias ``"0"`` and let a
    damaged file name one partition twice, the later value silently winning.
    """
    if not (isinstance(key, str) and key.isascii() and key.isdigit()) or str(int(key)) != key:
        return None
    return int(key)


def _offset(value: object) -> int:
    """An offset as JSON holds it: an integer (not a bool, not a float, which ``int`` would truncate)."""
    if type(value) is not int:
        raise TypeError(f"{value!r} is not an integer offset")
    return value


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
                partition = partition_number(pkey)
                if partition is None:
                    raise OffsetFormatError(f"topic {topic!r}: partition key {pkey!r} is not a partition number")
                try:
                    if not isinstance(raw, Mapping) or not isinstance(raw["pending"], list):
                        raise TypeError("expected {'base': n, 'live': n, 'pending': [[start, end], ...]}")
                    pending = tuple(OffsetRange(_offset(s), _offset(e)) for s, e in raw["pending"])
                    parts[TopicPartitionKey(topic, partition)] = PartitionState(
                        _offset(raw["base"]), _offset(raw["live"]), pending
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
