"""Fast recovery with records read by Spark's JVM Kafka reader: :func:`start_stream` (deprecated: use
:func:`fastrecover.spark.start_kafka_stream`), and the batch range reads ``start_kafka_stream`` uses.

``format("fastrecover")`` plans every micro-batch (which offsets, live and
backfill) and Spark writes that plan to the checkpoint's offset log before the
batch runs.  Reading the records in Python workers is what made the source 3-6x
slower than Spark's own Kafka source (docs/spark.md, "Profile").  Here the
planning stays in the Python source, and the records of each batch are read by
Spark's batch Kafka reader (``spark.read.format("kafka")`` with explicit
``startingOffsets``/``endingOffsets`` per partition), which reads exactly a range
at JVM speed and splits big ranges over ``minPartitions`` tasks.

The batch's offsets come from the checkpoint's offset log (``offsets/<id>`` and
``offsets/<id - 1>``), so the Spark checkpoint stays the authority for what a
batch covers: a replayed batch id reads the same offsets, and
``batch_pieces`` (pure) turns two offsets into disjoint ranges, so no record of
a query run is read twice nor skipped.  The source's own DataFrame is never
evaluated: no Python worker starts unless the user's code needs one.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import reduce
from typing import Any
from urllib.parse import urlparse

from fastrecover.errors import ConfigError, FastRecoverError
from fastrecover.spark.checkpoint import render_kafka_offsets
from fastrecover.spark.offsets import Piece, SourceOffset, batch_pieces
from fastrecover.spark.options import SourceOptions, parse_source_options
from fastrecover.spark.source import source_schema, trace

log = logging.getLogger("fastrecover.spark")

__all__ = ["connector_package", "layers", "read_ranges", "start_foreach_batch", "start_stream"]

#: PySpark releases whose spark-sql-kafka-0-10 is not on Maven Central (checked 2026-11-22 with
#: ``mvn dependency:get``) -> the newest published connector, which runs on them.
_PUBLISHED_CONNECTOR = {"4.3.0": "4.2.0"}


def connector_package() -> str:
    """Maven coordinates of Spark's Kafka connector for ``spark.jars.packages``.

    The PySpark version's connector, or FASTRECOVER_SPARK_KAFKA_VERSION, or the
    newest published one when PySpark's own is not on Maven Central yet.
    """
    import os

    import pyspark

    version = os.environ.get("FASTRECOVER_SPARK_KAFKA_VERSION") or _PUBLISHED_CONNECTOR.get(
        pyspark.__version__, pyspark.__version__
    )
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"


def layers(pieces: Sequence[Piece]) -> list[list[Piece]]:
    """Group a batch's pieces into reads of at most one range per partition, all live or all backfill.

    One ``spark.read.format("kafka")`` reads one range per partition, so a
    partition with several ranges in a batch (a backfill range and its live
    records, or two pending ranges) is read by several layers, unioned.
    """
    out: list[list[Piece]] = []
    for flag in (True, False):
        by_key: dict[tuple[str, int], list[Piece]] = {}
        for p in pieces:
            if p.backfill == flag and len(p) > 0:
                by_key.setdefault((p.topic, p.partition), []).append(p)
        depth = max((len(v) for v in by_key.values()), default=0)
        for i in range(depth):
            out.append([v[i] for _, v in sorted(by_key.items()) if len(v) > i])
    return out


def _offsets_json(pieces: Sequence[Piece], attr: str) -> str:
    return render_kafka_offsets({p.key: int(getattr(p, attr)) for p in pieces})


def _assign_json(pieces: Sequence[Piece]) -> str:
    doc: dict[str, list[int]] = {}
    for p in pieces:
        doc.setdefault(p.topic, []).append(p.partition)
    return json.dumps(doc, sort_keys=True)


class _BatchReader:
    """The foreachBatch function: reads the batch's offsets from the checkpoint, the records with the JVM."""

    def __init__(
        self,
        spark: Any,
        options: SourceOptions,
        checkpoint: str,
        process: Callable[[Any, int], None],
    ) -> None:
        self._spark = spark
        self._opts = options
        self._checkpoint = checkpoint.rstrip("/")
        self._process = process
        self._initial: SourceOffset | None = None

    def __call__(self, _planned: Any, batch_id: int) -> None:
        trace(f"foreachBatch {batch_id}")
        end = self._offset(batch_id)
        start = self._offset(batch_id - 1) if batch_id > 0 else self._initial_offset()
        pieces = batch_pieces(start, end)
        records = self._records(pieces)
        trace(f"records planned {batch_id}")
        self._process(records, batch_id)
        trace(f"processed {batch_id}")

    # -- the checkpoint -----------------------------------------------------------------------

    def _read_text(self, path: str) -> str:
        parsed = urlparse(path)
        if parsed.scheme in ("", "file"):
            with open(parsed.path if parsed.scheme else path, encoding="utf-8") as fh:
                return fh.read()
        jvm = self._spark.sparkContext._jvm
        hpath = jvm.org.apache.hadoop.fs.Path(path)
        fs = hpath.getFileSystem(self._spark.sparkContext._jsc.hadoopConfiguration())
        stream = fs.open(hpath)
        try:
            return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def _offset(self, batch_id: int) -> SourceOffset:
        """The source's end offset of ``batch_id`` as Spark's offset log holds it (written before the batch)."""
        path = f"{self._checkpoint}/offsets/{batch_id}"
        try:
            lines = self._read_text(path).splitlines()
        except (OSError, Exception) as exc:  # py4j raises its own error types for remote file systems
            raise FastRecoverError(f"cannot read the offset log entry {path}: {exc}") from exc
        if len(lines) < 3:
            raise FastRecoverError(f"offset log entry {path} has no source offset: {lines!r}")
        return SourceOffset.from_json(json.loads(lines[2]))

    def _initial_offset(self) -> SourceOffset:
        """Batch 0 starts at the initial offset the source stored under the query name."""
        if self._initial is None:
            from fastrecover.spark.state import SparkState
            from fastrecover.store import open_store

            store = open_store(self._opts.store_url)
            try:

                def missing() -> str:
                    raise FastRecoverError(f"query {self._opts.query!r} has no stored initial offset")

                self._initial = SourceOffset.from_json(SparkState(store).initial_offset(self._opts.query, missing))
            finally:
                store.close()
        return self._initial

    # -- reading ------------------------------------------------------------------------------

    def _records(self, pieces: Sequence[Piece]) -> Any:
        def tasks(layer: Sequence[Piece]) -> int | None:
            return self._opts.backfill_tasks if layer[0].backfill else self._opts.min_partitions

        # One group id for every batch of the query: Spark pools its executors' consumers by (group id,
        # partition), so batches reuse them instead of creating consumers per batch (reads assign
        # partitions; nothing joins the group or commits).
        client = {f"kafka.{k}": v for k, v in self._opts.kafka.items()}
        client["kafka.group.id"] = f"fastrecover-spark-{self._opts.query}"
        frames = read_ranges(self._spark, pieces, client, self._opts, tasks)
        if not frames:
            return self._spark.createDataFrame([], source_schema(self._opts.include_headers))
        return reduce(lambda a, b: a.unionByName(b), frames)


def read_ranges(
    session: Any,
    pieces: Sequence[Piece],
    client: Mapping[str, str],
    opts: SourceOptions,
    tasks: Callable[[Sequence[Piece]], int | None],
) -> list[Any]:
    """Exactly ``pieces`` with Spark's batch Kafka reader: one DataFrame per layer, with a ``backfill`` column.

    ``client`` holds the ``kafka.*`` options as Spark's reader takes them; ``tasks(layer)`` is the
    ``minPartitions`` of a layer (None: one task per range).
    """
    from pyspark.sql import functions as F

    frames = []
    for layer in layers(pieces):
        reader = session.read.format("kafka")
        for key, value in client.items():
            reader = reader.option(key, value)
        reader = (
            reader.option("assign", _assign_json(layer))
            .option("startingOffsets", _offsets_json(layer, "start"))
            .option("endingOffsets", _offsets_json(layer, "end"))
            .option("failOnDataLoss", str(opts.fail_on_data_loss).lower())
            .option("includeHeaders", str(opts.include_headers).lower())
        )
        wanted = tasks(layer)
        if wanted is not None and wanted > len(layer):
            reader = reader.option("minPartitions", str(wanted))
        frames.append(reader.load().withColumn("backfill", F.lit(layer[0].backfill)))
    return frames


def start_stream(
    spark: Any,
    options: Mapping[str, str],
    process: Callable[[Any, int], None],
    checkpoint_location: str,
    *,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
) -> Any:
    """Start a streaming query with fast recovery whose records Spark's JVM Kafka reader reads.

    Deprecated: :func:`fastrecover.spark.start_kafka_stream` does the same with Spark's own source and
    without a Python planning process at every start (docs/spark.md, "Which entry point").

    ``options`` are those of ``format("fastrecover")``; ``process(df, batch_id)``
    is called like a ``foreachBatch`` function with each batch's records (Spark's
    Kafka schema plus ``backfill``); ``trigger`` is passed to
    ``DataStreamWriter.trigger`` (default: as fast as possible).  Needs
    ``spark-sql-kafka-0-10`` on the classpath.  Returns the StreamingQuery.
    """
    warnings.warn(
        "fastrecover.spark.start_stream is deprecated and will be removed: use start_kafka_stream "
        "(docs/spark.md, 'Which entry point')",
        DeprecationWarning,
        stacklevel=2,
    )
    opts = parse_source_options({str(k).lower(): str(v) for k, v in options.items()})
    if not checkpoint_location:
        raise ConfigError("start_stream needs a checkpoint_location: the offset log drives every batch's read")
    planned = spark.readStream.format("fastrecover")
    for key, value in options.items():
        planned = planned.option(key, str(value))
    trace("start")
    return start_foreach_batch(
        planned.load(),
        _BatchReader(spark, opts, checkpoint_location, process),
        checkpoint_location,
        trigger,
        query_name,
    )


def start_foreach_batch(
    df: Any,
    function: Callable[[Any, int], None],
    checkpoint_location: str,
    trigger: Mapping[str, Any] | None,
    query_name: str | None,
) -> Any:
    """Start ``df`` into a ``foreachBatch`` function: ``trigger`` as DataStreamWriter takes it (default: no pause)."""
    writer = df.writeStream.foreachBatch(function).option("checkpointLocation", checkpoint_location)
    writer = writer.trigger(**(dict(trigger) if trigger else {"processingTime": "0 seconds"}))
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()
