"""The recovery's journal under ``<checkpoint>/fastrecover``: jumps' lag ranges and batches' chunks.

A jump journals its lag ranges before the jump batch is written, and a batch
journals its chunk before it reads it, so a replayed batch reads the same
records.  An entry is written once and never replaced: two drivers on one
checkpoint find each other's entries instead of rewriting them.
:class:`Journal` keeps the entries in memory, in step with the files; the
decisions over them (what a batch's chunk is, which entries contradict each
other) are pure, in :mod:`fastrecover.spark.jump`, and the entries' format is
in :mod:`fastrecover.spark.checkpoint`.
"""

from __future__ import annotations

import logging

from fastrecover.errors import CheckpointError
from fastrecover.spark.checkpoint import parse_journal, render_journal
from fastrecover.spark.checkpoint_files import CheckpointFiles
from fastrecover.spark.jump import CHUNKS, JUMPS, check_journal, check_new_jump, chunk_for, pending
from fastrecover.spark.offsets import Piece

log = logging.getLogger("fastrecover.spark")

#: the journal's directory under the checkpoint, one subdirectory per kind of entry
_JOURNAL = "fastrecover"
JUMPS_DIR = f"{_JOURNAL}/{JUMPS}"
CHUNKS_DIR = f"{_JOURNAL}/{CHUNKS}"


class Journal:
    """The jumps' lag ranges and the batches' chunks, loaded once and kept in step with the files."""

    def __init__(self, files: CheckpointFiles) -> None:
        self._files = files
        self.jumps = self._load(JUMPS_DIR)
        self.chunks = self._load(CHUNKS_DIR)

    def _load(self, directory: str) -> dict[int, list[Piece]]:
        out = {}
        for batch in self._files.batch_ids(directory):
            rel = f"{directory}/{batch}"
            out[batch] = parse_journal(self._files.read(rel) or "", f"{self._files.location}/{rel}")
        return out

    def forget(self, directory: str, batch_ids: list[int]) -> None:
        entries = self.jumps if directory == JUMPS_DIR else self.chunks
        for batch in batch_ids:
            self._files.delete(f"{directory}/{batch}")
            entries.pop(batch, None)

    def load(self, directory: str, batch_id: int) -> bool:
        """Read one entry again from the checkpoint (another driver may have written it since the journal
        was loaded); whether it exists."""
        rel = f"{directory}/{batch_id}"
        text = self._files.read(rel)
        if text is None:
            return False
        entries = self.jumps if directory == JUMPS_DIR else self.chunks
        entries[batch_id] = parse_journal(text, f"{self._files.location}/{rel}")
        return True

    def tidy(self, last: int) -> None:
        """Drop entries no batch will read: chunks after ``last``, jumps after ``last + 1`` (batches never
        written), and, once everything journalled is read, the whole journal up to ``last``.

        A jump at ``last + 1`` stays: it may be another driver's, starting on this checkpoint now, which
        writes that batch next; the restart judges it (:func:`~fastrecover.spark.restart.recover`).  The
        journal is loaded before the offset log is listed, so no other entry after ``last`` can be a
        running driver's.  Jumps go first: chunks without their ranges owe nothing, ranges without their
        chunks would be read again, so a crash between the two deletions must find the ranges gone.
        """
        self.forget(JUMPS_DIR, [b for b in self.jumps if b > last + 1])
        self.forget(CHUNKS_DIR, [b for b in self.chunks if b > last])
        if self.owed() == 0:
            for directory, entries in ((JUMPS_DIR, self.jumps), (CHUNKS_DIR, self.chunks)):
                self.forget(directory, [b for b in entries if b <= last])

    @property
    def root(self) -> str:
        """Where the journal lives, for messages: ``<checkpoint>/fastrecover``."""
        return f"{self._files.location}/{_JOURNAL}"

    def check(self) -> None:
        """Refuse entries that contradict each other (:func:`~fastrecover.spark.jump.check_journal`)."""
        check_journal(self.jumps, self.chunks, self.root)

    def is_empty(self) -> bool:
        return not (self.jumps or self.chunks)

    def add_jump(self, batch_id: int, ranges: list[Piece]) -> None:
        """Journal a jump's lag ranges; refused if they overlap journalled ones (Kafka's offsets went back)."""
        check_new_jump(self.jumps, self.chunks, batch_id, ranges, self.root)
        self._create(JUMPS_DIR, batch_id, ranges)
        self.jumps[batch_id] = ranges

    def chunk(self, batch_id: int, budget: int | None) -> list[Piece]:
        """Batch ``batch_id``'s chunk, journalled before the first read of it."""
        pieces = chunk_for(batch_id, self.jumps, self.chunks, budget)
        if pieces and batch_id not in self.chunks:
            self._create(CHUNKS_DIR, batch_id, pieces)
            self.chunks[batch_id] = pieces
            # Progress of the drain, one line per chunk: what this batch reads and what the journal still owes.
            log.info(
                "%s: batch %d reads %d backlog offsets in %d range(s); %d still owed after it",
                self._files.location,
                batch_id,
                sum(map(len, pieces)),
                len(pieces),
                self.owed(),
            )
        return pieces

    def _create(self, directory: str, batch_id: int, pieces: list[Piece]) -> None:
        """Write an entry once.  The same entry there already is another driver's identical decision; a
        different one is never replaced: the batch would read, or jump, other offsets than the ones the
        other driver, still running, records, and one of the two would skip them."""
        rel, text = f"{directory}/{batch_id}", render_journal(pieces)
        if self._files.create(rel, text):
            return
        where = f"{self._files.location}/{rel}"
        there = self._files.read(rel)
        if there is not None and parse_journal(there, where) == parse_journal(text, where):
            return
        raise CheckpointError(
            f"{where} exists already with other ranges than this driver's: another driver runs on this "
            "checkpoint and wrote it; this one stops here and leaves the checkpoint to it"
        )

    def owed(self) -> int:
        """Offsets the journalled ranges still owe after every journalled chunk."""
        ranges = [r for rs in self.jumps.values() for r in rs]
        return sum(map(len, pending(ranges, [c for cs in self.chunks.values() for c in cs])))
