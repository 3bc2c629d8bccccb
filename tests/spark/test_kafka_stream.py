"""``fastrecover.spark.start_kafka_stream`` (Spark's own Kafka source, recovery by the driver), end to end:
real Spark (local), real broker, a real checkpoint on disk."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from fastrecover.errors import CheckpointError
from fastrecover.spark import start_kafka_stream
from fastrecover.spark.checkpoint import parse_journal
from fastrecover_tools.testing.broker import Record, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.spark.helpers import Sink
from tests.spark.test_jvm_stream import ParquetSink, _produce_many

pytestmark = [pytest.mark.spark, pytest.mark.integration]

TRIGGER = {"processingTime": "100 milliseconds"}


def _log_end(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kafka-stream-check"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        c.close()


def _batch_ids(directory: Path) -> list[int]:
    """The batch ids with a file in a checkpoint directory (checksum and temporary files skipped)."""
    return [int(f.name) for f in directory.iterdir() if f.name.isdigit()]


def _wait(query: Any, what: Any, timeout: float, message: str) -> None:
    def ready() -> bool:
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        return bool(what())

    wait_for(ready, timeout, 0.1, message)


def _options(bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "fastrecover.backfill.min.offsets": "100",
        **extra,
    }


def _kinds(sink: Sink, batches: set[int] | None = None) -> Counter[str]:
    return Counter(r.value[:1] for b, rows in sink.batches() if batches is None or b in batches for r in rows)


def _run(
    spark: SparkSession,
    options: dict[str, str],
    process: Callable[[Any, int], None],
    checkpoint: Path,
    until: Callable[[], object],
    timeout: float,
    what: str,
    *,
    then: Callable[[], object] | None = None,
) -> None:
    """A continuous run until ``until()`` holds and everything available is processed, then stopped.
    ``then()`` runs once the query has started (records produced after a restart)."""
    query = start_kafka_stream(spark, options, process, str(checkpoint), trigger=TRIGGER)
    try:
        if then is not None:
            then()
        _wait(query, until, timeout, what)
        query.processAllAvailable()
    finally:
        query.stop()


def _warm_up(
    spark: SparkSession, bootstrap: str, topic: str, options: dict[str, str], sink: Sink, checkpoint: Path
) -> None:
    """A first run that reads 4 records and commits: the checkpoint sits at the log end."""
    produce(bootstrap, topic, [Record(b"W%d" % i, partition=i % 2) for i in range(4)])
    _run(spark, options, sink, checkpoint, lambda: _kinds(sink)["W"] >= 4, 120, "the warm-up records")


def _run_until_failure(
    spark: SparkSession,
    options: dict[str, str],
    sink: Sink,
    checkpoint: Path,
    batch: int,
    *,
    then: Callable[[], object] | None = None,
) -> None:
    """A continuous run whose batch ``batch`` fails (once) in the user's function, which stops the query
    with that batch uncommitted.  ``then()`` runs once the query has started."""
    sink.fail_batches.add(batch)
    query = start_kafka_stream(spark, options, sink, str(checkpoint), trigger=TRIGGER)
    try:
        if then is not None:
            then()
        wait_for(lambda: query.exception() is not None, 180, 0.1, "the failing batch to stop the query")
    finally:
        query.stop()


def test_a_restart_jumps_to_the_log_end_and_the_lag_drains_in_chunks_while_the_topic_is_idle(
    spark: SparkSession,
    bootstrap: str,
    topic_factory: Any,
    tmp_path: Path,
    sink: Sink,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    options = _options(bootstrap, topic, maxBackfillOffsetsPerTrigger="700", backfillTasks="3")
    produce(bootstrap, topic, [Record(b"W%d" % i, partition=i % 2) for i in range(10)])
    _run(spark, options, sink, checkpoint, lambda: _kinds(sink)["W"] >= 10, 120, "the warm-up records")
    before = max(_batch_ids(checkpoint / "offsets"))
    # Downtime: 2,000 records of lag; then the restart, and a handful of fresh records, then silence.
    produce(bootstrap, topic, [Record(b"L%d" % i, partition=i % 2) for i in range(2000)])
    # The fresh records (then) are the last produced: the idle ticker keeps batches, and the chunks, coming.
    _run(
        spark,
        options,
        sink,
        checkpoint,
        lambda: _kinds(sink)["L"] >= 2000 and _kinds(sink)["F"] >= 4,
        180,
        "the lag and fresh records",
        then=lambda: produce(bootstrap, topic, [Record(b"F%d" % i, partition=i % 2) for i in range(4)]),
    )

    after = [(b, rows) for b, rows in sink.batches() if b > before]
    jump = before + 1
    assert (checkpoint / "fastrecover" / "jumps" / str(jump)).exists()
    assert all(b > jump for b, _ in after)  # the jump batch itself never reaches the user's function
    # The first batch after the jump reads no chunk (fresh records, when they came in time, go first); the lag
    # comes as backfill from the next batch on, 700 offsets per batch at most.
    assert not any(r.backfill for b, rows in after if b == jump + 1 for r in rows)
    assert not (checkpoint / "fastrecover" / "chunks" / str(jump + 1)).exists()
    lag_rows = [r for _, rows in after for r in rows if r.value.startswith("L")]
    assert all(r.backfill for r in lag_rows) and not any(
        r.backfill for _, rows in after for r in rows if r.value[0] != "L"
    )
    per_batch = [sum(r.backfill for r in rows) for _, rows in after]
    assert max(per_batch) <= 700 and sum(1 for n in per_batch if n) == 3  # 2,000 at 700 per trigger
    # No ticker row reaches the user; every offset of the log once over both runs.
    rows = sink.rows()
    assert all(r.value for r in rows)
    ends = _log_end(bootstrap, topic, 2)
    assert sorted((r.partition, r.offset) for r in rows) == [(p, o) for p in (0, 1) for o in range(ends[p])]
    # The journal: the chunks are the jump's ranges, cut in order.
    ranges = parse_journal((checkpoint / "fastrecover" / "jumps" / str(jump)).read_text(), "jumps")
    chunks = [
        p
        for f in sorted((checkpoint / "fastrecover" / "chunks").iterdir(), key=lambda f: f.name)
        if f.name.isdigit()
        for p in parse_journal(f.read_text(), f.name)
    ]
    assert {(r.partition, r.start, r.end) for r in ranges} == {(0, 5, 1005), (1, 5, 1005)}
    assert sum(len(c) for c in chunks) == 2000
    # The drain's progress, a line per chunk: offsets read and still owed.
    progress = [
        r.getMessage().split(": ", 1)[1]
        for r in caplog.records
        if r.name == "fastrecover.spark" and "backlog offsets in" in r.getMessage()
    ]
    assert [(p.split()[3], p.rsplit(";", 1)[1].split()[0]) for p in progress] == [
        ("700", "1300"),
        ("700", "600"),
        ("600", "0"),
    ], progress


def test_a_batch_left_uncommitted_runs_again_with_the_same_records_before_the_jump(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path, sink: Sink
) -> None:
    """The driver died inside the user's function of a batch carrying live records and a chunk."""
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    options = _options(bootstrap, topic, maxBackfillOffsetsPerTrigger="300")
    _warm_up(spark, bootstrap, topic, options, sink, checkpoint)
    produce(bootstrap, topic, [Record(b"L%d" % i, partition=i % 2) for i in range(1000)])
    # The restart jumps at the next batch id; the batch after the next one reads the first chunk, and fails
    # (once): the query stops with that batch uncommitted.
    jump = max(_batch_ids(checkpoint / "offsets")) + 1
    fresh = [Record(b"F0", partition=0)]
    _run_until_failure(spark, options, sink, checkpoint, jump + 2, then=lambda: produce(bootstrap, topic, fresh))
    failed = jump + 2
    first_attempt = sorted((r.partition, r.offset) for b, rows in sink.batches() if b == failed for r in rows)
    assert first_attempt and not (checkpoint / "commits" / str(failed)).exists()
    produce(bootstrap, topic, [Record(b"M%d" % i, partition=i % 2) for i in range(500)])  # more downtime
    _run(
        spark,
        options,
        sink,
        checkpoint,
        lambda: _kinds(sink)["M"] >= 500 and _kinds(sink)["G"] >= 2,
        180,
        "everything",
        then=lambda: produce(bootstrap, topic, [Record(b"G%d" % i, partition=i % 2) for i in range(2)]),
    )
    attempts = [sorted((r.partition, r.offset) for r in rows) for b, rows in sink.batches() if b == failed]
    assert attempts == [first_attempt, first_attempt]  # the rerun read exactly what the failed attempt read
    # A second jump (the 500 records of the second downtime) and the first's remaining chunks both drained.
    assert len(_batch_ids(checkpoint / "fastrecover" / "jumps")) == 2
    delivered = [(r.partition, r.offset) for b, rows in sink.batches() if b != failed for r in rows] + first_attempt
    ends = _log_end(bootstrap, topic, 2)
    assert sorted(delivered) == [(p, o) for p in (0, 1) for o in range(ends[p])]


def _owed(checkpoint: Path) -> int:
    """Offsets the checkpoint's journal still owes: the jumps' ranges minus the chunks journalled so far."""

    def total(directory: str) -> int:
        folder = checkpoint / "fastrecover" / directory
        files = [f for f in folder.iterdir() if f.name.isdigit()] if folder.exists() else []
        return sum(len(piece) for f in files for piece in parse_journal(f.read_text(), f.name))

    return total("jumps") - total("chunks")


def test_a_one_shot_trigger_reads_the_journal_first_and_jumps_nothing(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path, sink: Sink
) -> None:
    """Under availableNow Spark runs only batches with live records, and the batch after a jump reads no
    chunk: a jumped lag, or one an earlier continuous run left owed, must still be read, once."""
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    options = _options(bootstrap, topic, maxBackfillOffsetsPerTrigger="400")
    _warm_up(spark, bootstrap, topic, options, sink, checkpoint)
    # A continuous run jumps 4,000 offsets of lag; its second chunk batch fails (once), which stops it with
    # 800 of the 4,000 offsets journalled as chunks and the second chunk's batch uncommitted.
    produce(bootstrap, topic, [Record(b"L%d" % i, partition=i % 2) for i in range(4000)])
    jump = max(_batch_ids(checkpoint / "offsets")) + 1
    _run_until_failure(spark, options, sink, checkpoint, jump + 3)
    assert _batch_ids(checkpoint / "fastrecover" / "jumps") == [jump] and _owed(checkpoint) == 3200
    # More downtime, then a one-shot run: it runs the failed batch again, then a batch of the backlog alone,
    # then fails in the next one (as if the driver died there).
    produce(bootstrap, topic, [Record(b"M%d" % i, partition=i % 2) for i in range(500)])
    sink.fail_batches.add(jump + 5)
    with pytest.raises(Exception, match="fails batch"):
        start_kafka_stream(spark, options, sink, str(checkpoint), trigger={"availableNow": True})
    assert not (checkpoint / "commits" / str(jump + 5)).exists()
    query = start_kafka_stream(spark, options, sink, str(checkpoint), trigger={"availableNow": True})
    assert query.awaitTermination(180), "the availableNow run did not stop"
    assert query.exception() is None, query.exception()

    # No jump in the one-shot runs, and the journal owes nothing now.
    assert _batch_ids(checkpoint / "fastrecover" / "jumps") == [jump] and _owed(checkpoint) == 0
    # Each failed batch ran again with exactly the records of its first attempt.
    attempts = {
        b: [sorted((r.partition, r.offset) for r in rows) for c, rows in sink.batches() if c == b]
        for b in (jump + 3, jump + 5)
    }
    assert all(len(a) == 2 and a[0] and a[0] == a[1] for a in attempts.values()), attempts
    # The backlog came first, in batches of its own (no live record, at most 400 offsets each); then Spark
    # read the second downtime's records itself, live.
    after = [(b, rows) for b, rows in sink.batches() if b > jump + 3]
    backlog = [b for b, rows in after if rows and all(r.backfill for r in rows)]
    live = [b for b, rows in after if any(not r.backfill for r in rows)]
    assert backlog and live and max(backlog) < min(live)
    assert all(len(rows) <= 400 for b, rows in after if b in backlog)
    assert all(not r.backfill for b, rows in after if b in live for r in rows if r.value.startswith("M"))
    # Every offset of the log once over all runs (each failed batch counted once).
    runs = Counter(b for b, _ in sink.batches())
    assert {b for b, n in runs.items() if n != 1} == {jump + 3, jump + 5} and max(runs.values()) == 2
    once = {b: rows for b, rows in sink.batches()}  # one attempt of each batch id
    delivered = [(r.partition, r.offset) for rows in once.values() for r in rows]
    ends = _log_end(bootstrap, topic, 2)
    assert sorted(delivered) == [(p, o) for p in (0, 1) for o in range(ends[p])]


def _stop_after_the_jump(spark: SparkSession, options: dict[str, str], sink: Sink, checkpoint: Path) -> int:
    """A continuous run stopped before Spark planned a batch after its jump: the checkpoint ends at the
    committed jump.  Its trigger does not come back, and the first one finds nothing new (the lag is behind
    the jump, the ticker has no row yet).  Returns the jump's batch id."""
    jump = max(_batch_ids(checkpoint / "offsets")) + 1
    query = start_kafka_stream(spark, options, sink, str(checkpoint), trigger={"processingTime": "1 hour"})
    query.stop()
    assert max(_batch_ids(checkpoint / "offsets")) == jump and (checkpoint / "commits" / str(jump)).exists()
    assert (checkpoint / "fastrecover" / "jumps" / str(jump)).exists()
    return jump


def test_a_one_shot_start_right_after_a_committed_jump_reads_the_whole_jumped_lag(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path, sink: Sink
) -> None:
    """The batch after a jump reads no chunk: a one-shot run that starts there runs it empty, then the
    chunks, then lets Spark read the new lag (the path of ``_drain`` whose first batch reads nothing)."""
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    options = _options(bootstrap, topic, maxBackfillOffsetsPerTrigger="400")
    _warm_up(spark, bootstrap, topic, options, sink, checkpoint)
    produce(bootstrap, topic, [Record(b"L%d" % i, partition=i % 2) for i in range(1000)])
    jump = _stop_after_the_jump(spark, options, sink, checkpoint)
    assert _owed(checkpoint) == 1000 and not any(b >= jump for b, _ in sink.batches())
    produce(bootstrap, topic, [Record(b"M%d" % i, partition=i % 2) for i in range(300)])  # more downtime

    query = start_kafka_stream(spark, options, sink, str(checkpoint), trigger={"availableNow": True})
    assert query.awaitTermination(180), "the availableNow run did not stop"
    assert query.exception() is None, query.exception()

    # The batch after the jump ran empty (logged and committed, nothing for the user's function); the 1,000
    # jumped offsets came next, at most 400 per batch of their own; Spark read the new lag after them.
    assert (checkpoint / "commits" / str(jump + 1)).exists()
    assert not (checkpoint / "fastrecover" / "chunks" / str(jump + 1)).exists()
    after = [(b, rows) for b, rows in sink.batches() if b > jump]
    backlog = [b for b, rows in after if rows and all(r.backfill for r in rows)]
    live = [b for b, rows in after if any(not r.backfill for r in rows)]
    assert backlog == [jump + 2, jump + 3, jump + 4] and live and max(backlog) < min(live)
    assert [len(rows) for b, rows in after if b in backlog] == [400, 400, 200]
    assert all(r.value.startswith("L") for b, rows in after if b in backlog for r in rows)
    assert _kinds(sink, set(live)) == Counter({"M": 300})
    # No second jump, nothing owed, no batch run twice, and every offset of the log exactly once.
    assert _batch_ids(checkpoint / "fastrecover" / "jumps") == [jump] and _owed(checkpoint) == 0
    assert max(Counter(b for b, _ in sink.batches()).values()) == 1
    ends = _log_end(bootstrap, topic, 2)
    assert sorted((r.partition, r.offset) for r in sink.rows()) == [(p, o) for p in (0, 1) for o in range(ends[p])]


def test_includeheaders_assign_and_a_new_query_start_as_spark_s_source(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=2)
    produce(
        bootstrap,
        topic,
        [Record(b"v%d" % i, partition=i % 2, headers=[("h", b"%d" % i)]) for i in range(10)],
    )
    seen: list[tuple[int, int, list[tuple[str, bytes]]]] = []
    lock = threading.Lock()

    def collect(df: Any, _batch_id: int) -> None:
        rows = df.collect()
        with lock:
            seen.extend((r.partition, r.offset, [(h.key, bytes(h.value)) for h in r.headers]) for r in rows)

    options = {
        "kafka.bootstrap.servers": bootstrap,
        "assign": json.dumps({topic: [1]}),
        "startingOffsets": json.dumps({topic: {"1": 2}}),
        "includeHeaders": "true",
    }
    _run(spark, options, collect, tmp_path / "ck", lambda: len(seen) >= 3, 120, "partition 1 from offset 2")
    # Partition 1 only, from offset 2; its records are i = 1, 3, 5, 7, 9 at offsets 0..4.
    assert sorted(seen) == [(1, o, [("h", b"%d" % (2 * o + 1))]) for o in range(2, 5)]


LAG = 1_000_000


def test_a_restart_with_a_1m_lag_delivers_fresh_records_first_and_the_lag_once(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    sink = ParquetSink(tmp_path / "out")
    options = _options(bootstrap, topic, maxBackfillOffsetsPerTrigger="400000", backfillTasks="3")
    produce(bootstrap, topic, [Record(b"W", partition=p) for p in (0, 1) for _ in range(5)])
    _run(spark, options, sink, checkpoint, lambda: sink.seen("W") >= 10, 120, "the warm-up records")
    before = max(_batch_ids(checkpoint / "offsets"))
    _produce_many(bootstrap, topic, LAG, 2, b"L")
    _run(
        spark,
        options,
        sink,
        checkpoint,
        lambda: sink.seen("L") >= LAG and sink.seen("F") >= 2,
        600,
        "the lag and the fresh records",
        then=lambda: produce(bootstrap, topic, [Record(b"F", partition=p) for p in (0, 1)]),
    )
    rows = spark.read.parquet(sink.path)
    after = rows.where(F.col("batch") > before)
    # Fresh records produced after the restart are never backfill; the first batch after the jump reads no chunk.
    assert after.where("kind = 'F' and backfill").count() == 0
    assert after.where(F.col("batch") == before + 2).where("backfill").count() == 0
    assert after.where("kind = 'L' and backfill").count() == LAG
    assert after.where("kind = 'L' and not backfill").count() == 0
    totals = rows.agg(F.count(F.lit(1)).alias("n"), F.countDistinct("partition", "offset").alias("d")).first()
    ends = _log_end(bootstrap, topic, 2)
    assert totals is not None and totals["n"] == totals["d"] == sum(ends.values())
    chunk_batches = after.where("backfill").select("batch").distinct().count()
    assert chunk_batches == 3  # 1M at 400k per trigger


def test_a_checkpoint_of_another_query_is_refused_and_left_as_it_was(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path
) -> None:
    """Jumping a plain Kafka query's checkpoint would leave its lag in a journal that query never reads."""
    topic = topic_factory(partitions=1)
    checkpoint = tmp_path / "plain"
    produce(bootstrap, topic, [Record(b"W%d" % i) for i in range(3)])
    plain = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(lambda _df, _id: None)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    plain.awaitTermination(120)
    assert plain.exception() is None
    produce(bootstrap, topic, [Record(b"L%d" % i) for i in range(500)])
    before = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*"))
    with pytest.raises(CheckpointError, match="not created by start_kafka_stream"):
        start_kafka_stream(spark, _options(bootstrap, topic), lambda _df, _id: None, str(checkpoint))
    assert sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*")) == before


def test_a_jump_cut_short_by_a_crash_is_redone_or_finished_and_nothing_is_lost(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path, sink: Sink
) -> None:
    """The two crash windows of a jump: after its journal entry, and after its offset log entry."""
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    jumps = checkpoint / "fastrecover" / "jumps"
    options = _options(bootstrap, topic, maxBackfillOffsetsPerTrigger="100000")

    def last_batch() -> int:
        return max(_batch_ids(checkpoint / "offsets"))

    def run(until: Any, what: str) -> None:
        _run(spark, options, sink, checkpoint, until, 180, what)

    produce(bootstrap, topic, [Record(b"W%d" % i, partition=i % 2) for i in range(4)])
    run(lambda: _kinds(sink)["W"] >= 4, "the warm-up records")
    # 1. The driver died right after journalling a jump: the entry names ranges no batch skipped.
    produce(bootstrap, topic, [Record(b"L%d" % i, partition=i % 2) for i in range(400)])
    stale = last_batch() + 1
    jumps.mkdir(parents=True, exist_ok=True)
    (jumps / str(stale)).write_text(json.dumps({"version": 1, "ranges": [[topic, 0, 0, 3]]}))
    run(lambda: _kinds(sink)["L"] >= 400, "the lag after a half-written jump")
    redone = parse_journal((jumps / str(stale)).read_text(), "jumps")
    assert {(p.partition, p.start, p.end) for p in redone} == {(0, 2, 202), (1, 2, 202)}
    # 2. The driver died after the jump's offset log entry, before its commit entry.
    produce(bootstrap, topic, [Record(b"M%d" % i, partition=i % 2) for i in range(400)])
    jump = _stop_after_the_jump(spark, options, sink, checkpoint)
    (checkpoint / "commits" / str(jump)).unlink()
    (checkpoint / "commits" / f".{jump}.crc").unlink(missing_ok=True)
    produce(bootstrap, topic, [Record(b"G%d" % i, partition=i % 2) for i in range(2)])
    run(lambda: _kinds(sink)["M"] >= 400 and _kinds(sink)["G"] >= 2, "the lag after a half-written jump commit")
    assert (checkpoint / "commits" / str(jump)).exists()
    ends = _log_end(bootstrap, topic, 2)
    assert sorted((r.partition, r.offset) for r in sink.rows()) == [(p, o) for p in (0, 1) for o in range(ends[p])]


def test_spark_s_own_options_pass_through_subscribepattern_and_maxoffsetspertrigger(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path, sink: Sink
) -> None:
    """Options are Spark's source's, unchanged: a Java pattern over two topics, batches capped at 8 offsets,
    and a ``kafka.group.id`` of the application's (format("fastrecover") refuses it; Spark's source takes it)."""
    first, second = topic_factory(partitions=2), topic_factory(partitions=1)
    pattern = first[: first.rindex("-")] + "-.*"  # both topics are named after this test (no dots)
    for t in (first, second):
        produce(bootstrap, t, [Record(b"%s-%d" % (t.encode(), i)) for i in range(30)])
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribePattern": pattern,
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "8",
        "minPartitions": "3",
        "kafka.group.id": f"{first}-application",
    }
    _run(spark, options, sink, tmp_path / "ck", lambda: sink.count() >= 60, 180, "both topics")
    per_batch = [len(rows) for _, rows in sink.batches() if rows]
    assert max(per_batch) <= 8 and sum(per_batch) == 60
    assert Counter(r.value.rsplit("-", 1)[0] for r in sink.rows()) == {first: 30, second: 30}


def test_the_jump_reads_log_bounds_with_the_java_client_as_spark_s_source_sees_them(
    spark: SparkSession, bootstrap: str, topic_factory: Any
) -> None:
    """Log start after deleted records, log end, and the last stable offset under read_committed, read by
    the driver's Java admin client from ``kafka.*`` options (Java names, as Spark's source takes them)."""
    import uuid

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from fastrecover.errors import BrokerUnavailableError
    from fastrecover.spark.driver_jvm import list_log_offsets
    from fastrecover.tokens import TopicPartitionKey

    topic = topic_factory(partitions=2)
    produce(bootstrap, topic, [Record(b"v%d" % i, partition=i % 2) for i in range(20)])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures complete only while it lives
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=1)
    producer.flush(30)  # in the log, not committed: beyond the last stable offset
    keys = [TopicPartitionKey(topic, 0), TopicPartitionKey(topic, 1)]
    client = {"kafka.bootstrap.servers": bootstrap, "kafka.group.id": "ignored-by-the-admin-client"}
    try:
        assert list_log_offsets(spark, client, keys, 30, earliest=True) == {keys[0]: 4, keys[1]: 0}
        assert list_log_offsets(spark, client, keys, 30, earliest=False) == {keys[0]: 10, keys[1]: 11}
        committed_only = {**client, "kafka.isolation.level": "read_committed"}
        assert list_log_offsets(spark, committed_only, keys, 30, earliest=False) == {keys[0]: 10, keys[1]: 10}
    finally:
        producer.abort_transaction(30)
    with pytest.raises(BrokerUnavailableError, match=r"log end of .*\[0\]"):
        list_log_offsets(spark, {"kafka.bootstrap.servers": "127.0.0.1:1"}, keys, 2, earliest=False)


# -- checkpoints written by hand: what recovery refuses before it reads or writes anything -------------


def _offsets_text(topic: str, offset: int) -> str:
    """An offset log entry as Spark writes it for this query: Kafka's line, then the idle ticker's."""
    return f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{{}}}}\n{{"{topic}":{{"0":{offset}}}}}\n7'


def _journal_text(topic: str, *spans: tuple[int, int]) -> str:
    return json.dumps({"version": 1, "ranges": [[topic, 0, start, end] for start, end in spans]})


def _handmade(root: Path, files: dict[str, str]) -> dict[str, str]:
    """Write ``files`` (path under ``root`` -> text); returns what the checkpoint holds, to compare later."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return _contents(root)


def _contents(root: Path) -> dict[str, str]:
    return {str(f.relative_to(root)): f.read_text() for f in root.rglob("*") if f.is_file()}


def _committed_at(topic: str, batch: int, offset: int) -> dict[str, str]:
    return {f"offsets/{batch}": _offsets_text(topic, offset), f"commits/{batch}": 'v1\n{"nextBatchWatermarkMs":0}'}


def test_a_journal_left_without_its_offset_log_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    """offsets/ and commits/ deleted, fastrecover/ kept: a new query would read the old journal's chunks
    and ranges again (the review's stale_and_overlap.py, part a)."""
    checkpoint = tmp_path / "checkpoint"
    before = _handmade(
        checkpoint,
        {
            "fastrecover/jumps/2": _journal_text("t", (0, 100)),
            "fastrecover/chunks/4": _journal_text("t", (0, 10)),
            "offsets/.gitkeep": "",
        },
    )
    options = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    with pytest.raises(
        CheckpointError, match=rf"{checkpoint}/fastrecover holds a journal.*delete {checkpoint}/fastrecover too"
    ):
        start_kafka_stream(spark, options, lambda _df, _id: None, str(checkpoint))
    assert _contents(checkpoint) == before


@pytest.mark.parametrize(
    ("journal", "named"),
    [
        ({"jumps/2": [(0, 100)], "jumps/4": [(50, 150)]}, ["jumps/2", "jumps/4"]),
        ({"jumps/2": [(0, 100)], "chunks/4": [(0, 30)], "chunks/5": [(20, 40)]}, ["chunks/4", "chunks/5"]),
        ({"jumps/2": [(0, 100)], "chunks/4": [(90, 120)]}, ["chunks/4", "jumps/2"]),
    ],
)
def test_journal_entries_that_contradict_each_other_are_refused_before_anything_is_read(
    spark: SparkSession, tmp_path: Path, journal: dict[str, list[tuple[int, int]]], named: list[str]
) -> None:
    checkpoint = tmp_path / "checkpoint"
    files = {f"fastrecover/{rel}": _journal_text("t", *spans) for rel, spans in journal.items()}
    before = _handmade(checkpoint, {**_committed_at("t", 5, 500), **files})
    options = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    with pytest.raises(CheckpointError) as error:
        start_kafka_stream(spark, options, lambda _df, _id: None, str(checkpoint))
    assert all(f"{checkpoint}/fastrecover/{name}" in str(error.value) for name in named), str(error.value)
    assert _contents(checkpoint) == before


def test_a_lag_over_a_range_the_journal_still_owes_is_refused_as_a_re_created_topic(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path
) -> None:
    """Spark's committed offset is inside a journalled range: Kafka's offsets went back while the query was
    down (a topic deleted and re-created).  The new lag must not be journalled over the old range."""
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [Record(b"R%d" % i, partition=0) for i in range(300)])
    checkpoint = tmp_path / "checkpoint"
    before = _handmade(
        checkpoint, {**_committed_at(topic, 5, 10), "fastrecover/jumps/3": _journal_text(topic, (0, 100))}
    )
    with pytest.raises(CheckpointError, match=rf"jumps/3 .*{topic}\[0\] offsets 10-300.*deleted and re-created"):
        start_kafka_stream(spark, _options(bootstrap, topic), lambda _df, _id: None, str(checkpoint))
    assert _contents(checkpoint) == before  # no jump journalled, no batch written


@contextmanager
def _undeletable(path: Path) -> Iterator[None]:
    """``path`` cannot be deleted meanwhile: its directory read-only, or, for root (whom permissions do
    not stop), the file immutable."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        mode = path.parent.stat().st_mode
        path.parent.chmod(0o555)
        try:
            yield
        finally:
            path.parent.chmod(mode)


def test_a_journal_file_the_file_system_keeps_stops_the_recovery(spark: SparkSession, tmp_path: Path) -> None:
    """A drained journal is deleted, jumps first: a jump that stays while its chunks go would owe its
    ranges again, so a delete Hadoop reports as failed (``False``) is an error."""
    checkpoint = tmp_path / "checkpoint"
    files = {
        **_committed_at("t", 5, 500),
        "fastrecover/jumps/3": _journal_text("t", (0, 100)),
        "fastrecover/chunks/5": _journal_text("t", (0, 100)),
    }
    before = _handmade(checkpoint, files)
    options = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    refused = pytest.raises(CheckpointError, match=rf"cannot delete {checkpoint}/fastrecover/jumps/3")
    with _undeletable(checkpoint / "fastrecover" / "jumps" / "3"), refused:
        start_kafka_stream(spark, options, lambda _df, _id: None, str(checkpoint))
    assert _contents(checkpoint) == before  # the chunks are still there: nothing is owed twice


# -- Spark's options, unchanged ------------------------------------------------------------------------


def test_a_new_query_starts_where_spark_s_startingoffsetsbytimestamp_says(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path, sink: Sink
) -> None:
    """A Spark option fastrecover's own source does not have goes to Spark's source, which honours it."""
    topic = topic_factory(partitions=2)
    base = int(time.time() * 1000) - 60_000
    produce(
        bootstrap,
        topic,
        [Record(b"p%d-%d" % (p, i), partition=p, timestamp_ms=base + 1000 * i) for p in (0, 1) for i in range(10)],
    )
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        # partition 0 from the record of time base+5s (offset 5), partition 1 from base+2s (offset 2)
        "startingOffsetsByTimestamp": json.dumps({topic: {"0": base + 5000, "1": base + 1500}}),
        "startingOffsetsByTimestampStrategy": "error",
    }
    _run(spark, options, sink, tmp_path / "ck", lambda: sink.count() >= 13, 120, "the records from the timestamps on")
    assert sorted((r.partition, r.offset) for r in sink.rows()) == [(0, o) for o in range(5, 10)] + [
        (1, o) for o in range(2, 10)
    ]
