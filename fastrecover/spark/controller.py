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
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import reduce
from typing import Any

from fastrecover.errors import BrokerUnavailableError, CheckpointError, ConfigError
from fastrecover.spark.checkpoint import (
    NO_OFFSET,
    OffsetLogEntry,
    is_kafka_offset,
    kafka_offsets,
    parse_journal,
    parse_offset_log,
    render_journal,
    render_kafka_offsets,
)
from fastrecover.spark.jump import (
    CHUNKS,
    JUMPS,
    check_journal,
    check_new_jump,
    chunk_for,
    jumped,
    lag_ranges,
    pending,
    task_count,
)
from fastrecover.spark.jvm import read_ranges, start_foreach_batch
from fastrecover.spark.offsets import Piece
from fastrecover.spark.options import OWN_OPTIONS, SourceOptions, options_to_check, parse_source_options
from fastrecover.spark.source import trace
from fastrecover.tokens import TopicPartitionKey

log = logging.getLogger("fastrecover.spark")

__all__ = ["start_kafka_stream"]

#: the journal's directory under the checkpoint, one subdirectory per kind of entry
_JOURNAL = "fastrecover"
_JUMPS = f"{_JOURNAL}/{JUMPS}"
_CHUNKS = f"{_JOURNAL}/{CHUNKS}"
_DEFAULT_COMMIT = 'v1\n{"nextBatchWatermarkMs":0}'
#: start_kafka_stream's ``maxBackfillOffsetsPerTrigger`` when not given: every batch pays Spark's fixed cost
#: and the sink's (about half a second with a trivial sink on 2 cores), so a lag read in small chunks drains
#: at a fraction of Spark's rate; 5M offsets are 5-15 s of reading per batch on 2 cores, less on a cluster
_DEFAULT_CHUNK = 5_000_000
#: rows per second of the idle ticker: while the topic is idle, at most one batch a second drains the backlog
_TICK_ROWS_PER_SECOND = "1"


def _jvm_view(spark: Any, *imports: str) -> Any:
    """A JVM view of its own with ``imports`` (``java_import`` names): every ``jvm.org.apache...`` step is a
    round trip to the JVM, and the recovery runs before Spark starts."""
    from py4j.java_gateway import java_import  # type: ignore[import-untyped]

    jvm = spark.sparkContext._gateway.new_jvm_view()
    for name in imports:
        java_import(jvm, name)
    return jvm


class _Checkpoint:
    """The checkpoint's files through Hadoop's FileSystem (local, HDFS, object stores alike).

    Every call here is a round trip to the JVM, on the path from ``start_kafka_stream`` to the first fresh
    record: classes are looked up once (in a JVM view of their own), and a listing costs two calls per
    file (Spark keeps 100 batches in each log by default: about 50 ms), so a restart lists one directory
    of Spark's, the offset log, and probes single files elsewhere.
    """

    def __init__(self, spark: Any, location: str) -> None:
        self._jvm = _jvm_view(spark, "org.apache.hadoop.fs.*", "org.apache.commons.io.IOUtils")
        self._root = self._jvm.Path(location)
        self._fs = self._root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        self.location = location.rstrip("/")

    def _path(self, rel: str) -> Any:
        return self._jvm.Path(self._root, rel)

    def batch_ids(self, directory: str) -> list[int]:
        """The batch ids with a file in ``directory`` (temporary and checksum files skipped)."""
        path = self._path(directory)
        if not self._fs.exists(path):
            return []
        names = [str(p.getName()) for p in self._jvm.FileUtil.stat2Paths(self._fs.listStatus(path))]
        return sorted(int(n) for n in names if n.isascii() and n.isdigit())

    def exists(self, rel: str) -> bool:
        return bool(self._fs.exists(self._path(rel)))

    def read(self, rel: str) -> str | None:
        path = self._path(rel)
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            return str(self._jvm.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def delete(self, rel: str) -> None:
        """Delete ``rel``; CheckpointError if it is still there.

        Hadoop's ``delete`` reports a failure as ``False``, not as an exception, and a journal file that
        stays would be read again: a jump kept while its chunks are deleted owes its ranges once more.
        """
        path = self._path(rel)
        if not self._fs.delete(path, False) and self._fs.exists(path):
            raise CheckpointError(
                f"cannot delete {self.location}/{rel}: the file system refused (permissions, an immutable or "
                "read-only file?); it must go before the recovery goes on, or its offsets would be read again"
            )

    def write(self, rel: str, text: str, *, replace: bool = False) -> None:
        """Write ``rel`` whole or not at all: a temporary file, then a rename (what Spark's logs do too)."""
        final = self._path(rel)
        tmp = self._path(f"{rel}.{int(time.time() * 1000)}.tmp")
        stream = self._fs.create(tmp, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()
        if self._fs.exists(final):
            if not replace:
                self._fs.delete(tmp, False)
                raise CheckpointError(f"{self.location}/{rel} exists already: another run of this query is active?")
            self.delete(rel)
        if not self._fs.rename(tmp, final):
            raise CheckpointError(f"cannot rename {tmp} to {self.location}/{rel}")


class _Journal:
    """The jumps' lag ranges and the batches' chunks, loaded once and kept in step with the files."""

    def __init__(self, files: _Checkpoint) -> None:
        self._files = files
        self.jumps = self._load(_JUMPS)
        self.chunks = self._load(_CHUNKS)

    def _load(self, directory: str) -> dict[int, list[Piece]]:
        out = {}
        for batch in self._files.batch_ids(directory):
            rel = f"{directory}/{batch}"
            out[batch] = parse_journal(self._files.read(rel) or "", f"{self._files.location}/{rel}")
        return out

    def forget(self, directory: str, batch_ids: list[int]) -> None:
        entries = self.jumps if directory == _JUMPS else self.chunks
        for batch in batch_ids:
            self._files.delete(f"{directory}/{batch}")
            entries.pop(batch, None)

    def tidy(self, last: int) -> None:
        """Drop entries no batch will read: those after ``last`` (a jump whose batch was never written),
        and, once everything journalled is read, the whole journal up to ``last``.

        Jumps go first: chunks without their ranges owe nothing, ranges without their chunks would be read
        again, so a crash between the two deletions must find the ranges gone.
        """
        for directory, entries in ((_JUMPS, self.jumps), (_CHUNKS, self.chunks)):
            self.forget(directory, [b for b in entries if b > last])
        if self.owed() == 0:
            for directory, entries in ((_JUMPS, self.jumps), (_CHUNKS, self.chunks)):
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
        self._files.write(f"{_JUMPS}/{batch_id}", render_journal(ranges), replace=True)
        self.jumps[batch_id] = ranges

    def chunk(self, batch_id: int, budget: int | None) -> list[Piece]:
        """Batch ``batch_id``'s chunk, journalled before the first read of it."""
        pieces = chunk_for(batch_id, self.jumps, self.chunks, budget)
        if pieces and batch_id not in self.chunks:
            self._files.write(f"{_CHUNKS}/{batch_id}", render_journal(pieces), replace=True)
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

    def owed(self) -> int:
        """Offsets the journalled ranges still owe after every journalled chunk."""
        ranges = [r for rs in self.jumps.values() for r in rs]
        return sum(map(len, pending(ranges, [c for cs in self.chunks.values() for c in cs])))


class _Batches:
    """The foreachBatch function: the batch's live records, its backfill chunk, the user's function."""

    def __init__(
        self,
        spark: Any,
        opts: SourceOptions,
        kafka_options: Mapping[str, str],
        files: _Checkpoint,
        journal: _Journal,
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
        """Log start or end of ``keys`` (:func:`_log_offsets`, with the query's ``kafka.*`` options)."""
        return _log_offsets(self._spark, self._kafka_options, keys, self._opts.read_timeout_s, earliest=earliest)

    def kafka_end(self, batch_id: int) -> dict[TopicPartitionKey, int]:
        if batch_id not in self._ends:
            self._ends[batch_id] = _kafka_end(*_offset_entry(self._files, batch_id))
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


def _offset_entry(files: _Checkpoint, batch_id: int) -> tuple[OffsetLogEntry, str]:
    """Spark's ``offsets/<batch_id>`` and its path (for messages)."""
    where = f"{files.location}/offsets/{batch_id}"
    text = files.read(f"offsets/{batch_id}")
    if text is None:
        raise CheckpointError(f"{where} does not exist")
    return parse_offset_log(text, where), where


#: the query is Kafka's source unioned with the idle ticker: Kafka's is the first source line
_KAFKA = 0


def _kafka_end(entry: OffsetLogEntry, where: str) -> dict[TopicPartitionKey, int]:
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


def _log_offsets(
    spark: Any, client: Mapping[str, str], keys: list[TopicPartitionKey], timeout_s: float, *, earliest: bool
) -> dict[TopicPartitionKey, int]:
    """Log start (``earliest``) or log end of ``keys``, from Kafka's Java admin client in the driver's JVM.

    Java, not librdkafka: the query's ``kafka.*`` options are Java client properties (Spark's source takes
    them so, and SASL's ``sasl.jaas.config`` has no librdkafka equivalent), and under
    ``kafka.isolation.level=read_committed`` the log end is the last stable offset, as Spark's source sees
    it.  Only the admin client's own properties are passed (the consumer's would be logged as unknown).
    """
    if not keys:
        return {}
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

    jvm = _jvm_view(
        spark,
        "org.apache.kafka.clients.admin.*",
        "org.apache.kafka.common.*",
        "java.util.*",
        "java.util.concurrent.*",
        "java.time.*",
    )
    known = jvm.AdminClientConfig.configNames()
    props = jvm.Properties()
    read_committed = False
    for key, value in client.items():
        name = key[len("kafka.") :].lower()  # Kafka's property names are lower case; Spark's options are not
        if name == "isolation.level":
            read_committed = str(value).strip().lower() == "read_committed"
        elif known.contains(name):
            props.setProperty(name, str(value))
    levels = jvm.IsolationLevel
    options = jvm.ListOffsetsOptions(levels.READ_COMMITTED if read_committed else levels.READ_UNCOMMITTED)
    spec = jvm.OffsetSpec.earliest() if earliest else jvm.OffsetSpec.latest()
    partition = jvm.TopicPartition
    partitions = {k: partition(k.topic, k.partition) for k in keys}
    request = jvm.HashMap()
    for tp in partitions.values():
        request.put(tp, spec)
    try:
        admin = jvm.AdminClient.create(props)
    except Py4JJavaError as exc:
        raise ConfigError(f"cannot create a Kafka admin client from the kafka.* options: {exc.java_exception}") from exc
    try:
        answer = admin.listOffsets(request, options).all()
        result = answer.get(int(timeout_s * 1000), jvm.TimeUnit.MILLISECONDS)
        return {k: int(result.get(tp).offset()) for k, tp in partitions.items()}
    except Py4JJavaError as exc:
        what = f"log {'start' if earliest else 'end'} of {', '.join(f'{k.topic}[{k.partition}]' for k in keys)}"
        raise BrokerUnavailableError(f"cannot read the {what}: {exc.java_exception}") from exc
    finally:
        admin.close(jvm.Duration.ofSeconds(5))


def _recover(
    files: _Checkpoint, batches: _Batches, journal: _Journal, opts: SourceOptions, *, one_shot: bool = False
) -> None:
    """Before Spark starts: finish what a dead driver left half done, then jump over the lag.

    Under a one-shot trigger (``once``, ``availableNow``) there is no jump: Spark runs only the batches
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
        if last in journal.jumps and batches.kafka_end(last) == jumped(
            batches.kafka_end(last - 1), journal.jumps[last]
        ):
            _commit(files, last)  # a jump whose commit did not land: the batch is the jump, finish it
        elif last == 0:
            _refuse_leftover_journal(files, journal, "has only batch 0, not committed")
            return  # Spark runs batch 0 itself: nothing precedes it to jump from
        else:
            journal.forget(_JUMPS, [last])  # a journal entry whose jump never happened: not this batch's
            journal.check()  # the rerun reads its chunk: not from a journal that contradicts itself
            batches.rerun(last)
            _commit(files, last)
    journal.tidy(last)
    # After the tidy: a crash while it deleted a drained journal leaves chunks without their jump, which
    # the tidy of the next start deletes; what is left must be consistent before a chunk is read from it.
    journal.check()
    trace("kafka-stream recover: tidied")
    entry, where = _offset_entry(files, last)
    if one_shot:
        _drain(files, batches, journal, last, entry)
        return
    committed = _kafka_end(entry, where)
    ends = batches.log_offsets(list(committed), earliest=False)
    trace("kafka-stream recover: log ends read")
    ranges = lag_ranges(committed, ends, opts.min_lag)
    if not ranges:
        return
    jump = last + 1
    # The ranges first: once the jump batch exists, they are the only record of these offsets.
    journal.add_jump(jump, ranges)
    trace("kafka-stream recover: jump journalled")
    offsets = entry.with_source(_KAFKA, render_kafka_offsets(jumped(committed, ranges)), int(time.time() * 1000))
    files.write(f"offsets/{jump}", offsets.render())
    trace("kafka-stream recover: offsets written")
    _commit(files, jump)
    log.info(
        "query at %s restarted %d offsets behind: batch %d jumps to the log end, the lag is read in chunks",
        files.location,
        sum(map(len, ranges)),
        jump,
    )


def _refuse_leftover_journal(files: _Checkpoint, journal: _Journal, state: str) -> None:
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


def _drain(files: _Checkpoint, batches: _Batches, journal: _Journal, last: int, entry: OffsetLogEntry) -> None:
    """Every chunk the journal owes, each in a batch of its own, before Spark starts.

    A batch here is what Spark would log for a batch without live records: the last batch's offsets
    again.  Its offset log entry is written, then its chunk is journalled and goes through the user's
    function, then its commit lands.  A crash in between leaves an uncommitted batch whose Kafka offsets
    did not move, which the next start runs again with the same chunk and batch id (step 1 of
    :func:`_recover`; a chunk depends only on the journal's earlier entries).
    """
    batch = last
    while journal.owed():
        batch += 1
        entry = entry.with_source(_KAFKA, entry.sources[_KAFKA], int(time.time() * 1000))
        files.write(f"offsets/{batch}", entry.render())
        read = batches.drain(batch)
        _commit(files, batch)
        if not read and batch - 1 not in journal.jumps:  # only the batch after a jump reads no chunk
            raise CheckpointError(f"{files.location}: the journal owes {journal.owed()} offsets but gives no chunk")
    trace("kafka-stream recover: journal drained")


def _commit(files: _Checkpoint, batch_id: int) -> None:
    """Batch ``batch_id``'s commit log entry: the previous batch's (its watermark), else Spark's default.

    The previous batch is committed whenever this is called (the commit log has no holes below the last
    batch, and batch 0 has no previous entry), so no listing of the log is needed.
    """
    text = files.read(f"commits/{batch_id - 1}") if batch_id > 0 else None
    files.write(f"commits/{batch_id}", text or _DEFAULT_COMMIT)


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
    files = _Checkpoint(spark, checkpoint_location)
    trace("kafka-stream checkpoint opened")
    journal = _Journal(files)
    trace("kafka-stream journal loaded")
    batches = _Batches(spark, opts, client_options, files, journal, process)
    # The query's DataFrame reads neither Kafka nor the checkpoint until start(): it is built on another
    # thread while the recovery waits on the file system and the broker (about 0.1 s off the restart).
    with ThreadPoolExecutor(1, thread_name_prefix="fastrecover-query") as pool:
        building = pool.submit(_query_source, spark, stream_options, opts.include_headers)
        trace("kafka-stream recover")
        _recover(files, batches, journal, opts, one_shot=_one_shot(trigger))
        trace("kafka-stream recovered")
        source = building.result()
    owed = journal.owed()
    if owed:
        log.info("%s: %d backlog offsets still to read", checkpoint_location, owed)
    query = start_foreach_batch(source, batches, checkpoint_location, trigger, query_name)
    trace("kafka-stream started")
    return query
