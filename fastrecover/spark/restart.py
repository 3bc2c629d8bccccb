"""What :func:`~fastrecover.spark.start_kafka_stream` does to the checkpoint before Spark starts.

First it finishes what a dead driver left half done (a jump journalled but not
written, a jump whose commit did not land, a batch Spark logged but did not
commit); then, if the committed offsets lag the log end enough, it journals the
lag ranges and writes a batch that jumps to the log end.

Another driver may be starting on the same checkpoint at the same time (a
zombie and its replacement).  Every file is written once
(:meth:`~fastrecover.spark.checkpoint_files.CheckpointFiles.create`), and no
entry the other driver may still act on is deleted: a jump journalled but not
written is finished with its own ranges, never rewritten, so whichever driver
writes the jump batch, the journal holds that batch's lag; the other driver
stops on the batch it finds written.

Under a one-shot trigger it reads the journal's backlog instead of jumping,
each chunk in a batch of its own.  The decisions are pure, in
:mod:`fastrecover.spark.jump`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from fastrecover.errors import CheckpointError
from fastrecover.spark.checkpoint import OffsetLogEntry, render_kafka_offsets
from fastrecover.spark.checkpoint_files import CheckpointFiles
from fastrecover.spark.foreach_batch import Batches
from fastrecover.spark.journal import JUMPS_DIR, Journal
from fastrecover.spark.jump import check_continued_jump, continues, jumped, lag_ranges
from fastrecover.spark.offsets import Piece
from fastrecover.spark.options import SourceOptions
from fastrecover.spark.query_log import KAFKA_SOURCE, commit_batch, kafka_end, offset_entry
from fastrecover.spark.source import trace
from fastrecover.tokens import TopicPartitionKey

log = logging.getLogger("fastrecover.spark")


def recover(
    files: CheckpointFiles, batches: Batches, journal: Journal, opts: SourceOptions, *, one_shot: bool = False
) -> None:
    """Before Spark starts: finish what a dead driver left half done, then jump over the lag.

    Under a one-shot trigger (``once``, ``availableNow``) there is no new jump: Spark runs only the batches
    such a trigger finds live records for, and the batch after a jump reads no chunk, so a jumped lag
    would wait in the journal for a continuous run, perhaps until retention deleted it.  The run reads
    everything available anyway; what earlier runs journalled is read first (:func:`_drain`).
    """
    ids = files.batch_ids("offsets")
    if not ids:
        _refuse_leftover_journal(files, journal, "has no batch")
        return  # a new query: Spark's source starts at startingOffsets
    last = ids[-1]
    trace("kafka-stream recover: listed")
    if not files.exists(f"commits/{last}"):
        if last not in journal.jumps:
            # Another driver starting on this checkpoint may have journalled this batch's jump, then written
            # the batch, since the journal was loaded: the batch is judged by its entry on disk.
            journal.load(JUMPS_DIR, last)
        if last in journal.jumps and batches.kafka_end(last) == jumped(
            batches.kafka_end(last - 1), journal.jumps[last]
        ):
            commit_batch(files, last)  # a jump whose commit did not land: the batch is the jump, finish it
        elif last == 0:
            _refuse_leftover_journal(files, journal, "has only batch 0, not committed")
            return  # Spark runs batch 0 itself: nothing precedes it to jump from
        else:
            if last in journal.jumps:
                # A jump whose batch was written as another: no driver writes this batch again, so no
                # driver will jump with this entry.
                journal.forget(JUMPS_DIR, [last])
            journal.check()  # the rerun reads its chunk: not from a journal that contradicts itself
            batches.rerun(last)
            commit_batch(files, last)
    entry, where = offset_entry(files, last)
    committed = kafka_end(entry, where)
    orphan = journal.jumps.get(last + 1)
    if orphan is not None and not continues(committed, orphan):
        journal.forget(JUMPS_DIR, [last + 1])  # not a jump from the last batch: no driver writes its batch
    journal.tidy(last)
    # After the tidy: a crash while it deleted a drained journal leaves chunks without their jump, which
    # the tidy of the next start deletes; what is left must be consistent before a chunk is read from it.
    journal.check()
    trace("kafka-stream recover: tidied")
    if last + 1 in journal.jumps:
        # A jump journalled from the last batch, its batch not written: by a driver that died there, or by
        # one starting on this checkpoint now.  Its entry is never replaced (the other driver would jump
        # with it), so this driver jumps with it too; whichever writes the batch first goes on, the other
        # stops on it.  A lag that grew since is jumped next.
        last += 1
        ends = batches.log_offsets(list(committed), earliest=False)
        check_continued_jump(last, journal.jumps[last], ends, journal.root)
        entry = _jump(files, entry, committed, last, journal.jumps[last])
        committed = jumped(committed, journal.jumps[last])
    if one_shot:
        _drain(files, batches, journal, last, entry)
        return
    ends = batches.log_offsets(list(committed), earliest=False)
    trace("kafka-stream recover: log ends read")
    ranges = lag_ranges(committed, ends, opts.min_lag)
    if not ranges:
        return
    # The ranges first: once the jump batch exists, they are the only record of these offsets.
    journal.add_jump(last + 1, ranges)
    trace("kafka-stream recover: jump journalled")
    _jump(files, entry, committed, last + 1, ranges)


def _jump(
    files: CheckpointFiles,
    entry: OffsetLogEntry,
    committed: Mapping[TopicPartitionKey, int],
    jump: int,
    ranges: list[Piece],
) -> OffsetLogEntry:
    """Write batch ``jump``, journalled already: ``entry`` (the last batch's) with the lag ``ranges`` jumped,
    then its commit.  Returns its offset log entry."""
    offsets = entry.with_source(KAFKA_SOURCE, render_kafka_offsets(jumped(committed, ranges)), int(time.time() * 1000))
    files.write(f"offsets/{jump}", offsets.render())
    trace("kafka-stream recover: offsets written")
    commit_batch(files, jump)
    log.info(
        "query at %s restarted %d offsets behind: batch %d jumps to the log end, the lag is read in chunks",
        files.location,
        sum(map(len, ranges)),
        jump,
    )
    return offsets


def _refuse_leftover_journal(files: CheckpointFiles, journal: Journal, state: str) -> None:
    """CheckpointError when the journal has entries but the offset log has no committed batch.

    Only a committed batch precedes a jump, so such a journal is left over from an earlier run of a
    checkpoint that was deleted in part (``offsets/`` and ``commits/``, not ``fastrecover/``).  The new
    query's batches would read its chunks again, or its ranges, from offsets Spark's source reads too.
    """
    if journal.is_empty():
        return
    where = journal.root
    raise CheckpointError(
        f"{where} holds a journal ({len(journal.jumps)} jump(s), {len(journal.chunks)} chunk(s)) but "
        f"{files.location}/offsets {state}: it is left over from an earlier run of a checkpoint deleted in "
        f"part, and the new query would read its records again. To start over, delete {where} too (or the "
        "whole checkpoint)"
    )


def _drain(files: CheckpointFiles, batches: Batches, journal: Journal, last: int, entry: OffsetLogEntry) -> None:
    """Every chunk the journal owes, each in a batch of its own, before Spark starts.

    A batch here is what Spark would log for a batch without live records: the last batch's offsets
    again.  Its offset log entry is written, then its chunk is journalled and goes through the user's
    function, then its commit lands.  A crash in between leaves an uncommitted batch whose Kafka offsets
    did not move, which the next start runs again with the same chunk and batch id (step 1 of
    :func:`recover`; a chunk depends only on the journal's earlier entries).
    """
    batch = last
    while journal.owed():
        batch += 1
        entry = entry.with_source(KAFKA_SOURCE, entry.sources[KAFKA_SOURCE], int(time.time() * 1000))
        files.write(f"offsets/{batch}", entry.render())
        read = batches.drain(batch)
        commit_batch(files, batch)
        if not read and batch - 1 not in journal.jumps:  # only the batch after a jump reads no chunk
            raise CheckpointError(f"{files.location}: the journal owes {journal.owed()} offsets but gives no chunk")
    trace("kafka-stream recover: journal drained")
