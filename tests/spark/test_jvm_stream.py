"""``fastrecover.spark.start_stream`` (records read by Spark's JVM Kafka reader) and the Spark option names,
end to end: real Spark (local), real broker, real store."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from fastrecover.spark import start_stream
from fastrecover.spark.offsets import SourceOffset, batch_pieces
from fastrecover_tools.testing.broker import Record, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.spark.helpers import Sink, start, stream, wait_rows

pytestmark = [pytest.mark.spark, pytest.mark.integration]

LAG = 1_000_000


def _start_stream(*args: Any, **kwargs: Any) -> Any:
    """start_stream, which warns that it is deprecated (once per call)."""
    with pytest.warns(DeprecationWarning, match="start_kafka_stream"):
        return start_stream(*args, **kwargs)


def _produce_many(bootstrap: str, topic: str, count: int, partitions: int, marker: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 500_000})
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=marker + b"%d" % i, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


class ParquetSink:
    """foreachBatch: appends (batch, partition, offset, backfill, kind) to Parquet; counts on the side.

    A million rows are checked with Spark, not collected into Python.
    """

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.lock = threading.Lock()
        self.kinds: dict[str, int] = {}
        self.batches: list[int] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = df.select(
            F.lit(batch_id).alias("batch"),
            "partition",
            "offset",
            "backfill",
            F.expr("substring(cast(value as string), 1, 1)").alias("kind"),
        ).persist()
        rows.write.mode("append").parquet(self.path)
        counts = {r["kind"]: r["n"] for r in rows.groupBy("kind").agg(F.count(F.lit(1)).alias("n")).collect()}
        rows.unpersist()
        with self.lock:
            self.batches.append(batch_id)
            for kind, n in counts.items():
                self.kinds[kind] = self.kinds.get(kind, 0) + n

    def seen(self, kind: str) -> int:
        with self.lock:
            return self.kinds.get(kind, 0)


def _offset(checkpoint: Path, batch_id: int) -> SourceOffset:
    return SourceOffset.from_json(json.loads((checkpoint / "offsets" / str(batch_id)).read_text().splitlines()[2]))


def _wait_query(query: Any, what: Callable[[], bool], timeout: float, message: str) -> None:
    def ready() -> bool:
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        return what()

    wait_for(ready, timeout, 0.1, message)


def test_a_restart_with_a_1m_lag_reads_fresh_records_first_then_the_lag_exactly_once_with_the_jvm_reader(
    spark: SparkSession, bootstrap: str, topic_factory: Any, spark_store_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    sink = ParquetSink(tmp_path / "out")
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "fastrecover.store.url": spark_store_url,
        "fastrecover.query": "jvm-restart",
        "fastrecover.backfill.min.offsets": "100",
        "maxBackfillOffsetsPerTrigger": "400000",
        "backfillTasks": "3",
        "freshWaitMs": "120000",
    }
    # The query has been running: a few records, committed.
    produce(bootstrap, topic, [Record(b"W", partition=p) for p in (0, 1) for _ in range(5)])
    query = _start_stream(spark, options, sink, str(checkpoint), trigger={"processingTime": "100 milliseconds"})
    try:
        _wait_query(query, lambda: sink.seen("W") >= 10, 120, "the warm-up records")
        query.processAllAvailable()
    finally:
        query.stop()
    before = max(sink.batches)
    # Downtime: a lag of a million records.
    _produce_many(bootstrap, topic, LAG, 2, b"L")
    query = _start_stream(spark, options, sink, str(checkpoint), trigger={"processingTime": "100 milliseconds"})
    try:
        # The recovery batch waits for a record past the jump point (freshWaitMs): fresh records arrive
        # until the sink has one (those written before the planner fixed the jump point are backfill).
        halt = threading.Event()

        def fresh() -> None:
            i = 0
            while not halt.is_set():
                produce(bootstrap, topic, [Record(b"F%d" % i, partition=i % 2)])
                i += 1
                halt.wait(0.1)

        writer = threading.Thread(target=fresh, daemon=True)
        writer.start()
        try:
            _wait_query(query, lambda: sink.seen("F") >= 1, 180, "a fresh record")
        finally:
            halt.set()
            writer.join(30)
        _wait_query(query, lambda: sink.seen("L") >= LAG, 600, "the whole lag")
        produce(bootstrap, topic, [Record(b"T", partition=0)])  # one more batch: Spark commits the last one
        _wait_query(query, lambda: sink.seen("T") >= 1, 120, "the tail record")
        query.processAllAvailable()
    finally:
        query.stop()

    rows = spark.read.parquet(sink.path)
    after = rows.where(F.col("batch") > before)
    first = after.where(F.col("batch") == before + 1)
    # The first batch after the restart holds fresh records only, none of the lag.
    first_kinds = {r["kind"]: r["n"] for r in first.groupBy("kind").agg(F.count(F.lit(1)).alias("n")).collect()}
    assert first_kinds and set(first_kinds) == {"F"}, first_kinds
    assert first.where("backfill").count() == 0
    # Every lag record once, as backfill; everything else live.
    assert after.where("kind = 'L' and backfill").count() == LAG
    assert after.where("kind = 'L' and not backfill").count() == 0
    # Exactly once over both runs: every offset of the log, no duplicate.
    totals = rows.agg(F.count(F.lit(1)).alias("n"), F.countDistinct("partition", "offset").alias("d")).first()
    watermarks = Consumer({"bootstrap.servers": bootstrap, "group.id": "jvm-restart-check"})
    try:
        log_end = {p: watermarks.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in (0, 1)}
    finally:
        watermarks.close()
    assert totals is not None and totals["n"] == totals["d"] == sum(log_end.values())
    extremes = {
        r["partition"]: (r["lo"], r["hi"])
        for r in rows.groupBy("partition").agg(F.min("offset").alias("lo"), F.max("offset").alias("hi")).collect()
    }
    assert extremes == {p: (0, end - 1) for p, end in log_end.items()}
    # Each batch holds exactly what its offsets in the checkpoint describe (replays read the same).
    backfill_batches = 0
    for batch_id in sorted(set(sink.batches)):
        if batch_id <= before:
            continue
        pieces = batch_pieces(_offset(checkpoint, batch_id - 1), _offset(checkpoint, batch_id))
        backfill_batches += any(p.backfill for p in pieces)
        assert sum(p.backfill for p in pieces) <= 2  # one range per partition at most here
        got = after.where(F.col("batch") == batch_id)
        inside = F.lit(False)
        for p in pieces:
            inside = inside | (
                (F.col("partition") == p.partition)
                & F.col("offset").between(p.start, p.end - 1)
                & (F.col("backfill") == p.backfill)
            )
        expected = sum(len(p) for p in pieces)
        assert got.count() == expected
        assert got.where(inside).count() == expected
    assert backfill_batches == 3  # 1M at 400k per trigger


def test_includeheaders_and_assign_with_the_jvm_reader(
    spark: SparkSession, bootstrap: str, topic_factory: Any, spark_store_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=2)
    produce(
        bootstrap,
        topic,
        [Record(b"v%d" % i, partition=i % 2, headers=[("h", b"%d" % i), ("h2", b"x")]) for i in range(10)],
    )
    seen: list[tuple[int, int, list[tuple[str, bytes]]]] = []

    def collect(df: DataFrame, _batch_id: int) -> None:
        for r in df.collect():
            seen.append((r.partition, r.offset, [(h.key, bytes(h.value)) for h in r.headers]))

    options = {
        "kafka.bootstrap.servers": bootstrap,
        "assign": json.dumps({topic: [1]}),
        "startingOffsets": json.dumps({topic: {"1": 2}}),
        "includeHeaders": "true",
        "fastrecover.store.url": spark_store_url,
        "fastrecover.query": "jvm-headers",
        "fastrecover.backfill.min.offsets": "1000000",
    }
    query = _start_stream(spark, options, collect, str(tmp_path / "ck"), trigger={"availableNow": True})
    query.awaitTermination(180)
    assert query.exception() is None
    # Partition 1 only, from offset 2; its records are i = 1, 3, 5, 7, 9 at offsets 0..4.
    assert sorted(seen) == [(1, o, [("h", b"%d" % (2 * o + 1)), ("h2", b"x")]) for o in range(2, 5)]


def test_spark_option_names_with_the_python_reader(
    spark: SparkSession, bootstrap: str, topic_factory: Any, spark_store_url: str, tmp_path: Path, sink: Sink
) -> None:
    """subscribePattern, startingOffsets JSON, maxOffsetsPerTrigger, minPartitions and includeHeaders."""
    first, second = topic_factory(partitions=2), topic_factory(partitions=1)
    pattern = re.escape(first[: first.rindex("-")]) + "-.*"  # both topics are named after this test
    for t in (first, second):
        produce(bootstrap, t, [Record(b"%s-%d" % (t.encode(), i), headers=[("k", b"%d" % i)]) for i in range(30)])
    df = stream(
        spark,
        bootstrap,
        first,
        spark_store_url,
        "options",
        subscribe="",
        subscribePattern=pattern,
        startingOffsets="earliest",
        maxOffsetsPerTrigger=8,
        minPartitions=3,
        includeHeaders="true",
        fastrecover__backfill__min__offsets=1_000_000,
    )
    headers: list[list[tuple[str, bytes]]] = []

    def with_headers(batch: DataFrame, batch_id: int) -> None:
        headers.extend([(h.key, bytes(h.value)) for h in r.headers] for r in batch.select("headers").collect())
        sink(batch, batch_id)

    query = start(df, with_headers, tmp_path / "ck", available_now=True)  # type: ignore[arg-type]
    query.awaitTermination(180)
    assert query.exception() is None
    wait_rows(sink, None, 60, timeout=10)
    per_batch = [len(rows) for _, rows in sink.batches() if rows]
    assert max(per_batch) <= 8 and sum(per_batch) == 60  # both topics, all records, in capped batches
    assert sorted(len(h) for h in headers) == [1] * 60
