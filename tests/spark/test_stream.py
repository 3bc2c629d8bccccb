"""``format("fastrecover")`` end to end: real Spark (local), real broker, real store."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from fastrecover.spark.offsets import SourceOffset
from fastrecover.store import open_store
from fastrecover.tokens import TokenState
from fastrecover_tools.testing.broker import Record, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.fixtures.broker import TopicFactory
from tests.spark.helpers import (
    Sink,
    checkpoint_offset,
    duplicates,
    keys,
    planned_offsets,
    start,
    stream,
    wait_rows,
    wait_waiting_for_data,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def test_restart_after_a_lag_delivers_fresh_records_first_then_the_whole_lag(
    spark: SparkSession, bootstrap: str, topic_factory: TopicFactory, spark_store_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    options = {
        "startingOffsets": "earliest",
        "fastrecover__backfill__min__offsets": 100,
        "maxBackfillOffsetsPerTrigger": 1000,
        "backfillTasks": 2,
        "freshWaitMs": 60_000,
    }
    produce(bootstrap, topic, [Record(f"early-{i}", partition=i % 2) for i in range(40)])
    before = Sink()
    query = start(stream(spark, bootstrap, topic, spark_store_url, "restart", **options), before, checkpoint)
    wait_rows(before, query, 40)
    query.processAllAvailable()  # committed: the restart does not replay the last batch
    query.stop()

    # Downtime: 3000 records arrive while the query is stopped.
    produce(bootstrap, topic, [Record(f"lag-{i}", partition=i % 2) for i in range(3000)])
    after = Sink()
    query = start(stream(spark, bootstrap, topic, spark_store_url, "restart", **options), after, checkpoint)
    try:
        # The restarted query has planned (and fixed its jump point) before any fresh record exists.
        wait_waiting_for_data(query)
        produce(bootstrap, topic, [Record(f"fresh-{i}", partition=i % 2) for i in range(30)])
        wait_rows(after, query, 3030)
        # One more batch, so Spark commits (one batch late) the batch that finished the backfill.
        produce(bootstrap, topic, [Record("tail", partition=0)])
        wait_rows(after, query, 3031)
        query.processAllAvailable()
    finally:
        query.stop()

    batches = [(bid, rows) for bid, rows in after.batches() if rows]
    first_id, first = batches[0]
    assert first, "the first batch after the restart is empty"
    assert all(r.value.startswith("fresh-") and not r.backfill for r in first), (
        f"the first batch after the restart holds lag records: {sorted({r.value for r in first})[:5]}"
    )
    lag_rows = [r for _, rows in batches[1:] for r in rows if r.value.startswith("lag-")]
    assert len(lag_rows) == 3000 and all(r.backfill for r in lag_rows)
    assert all(not r.backfill for r in after.rows() if not r.value.startswith("lag-"))
    for bid, rows in batches:
        assert sum(r.backfill for r in rows) <= 1000, f"batch {bid} exceeds maxBackfillOffsetsPerTrigger"
    # Exactly once with the checkpoint intact, and every offset of the log delivered.
    everything = before.rows() + after.rows()
    assert duplicates(everything) == []
    assert keys(everything) == [(0, o) for o in range(1536)] + [(1, o) for o in range(1535)]

    # commit() mirrored the recovered lag into the store as range tokens, now done (written off the
    # trigger loop, so give the mirror thread a moment).
    def mirrored_done() -> list[tuple[int, int, int]]:
        with open_store(spark_store_url) as store:
            tokens = store.ranges("spark-query:restart")
        done = all(t.state is TokenState.DONE for t in tokens)
        return sorted((t.partition, t.span.start, t.span.end) for t in tokens) if done else []

    assert wait_for(mirrored_done, 30, 0.2, "the store mirror") == [(0, 20, 1520), (1, 20, 1520)]
    # The batches carry exactly what their checkpointed offsets describe.
    previous = checkpoint_offset(checkpoint, first_id - 1)
    for bid, rows in after.batches():
        assert keys(rows) == planned_offsets(checkpoint, bid, previous)
        previous = checkpoint_offset(checkpoint, bid)


def test_a_task_failure_mid_batch_replays_the_same_records(
    spark: SparkSession, bootstrap: str, topic_factory: TopicFactory, spark_store_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r-{i}" for i in range(600)])
    marker = tmp_path / "failed-once"

    def fail_once_py(offset: int) -> int:
        # Runs in a Python worker: the first time offset 300 is seen, the task dies half-way.
        if offset == 300 and not marker.exists():
            marker.write_text("x")
            raise RuntimeError("injected task failure at offset 300")
        return offset

    with warnings.catch_warnings():
        # PySpark 4 reads the type hints to pick an Arrow eval type and warns that int -> int names
        # none; the UDF is a plain row-at-a-time one, as the returnType says
        warnings.filterwarnings("ignore", "Cannot infer the eval type from type hints", UserWarning)
        fail_once = F.udf(fail_once_py, returnType=LongType())

    checkpoint = tmp_path / "checkpoint"
    sink = Sink()
    df = stream(
        spark,
        bootstrap,
        topic,
        spark_store_url,
        "task-failure",
        startingOffsets="earliest",
        fastrecover__backfill__min__offsets=10_000,
        maxOffsetsPerTask=100_000,
    )
    query = start(df.withColumn("offset", fail_once("offset")), sink, checkpoint, available_now=True)
    assert query.awaitTermination(180)
    assert query.exception() is None
    assert marker.exists(), "the injected failure did not happen"
    assert duplicates(sink.rows()) == []
    assert keys(sink.rows()) == [(0, o) for o in range(600)]
    ((bid, rows),) = [(b, r) for b, r in sink.batches() if r]
    start_offset = SourceOffset.from_json({"v": 1, "topics": {topic: {"0": {"base": 0, "live": 0, "pending": []}}}})
    assert keys(rows) == planned_offsets(checkpoint, bid, start_offset)


def test_a_failed_batch_is_replayed_identically_after_a_restart_and_available_now_drains_and_stops(
    spark: SparkSession, bootstrap: str, topic_factory: TopicFactory, spark_store_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    options = {
        "startingOffsets": "latest",
        "fastrecover__backfill__min__offsets": 100,
        "maxBackfillOffsetsPerTrigger": 200,
        "backfillTasks": 2,
    }
    produce(bootstrap, topic, [Record(f"old-{i}", partition=i % 2) for i in range(10)])
    first = Sink()
    query = start(
        stream(spark, bootstrap, topic, spark_store_url, "drain", **options),
        first,
        checkpoint,
        available_now=True,
    )
    assert query.awaitTermination(120) and query.exception() is None
    assert first.rows() == []  # "latest": the 10 old records are not wanted

    # Downtime: a big lag on partition 0 (recovered), a small one on partition 1 (read live).
    produce(
        bootstrap,
        topic,
        [Record(f"lag-{i}", partition=0) for i in range(500)] + [Record(f"small-{i}", partition=1) for i in range(5)],
    )
    sink = Sink()
    df = stream(spark, bootstrap, topic, spark_store_url, "drain", **options)
    query = start(df, sink, checkpoint, available_now=True)
    assert query.awaitTermination(120) and query.exception() is None
    batches = [(b, rows) for b, rows in sink.batches() if rows]
    assert sorted(r.value for r in batches[0][1]) == [f"small-{i}" for i in range(5)]
    assert all(r.backfill for _, rows in batches[1:] for r in rows)
    assert len(batches) == 4  # the live batch, then 500 lag records in batches of at most 200
    assert keys(sink.rows()) == [(0, o) for o in range(5, 505)] + [(1, o) for o in range(5, 10)]

    # A batch whose sink fails is replayed with exactly the same records once the query restarts.
    produce(bootstrap, topic, [Record(f"lag2-{i}", partition=0) for i in range(500)])
    failing = Sink()
    ids = {b for b, _ in sink.batches()}
    failing.fail_batches = {max(ids) + 2}
    query = start(
        stream(spark, bootstrap, topic, spark_store_url, "drain", **options),
        failing,
        checkpoint,
        available_now=True,
    )
    with pytest.raises(StreamingQueryException, match="sink fails batch"):
        query.awaitTermination(120)
    replay = Sink()
    query = start(
        stream(spark, bootstrap, topic, spark_store_url, "drain", **options),
        replay,
        checkpoint,
        available_now=True,
    )
    assert query.awaitTermination(120) and query.exception() is None
    failed_id, failed_rows = failing.batches()[-1]
    replayed = dict(replay.batches())
    assert keys(replayed[failed_id]) == keys(failed_rows) and failed_rows
    delivered = [r for b, rows in failing.batches()[:-1] for r in rows] + replay.rows()
    assert duplicates(delivered) == []
    assert keys(delivered) == [(0, o) for o in range(505, 1005)]
