"""The ``foreachBatch`` function of a query :func:`~fastrecover.spark.start_kafka_stream` starts.

Each batch is the live records Spark's Kafka source read, unioned with the
batch's chunk of the journalled backlog, read exactly with Spark's batch Kafka
reader (column ``backfill``), and then the user's function.  A batch of the
idle ticker alone, with no chunk either, is not passed on.  The restart
recovery (:mod:`fastrecover.spark.restart`) runs batches through the same
object: one Spark logged but did not commit, and the backlog of a one-shot run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import reduce
from typing import Any

from fastrecover.spark.checkpoint_files import CheckpointFiles
from fastrecover.spark.driver_jvm import list_log_offsets
from fastrecover.spark.journal import Journal
from fastrecover.spark.jump import task_count
from fastrecover.spark.jvm import read_ranges
from fastrecover.spark.offsets import Piece
from fastrecover.spark.options import SourceOptions
from fastrecover.spark.query_log import kafka_end, offset_entry
from fastrecover.spark.source import trace
from fastrecover.tokens import TopicPartitionKey

log = logging.getLogger("fastrecover.spark")


class Batches:
    """The foreachBatch function: the batch's live records, its backfill chunk, the user's function."""

    def __init__(
        self,
        spark: Any,
        opts: SourceOptions,
        kafka_options: Mapping[str, str],
        files: CheckpointFiles,
        journal: Journal,
        process: Callable[[Any, int], None],
    ) -> None:
        self._spark = spark
        self._opts = opts
        self._kafka_options = dict(kafka_options)
        self._files = files
        self._journal = journal
        self._process = process
        self._ends: dict[int, dict[TopicPartitionKey, int]] = {}
        self._reader: Any = None

    def __call__(self, live: Any, batch_id: int) -> None:
        for old in [b for b in self._ends if b < batch_id - 1]:
            del self._ends[old]  # batches run in order: only the previous batch's end is needed again
        trace(f"kafka-stream batch {batch_id}")
        chunk = self._journal.chunk(batch_id, self._opts.max_backfill)
        if not chunk and not self._has_live(batch_id):
            return  # a tick of the idle source alone: nothing for the user's function
        trace(f"kafka-stream batch {batch_id}: chunk of {sum(map(len, chunk))} offsets")
        from pyspark.sql import functions as F

        self._deliver(batch_id, [live.where(F.col("topic").isNotNull()).withColumn("backfill", F.lit(False))], chunk)
        trace(f"kafka-stream batch {batch_id}: processed")

    def rerun(self, batch_id: int) -> None:
        """Run a batch Spark logged but did not commit, as Spark would have: same offsets, chunk and id."""
        start, end = self.kafka_end(batch_id - 1), self.kafka_end(batch_id)
        missing = [k for k in end if k not in start]
        if missing:  # a partition new in this batch: Spark's source read it from its log start
            start = {**start, **self.log_offsets(missing, earliest=True)}
        live = [Piece(k.topic, k.partition, start[k], end[k], False) for k in sorted(end) if end[k] > start[k]]
        log.info("%s: batch %d was not committed; running it before the query starts", self._files.location, batch_id)
        self._deliver(
            batch_id,
            [self.read(live, backfill=False)] if live else [],
            self._journal.chunk(batch_id, self._opts.max_backfill),
        )

    def drain(self, batch_id: int) -> bool:
        """Run batch ``batch_id`` as a batch of the backlog alone (no live records): its chunk, journalled
        first, through the user's function.  False when the batch has no chunk (the one after a jump)."""
        chunk = self._journal.chunk(batch_id, self._opts.max_backfill)
        self._deliver(batch_id, [], chunk)
        return bool(chunk)

    def _deliver(self, batch_id: int, frames: list[Any], chunk: list[Piece]) -> None:
        """The user's function over the batch's live frames and its chunk (nothing to read: not called)."""
        if chunk:
            frames.append(self.read(chunk, backfill=True))
        if frames:
            self._process(reduce(lambda a, b: a.unionByName(b), frames), batch_id)

    def _has_live(self, batch_id: int) -> bool:
        """Whether Spark's Kafka source moved between the previous batch and this one (offset log)."""
        end = self.kafka_end(batch_id)
        before = self._ends.get(batch_id - 1) if batch_id > 0 else {}
        if before is None:
            before = self.kafka_end(batch_id - 1)
        return end != before

    def log_offsets(self, keys: list[TopicPartitionKey], *, earliest: bool) -> dict[TopicPartitionKey, int]:
        """Log start or end of ``keys`` (:func:`list_log_offsets`, with the query's ``kafka.*`` options)."""
        return list_log_offsets(self._spark, self._kafka_options, keys, self._opts.read_timeout_s, earliest=earliest)

    def kafka_end(self, batch_id: int) -> dict[TopicPartitionKey, int]:
        if batch_id not in self._ends:
            self._ends[batch_id] = kafka_end(*offset_entry(self._files, batch_id))
        return self._ends[batch_id]

    def read(self, pieces: list[Piece], *, backfill: bool) -> Any:
        """Exactly ``pieces`` (all live or all backfill) with Spark's batch Kafka reader, unioned."""
        marked = [replace(p, backfill=backfill) for p in pieces]

        def tasks(layer: Sequence[Piece]) -> int | None:
            return task_count(layer, self._opts.backfill_tasks) if backfill else self._opts.min_partitions

        frames = read_ranges(self._reading_session(), marked, self._kafka_options, self._opts, tasks)
        return reduce(lambda a, b: a.unionByName(b), frames)

    def _reading_session(self) -> Any:
        """A session of the same SparkContext whose batch Kafka reads use Spark's DataSource V2 reader.

        Spark lists ``kafka`` in ``spark.sql.sources.useV1SourceList`` by default, so a batch read goes
        through the V1 relation, about a fifth slower per record than the V2 reader its streaming source
        uses (docs/spark.md).  The setting is changed in a session of our own, not in the user's.
        """
        if self._reader is None:
            session = self._spark.newSession()
            key = "spark.sql.sources.useV1SourceList"
            current = str(session.conf.get(key, "") or "")
            session.conf.set(key, ",".join(s for s in current.split(",") if s.strip().lower() != "kafka"))
            self._reader = session
        return self._reader
