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

The journal is read back from the checkpoint, so it is untrusted input: a file
at a time is checked by :func:`fastrecover.spark.checkpoint.parse_journal`, and
the entries against each other by :func:`check_journal` (what no crash and no
run of ours can produce, and what would make a batch read an offset twice or
skip one).  :func:`check_new_jump` refuses a jump whose ranges the journal
already holds: Spark's offsets went back (the topic was re-created, or its log
truncated, while the query was down).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fastrecover.errors import CheckpointError
from fastrecover.ranges import OffsetRange, subtract
from fastrecover.spark.offsets import Piece
from fastrecover.spark.planning import fair_shares
from fastrecover.tokens import TopicPartitionKey

__all__ = [
    "check_journal",
    "check_new_jump",
    "chunk_for",
    "continues",
    "jumped",
    "lag_ranges",
    "pending",
    "take_chunk",
    "task_count",
]

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


def continues(committed: Mapping[TopicPartitionKey, int], ranges: Iterable[Piece]) -> bool:
    """Whether ``ranges`` are a jump's lag from the batch that ended at ``committed``: each one starts at
    its partition's committed offset, as every jump's ranges do (:func:`lag_ranges`)."""
    return all(committed.get(r.key) == r.start for r in ranges)


def check_continued_jump(
    batch_id: int, ranges: Iterable[Piece], log_ends: Mapping[TopicPartitionKey, int], root: str
) -> None:
    """Refuse to write a journalled jump (another driver's, or a dead one's) whose lag ends past the log end.

    The driver that journalled it read those ends from Kafka a moment before, and log ends only grow:
    an end that is now past the log end means the topic was deleted and re-created, or its log
    truncated, since.  Writing the jump batch would then start the query past records it never read.
    """
    for r in ranges:
        end = log_ends.get(r.key)
        if end is None or r.end > end:
            now = "unknown" if end is None else str(end)
            raise CheckpointError(
                f"{root}/{JUMPS}/{batch_id} journals a jump over {_describe(r)}, past the log end of "
                f"{r.topic}[{r.partition}] ({now}): Kafka's offsets went back since it was journalled, which "
                "happens when the topic was deleted and re-created, or its log truncated. Writing the jump "
                "would skip records; it was not written. Start the query on a new checkpoint"
            )


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


# -- the journal as a whole ----------------------------------------------------------------------

#: a journal entry's kind: the directory under ``<checkpoint>/fastrecover`` that holds its files
JUMPS, CHUNKS = "jumps", "chunks"


def _first_overlap(
    entries: Mapping[int, Iterable[Piece]],
) -> tuple[tuple[int, Piece], tuple[int, Piece]] | None:
    """Two pieces of different entries that share an offset (entry id, piece), or None."""
    by_key: dict[TopicPartitionKey, list[tuple[int, Piece]]] = {}
    for batch, pieces in entries.items():
        for piece in pieces:
            by_key.setdefault(piece.key, []).append((batch, piece))
    for key in sorted(by_key, key=lambda k: (k.topic, k.partition)):
        reach: tuple[int, Piece] | None = None  # the piece seen so far that ends last
        for batch, piece in sorted(by_key[key], key=lambda e: (e[1].start, e[0])):
            if reach is not None and piece.start < reach[1].end and reach[0] != batch:
                return reach, (batch, piece)
            if reach is None or piece.end > reach[1].end:
                reach = (batch, piece)
    return None


def _describe(piece: Piece) -> str:
    return f"{piece.topic}[{piece.partition}] offsets {piece.start}-{piece.end}"


def check_journal(jumps: Mapping[int, list[Piece]], chunks: Mapping[int, list[Piece]], root: str) -> None:
    """Refuse a journal whose entries contradict each other (``root``: ``<checkpoint>/fastrecover``).

    Every entry is valid alone (:func:`~fastrecover.spark.checkpoint.parse_journal`), but the reads are
    decided across entries: what the jumps owe is their ranges minus every chunk.  So:

    * two jumps must not journal the same offset: it would be owed, and read, twice;
    * two chunks must not hold the same offset: both batches read it;
    * a chunk of batch ``k`` lies inside the ranges of jumps before ``k`` (the only ranges batch ``k``
      reads from): an offset outside them is read by Spark's own source too, or by nobody when the chunk
      claims offsets that are not owed.

    A crash while :meth:`tidy <fastrecover.spark.journal.Journal.tidy>` deletes a drained journal
    leaves chunks without their jump; call this after the tidy, which finishes that deletion.
    CheckpointError names the files at fault.
    """
    for kind, entries in ((JUMPS, jumps), (CHUNKS, chunks)):
        clash = _first_overlap(entries)
        if clash is not None:
            (a, pa), (b, pb) = clash
            raise CheckpointError(
                f"{root}/{kind}/{a} ({_describe(pa)}) and {root}/{kind}/{b} ({_describe(pb)}) overlap: "
                f"no run of start_kafka_stream journals an offset in two {kind}, and reading this journal "
                "would deliver those offsets twice"
            )
    for batch in sorted(chunks):
        for piece in chunks[batch]:
            covering = [
                OffsetRange(r.start, r.end) for j, rs in jumps.items() if j < batch for r in rs if r.key == piece.key
            ]
            outside = subtract(OffsetRange(piece.start, piece.end), covering)
            if outside:
                earlier = sorted(j for j in jumps if j < batch)
                raise CheckpointError(
                    f"{root}/{CHUNKS}/{batch} ({_describe(piece)}): offsets {outside[0].start}-{outside[0].end} "
                    f"lie outside every range journalled by a jump before batch {batch} "
                    f"({', '.join(f'{root}/{JUMPS}/{j}' for j in earlier) or 'none'}); a chunk only reads "
                    "journalled ranges, so this journal is not the one this checkpoint wrote"
                )


def check_new_jump(
    jumps: Mapping[int, list[Piece]],
    chunks: Mapping[int, list[Piece]],
    batch_id: int,
    ranges: Iterable[Piece],
    root: str,
) -> None:
    """Refuse a jump at ``batch_id`` whose lag ranges overlap a range the journal already holds.

    A new lag range starts at Spark's committed offset, which is past every journalled range of its
    partition unless Spark's offsets went back: the topic was deleted and re-created, or its log was
    truncated (an unclean leader election), while the query was down, and the offsets now name other
    records.  Journalling the range anyway would read the offsets still owed twice, or, for offsets the
    chunks already read, subtract them from the new range and skip its records.
    """
    taken = [c for cs in chunks.values() for c in cs]
    for new in ranges:
        for batch in sorted(jumps):
            for old in jumps[batch]:
                if old.key != new.key or not OffsetRange(old.start, old.end).overlaps(OffsetRange(new.start, new.end)):
                    continue
                lo, hi = max(old.start, new.start), min(old.end, new.end)
                owed = sum(map(len, pending([Piece(old.topic, old.partition, lo, hi, True)], taken)))
                raise CheckpointError(
                    f"{root}/{JUMPS}/{batch} journals {_describe(old)}, and the lag of batch {batch_id} "
                    f"({_describe(new)}) overlaps it at {lo}-{hi} ({owed} of those offsets still owed, "
                    f"{hi - lo - owed} already read): Kafka's offsets of {new.topic}[{new.partition}] went "
                    "back, which happens when the topic was deleted and re-created, or its log truncated, "
                    "while the query was down. Reading on would deliver offsets twice or skip records; "
                    "the jump was not journalled. Start the query on a new checkpoint (the journalled "
                    "records may be gone from Kafka)"
                )
