"""This query's entries in Spark's offset and commit logs, read and written by the recovery.

A query :func:`~fastrecover.spark.start_kafka_stream` starts has two sources,
Spark's Kafka source and the idle ticker, so each offset log entry has two
source lines; :func:`kafka_end` refuses an entry of any other shape before
anything is written.  :func:`commit_batch` writes a commit log entry as Spark
would.  The entries' formats are parsed in :mod:`fastrecover.spark.checkpoint`.
"""

from __future__ import annotations

from fastrecover.errors import CheckpointError
from fastrecover.spark.checkpoint import NO_OFFSET, OffsetLogEntry, is_kafka_offset, kafka_offsets, parse_offset_log
from fastrecover.spark.checkpoint_files import CheckpointFiles
from fastrecover.tokens import TopicPartitionKey

#: Spark's commit log entry of a batch before any watermark
_DEFAULT_COMMIT = 'v1\n{"nextBatchWatermarkMs":0}'


def offset_entry(files: CheckpointFiles, batch_id: int) -> tuple[OffsetLogEntry, str]:
    """Spark's ``offsets/<batch_id>`` and its path (for messages)."""
    where = f"{files.location}/offsets/{batch_id}"
    text = files.read(f"offsets/{batch_id}")
    if text is None:
        raise CheckpointError(f"{where} does not exist")
    return parse_offset_log(text, where), where


#: the query is Kafka's source unioned with the idle ticker: Kafka's is the first source line
KAFKA_SOURCE = 0


def kafka_end(entry: OffsetLogEntry, where: str) -> dict[TopicPartitionKey, int]:
    """The Kafka source's end offsets in an entry of this query's offset log (empty: none yet).

    An entry whose sources are not Kafka's and the idle ticker's (a number) belongs to another query:
    jumping it would leave the lag in a journal that query never reads, so it is refused before anything
    is written.
    """
    kafka, ticker = entry.sources if len(entry.sources) == 2 else ("", "")
    if not (kafka == NO_OFFSET or is_kafka_offset(kafka)) or not (ticker == NO_OFFSET or ticker.isdigit()):
        raise CheckpointError(
            f"{where}: sources {[t[:80] for t in entry.sources]!r} are not Kafka's and the idle ticker's; "
            "this checkpoint was not created by start_kafka_stream"
        )
    return {} if kafka == NO_OFFSET else kafka_offsets(kafka, where)


def commit_batch(files: CheckpointFiles, batch_id: int) -> None:
    """Batch ``batch_id``'s commit log entry: the previous batch's (its watermark), else Spark's default.

    The previous batch is committed whenever this is called (the commit log has no holes below the last
    batch, and batch 0 has no previous entry), so no listing of the log is needed.
    """
    text = files.read(f"commits/{batch_id - 1}") if batch_id > 0 else None
    files.write(f"commits/{batch_id}", text or _DEFAULT_COMMIT)
