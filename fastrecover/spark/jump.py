"""Recovery around Spark's own Kafka source: the jump and the backfill chunks, as pure decisions.

:func:`fastrecover.spark.start_kafka_stream` lets Spark's built-in Kafka source
read the live records.  After a restart with a lag, it *jumps*: before Spark
starts, it journals the lag ranges ``[committed end, log end)`` under the
checkpoint and appends a committed batch that ends at the log end, so Spark's
next batch holds fresh records only.  The journalled ranges are then read in
*chunks*, one per later batch, unioned with that batch's live records.

What a batch reads must be the same on every attempt of that batch id (a
replay reads the same records), and the union of the chunks must be exactly
the journalled ranges.  Both follow from these functions of the journal alone:
ranges journalled by the jump at batch ``j`` are owed to batches after ``j``;
batch ``k``'s chunk is journalled before it is read and reused on a replay; a
batch that has not been journalled takes the next chunk of what the ranges
owe minus the chunks of earlier batches; and the first batch after a jump
takes none, so fresh records are not held up by the backlog.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fastrecover.ranges import OffsetRange, subtract
from fastrecover.spark.offsets import Piece
from fastrecover.spark.planning import fair_shares
from fastrecover.tokens import TopicPartitionKey

__all__ = ["chunk_for", "jumped", "lag_ranges", "pending", "take_chunk", "task_count"]

#: a backfill task reads at least this many offsets: a Kafka read task pays for its consumer (tenths of a
#: second when it is new), so a small chunk is not cut below one task per partition
MIN_TASK_OFFSETS = 100_000


def lag_ranges(
    committed: Mapping[TopicPartitionKey, int], ends: Mapping[TopicPartitionKey, int], min_lag: int
) -> list[Piece]:
    """The partitions worth a jump: ``[committed, log end)`` where that is at least ``min_lag`` offsets.

    A partition whose log end is unknown, or below the committed offset (a
    topic deleted and re-created, retention), is left to Spark's own source.
    """
    out = []
    for key in sorted(committed, key=lambda k: (k.topic, k.partition)):
        start, end = committed[key], ends.get(key)
        if end is not None and end - start >= max(1, min_lag):
            out.append(Piece(key.topic, key.partition, start, end, True))
    return out


def jumped(committed: Mapping[TopicPartitionKey, int], ranges: Iterable[Piece]) -> dict[TopicPartitionKey, int]:
    """The Kafka offsets of the jump batch: each jumped partition at its range's end, the rest unchanged."""
    out = dict(committed)
    for piece in ranges:
        out[piece.key] = max(out.get(piece.key, 0), piece.end)
    return out


def pending(ranges: Iterable[Piece], chunks: Iterable[Piece]) -> list[Piece]:
    """What the ranges still owe after the chunks: per partition, in offset order."""
    taken: dict[TopicPartitionKey, list[OffsetRange]] = {}
    for c in chunks:
        taken.setdefault(c.key, []).append(OffsetRange(c.start, c.end))
    out = []
    for r in sorted(ranges, key=lambda p: (p.topic, p.partition, p.start)):
        for part in subtract(OffsetRange(r.start, r.end), taken.get(r.key, ())):
            out.append(Piece(r.topic, r.partition, part.start, part.end, True))
    return out


def take_chunk(owed: Iterable[Piece], budget: int | None) -> list[Piece]:
    """Up to ``budget`` offsets (None: all) of ``owed``, shared fairly between partitions, oldest first."""
    by_key: dict[TopicPartitionKey, list[Piece]] = {}
    for p in owed:
        if len(p) > 0:
            by_key.setdefault(p.key, []).append(p)
    grant = fair_shares({k: sum(map(len, v)) for k, v in by_key.items()}, budget)
    out = []
    for key in sorted(by_key, key=lambda k: (k.topic, k.partition)):
        left = grant.get(key, 0)
        for p in sorted(by_key[key], key=lambda p: p.start):
            if left <= 0:
                break
            n = min(left, len(p))
            out.append(Piece(p.topic, p.partition, p.start, p.start + n, True))
            left -= n
    return out


def chunk_for(
    batch_id: int,
    jumps: Mapping[int, list[Piece]],
    chunks: Mapping[int, list[Piece]],
    budget: int | None,
) -> list[Piece]:
    """The backfill chunk batch ``batch_id`` reads: its journalled chunk, or the next one it owes.

    ``jumps`` maps a jump batch id to its lag ranges, ``chunks`` a batch id to
    its journalled chunk.  Only entries of earlier batches count, so a replay
    of a batch computes what its first attempt computed even when later
    entries exist.
    """
    if batch_id in chunks:
        return list(chunks[batch_id])
    if batch_id - 1 in jumps:
        return []  # the first batch after a jump: fresh records first, the backlog from the next one
    owed = pending(
        (r for j, rs in jumps.items() if j < batch_id for r in rs),
        (c for b, cs in chunks.items() if b < batch_id for c in cs),
    )
    return take_chunk(owed, budget)


def task_count(chunk: Iterable[Piece], wanted: int) -> int:
    """Spark tasks for reading ``chunk``: ``wanted`` (``backfillTasks``), but none under MIN_TASK_OFFSETS
    offsets, and never fewer than one per range (Spark's reader does not merge ranges)."""
    pieces = list(chunk)
    total = sum(map(len, pieces))
    return max(len(pieces), min(wanted, -(-total // MIN_TASK_OFFSETS)))
