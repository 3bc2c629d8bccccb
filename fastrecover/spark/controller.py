"""Fast recovery around Spark's own Kafka source: :func:`start_kafka_stream`.

Live records are read by ``spark.readStream.format("kafka")`` with the user's
options, so the steady state and the cost of starting a query are Spark's own:
no Python process plans batches.  Recovery happens in the driver, before
``start()``, by editing the query's checkpoint (formats in
:mod:`fastrecover.spark.checkpoint`, decisions in :mod:`fastrecover.spark.jump`):

1. If the last batch was planned but not committed (the driver died
   mid-batch), it runs first, as Spark would run it: the offsets Spark logged
   for it, its batch id, its backfill chunk, the user's function.
2. If the committed offsets lag the log end by ``fastrecover.backfill.min.offsets``
   or more, the lag ranges are journalled under ``<checkpoint>/fastrecover/jumps``
   (durably, before anything else changes), then a batch ending at the log end
   is appended to the offset and commit logs.  Spark resumes after it, with
   fresh records only.
   Not under a one-shot trigger (``once``, ``availableNow``): the journal's chunks are read first, each
   in a batch of its own, and Spark reads the lag itself.
3. Every later batch reads its *chunk* of the journalled ranges (at most
   ``maxBackfillOffsetsPerTrigger`` offsets, split into ``backfillTasks``
   tasks) with Spark's batch Kafka reader and unions it with the live records
   (column ``backfill``).  The chunk is journalled under
   ``<checkpoint>/fastrecover/chunks`` before it is read, so a replayed batch
   reads the same records.

A ``rate`` source (one row per second) is unioned into the query and dropped
before the user's function: Spark runs no batch for a stateless query without
new data, and the backlog must drain while the topic is idle.  A batch that
carries neither Kafka records nor a chunk is not passed to the user's function.

This module checks the options, builds the query and starts it.  Steps 1 and 2
are :mod:`fastrecover.spark.restart`, step 3 is :mod:`fastrecover.spark.foreach_batch`;
the checkpoint is reached through :mod:`fastrecover.spark.checkpoint_files` (its
files), :mod:`fastrecover.spark.query_log` (Spark's offset and commit logs) and
:mod:`fastrecover.spark.journal` (ours), the broker through
:mod:`fastrecover.spark.driver_jvm`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from fastrecover.errors import ConfigError
from fastrecover.spark.checkpoint_files import CheckpointFiles
from fastrecover.spark.foreach_batch import Batches
from fastrecover.spark.journal import Journal
from fastrecover.spark.jvm import start_foreach_batch
from fastrecover.spark.options import OWN_OPTIONS, SourceOptions, options_to_check, parse_source_options
from fastrecover.spark.restart import recover
from fastrecover.spark.source import trace

log = logging.getLogger("fastrecover.spark")

__all__ = ["start_kafka_stream"]

#: start_kafka_stream's ``maxBackfillOffsetsPerTrigger`` when not given: every batch pays Spark's fixed cost
#: and the sink's (about half a second with a trivial sink on 2 cores), so a lag read in small chunks drains
#: at a fraction of Spark's rate; 5M offsets are 5-15 s of reading per batch on 2 cores, less on a cluster
_DEFAULT_CHUNK = 5_000_000
#: rows per second of the idle ticker: while the topic is idle, at most one batch a second drains the backlog
_TICK_ROWS_PER_SECOND = "1"


def _kafka_reader_options(options: Mapping[str, str], location: str) -> tuple[dict[str, str], dict[str, str]]:
    """(options for Spark's streaming Kafka source, the ``kafka.*`` options for batch reads)."""
    stream = {k: str(v) for k, v in options.items() if not str(k).lower().startswith(OWN_OPTIONS)}
    client = {k: v for k, v in stream.items() if k.lower().startswith("kafka.")}
    if not any(k.lower() == "kafka.group.id" for k in client):
        # One group id for every backfill read of the query: Spark pools its executors' consumers by
        # (group id, partition), so chunks reuse them (reads assign partitions; nothing joins or commits).
        client["kafka.group.id"] = f"fastrecover-backfill-{hashlib.sha1(location.encode()).hexdigest()[:12]}"
    return stream, client


def _stream_defaults(spark: Any, given: Mapping[str, str], opts: SourceOptions) -> SourceOptions:
    """The defaults of start_kafka_stream where they differ from ``format("fastrecover")``'s.

    ``backfillTasks``: the cores Spark has (``defaultParallelism``).  Cutting a
    partition's range into more tasks than cores only adds tasks, each with a
    Kafka consumer of its own: reading 1M records on 2 cores took 1.49 s in 2
    tasks and 1.84 s in 4 (docs/spark.md).  ``maxBackfillOffsetsPerTrigger``:
    :data:`_DEFAULT_CHUNK`.  ``given`` are the user's options, lower-cased.
    """
    changes: dict[str, Any] = {}
    if "backfilltasks" not in given:
        changes["backfill_tasks"] = max(1, int(spark.sparkContext.defaultParallelism))
    if "maxbackfilloffsetspertrigger" not in given:
        changes["max_backfill"] = _DEFAULT_CHUNK
    return replace(opts, **changes)


def _ticker(spark: Any, include_headers: bool) -> Any:
    """One row a second in the Kafka source's schema, every column null: keeps batches coming while idle.

    One ``selectExpr`` (one call into the JVM) rather than a column object per field: building the
    query's DataFrame is on the path from ``start_kafka_stream`` to the first fresh record.
    """
    columns = [
        "CAST(NULL AS BINARY) AS key",
        "CAST(NULL AS BINARY) AS value",
        "CAST(NULL AS STRING) AS topic",
        "CAST(NULL AS INT) AS partition",
        "CAST(NULL AS BIGINT) AS offset",
        "timestamp",
        "CAST(NULL AS INT) AS timestampType",
    ]
    if include_headers:
        columns.append("CAST(NULL AS ARRAY<STRUCT<key: STRING, value: BINARY>>) AS headers")
    ticks = spark.readStream.format("rate").option("rowsPerSecond", _TICK_ROWS_PER_SECOND).option("numPartitions", "1")
    return ticks.load().selectExpr(*columns)


def _query_source(spark: Any, stream_options: Mapping[str, str], include_headers: bool) -> Any:
    """Spark's Kafka source with the user's options, unioned with the idle ticker (nothing is read yet)."""
    reader = spark.readStream.format("kafka")
    for key, value in stream_options.items():
        reader = reader.option(key, value)
    return reader.load().unionByName(_ticker(spark, include_headers))


def _one_shot(trigger: Mapping[str, Any] | None) -> bool:
    """Whether ``trigger`` (DataStreamWriter.trigger's keyword arguments) stops the query once it has read
    what is available: ``once`` or ``availableNow``."""
    return any(bool(trigger.get(key)) for key in ("once", "availableNow")) if trigger else False


def start_kafka_stream(
    spark: Any,
    options: Mapping[str, str],
    process: Callable[[Any, int], None],
    checkpoint_location: str,
    *,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
) -> Any:
    """Start ``process`` over Spark's own Kafka source, with fast recovery after a restart.

    ``options`` are those of Spark's Kafka source (``subscribe``,
    ``subscribePattern``, ``assign``, ``startingOffsets``, ``maxOffsetsPerTrigger``,
    ``minPartitions``, ``includeHeaders``, ``failOnDataLoss``, ``kafka.*`` ...), passed
    to it unchanged, plus ``fastrecover.backfill.min.offsets``,
    ``maxBackfillOffsetsPerTrigger`` and ``backfillTasks``.  ``process(df, batch_id)``
    is called like a ``foreachBatch`` function with Spark's Kafka schema plus a
    ``backfill`` column.  ``backfillTasks`` defaults to Spark's cores and
    ``maxBackfillOffsetsPerTrigger`` to 5,000,000 here.  The checkpoint must be
    one this function created: the recovery edits it before Spark starts
    (docs/spark.md).  Under a one-shot ``trigger`` (``once``, ``availableNow``) the
    lag is not jumped, and a backlog earlier runs left is read before Spark starts.
    Needs ``spark-sql-kafka-0-10`` on the classpath.
    Returns the StreamingQuery.

    Raises:
        ConfigError: a bad option; CheckpointError: a checkpoint file that is not what it should be.
    """
    if not checkpoint_location:
        raise ConfigError("start_kafka_stream needs a checkpoint_location: recovery edits the query's checkpoint")
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    # Ours are checked, and what Spark's options share with the recovery; the rest is Spark's to check
    # (startingTimestamp, maxTriggerDelay, ...), with its own rules, so it is left out (options_to_check).
    opts = _stream_defaults(spark, lowered, parse_source_options(options_to_check(options), query_required=False))
    stream_options, client_options = _kafka_reader_options(options, checkpoint_location)
    files = CheckpointFiles(spark, checkpoint_location)
    trace("kafka-stream checkpoint opened")
    journal = Journal(files)
    trace("kafka-stream journal loaded")
    batches = Batches(spark, opts, client_options, files, journal, process)
    # The query's DataFrame reads neither Kafka nor the checkpoint until start(): it is built on another
    # thread while the recovery waits on the file system and the broker (about 0.1 s off the restart).
    with ThreadPoolExecutor(1, thread_name_prefix="fastrecover-query") as pool:
        building = pool.submit(_query_source, spark, stream_options, opts.include_headers)
        trace("kafka-stream recover")
        recover(files, batches, journal, opts, one_shot=_one_shot(trigger))
        trace("kafka-stream recovered")
        source = building.result()
    owed = journal.owed()
    if owed:
        log.info("%s: %d backlog offsets still to read", checkpoint_location, owed)
    query = start_foreach_batch(source, batches, checkpoint_location, trigger, query_name)
    trace("kafka-stream started")
    return query
