"""Helpers of the Spark suite: building queries, reading the checkpoint, checking delivery."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from fastrecover.spark.offsets import SourceOffset, batch_pieces
from fastrecover_tools.testing.waiting import wait_for


def stream(spark: SparkSession, bootstrap: str, topic: str, store_url: str, query: str, **options: Any) -> DataFrame:
    reader = (
        spark.readStream.format("fastrecover")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("fastrecover.store.url", store_url)
        .option("fastrecover.query", query)
    )
    for key, value in options.items():
        reader = reader.option(key.replace("__", "."), str(value))
    return reader.load()


def start(df: DataFrame, sink: Sink, checkpoint: Path, *, available_now: bool = False) -> StreamingQuery:
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    trigger = {"availableNow": True} if available_now else {"processingTime": "100 milliseconds"}
    writer = writer.trigger(**trigger)
    return writer.start()


def wait_waiting_for_data(query: StreamingQuery, timeout: float = 60) -> None:
    """Until the query has planned at least once and found nothing to run (latestOffset returned start)."""

    def idle() -> bool:
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        return bool(query.status["message"] == "Waiting for data to arrive")

    wait_for(idle, timeout, 0.05, "the query to plan and wait for data")


def wait_rows(sink: Sink, query: StreamingQuery | None, count: int, timeout: float = 120) -> None:
    def enough() -> bool:
        if query is not None and query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        return sink.count() >= count

    wait_for(enough, timeout, 0.1, f"{count} rows in the sink (have {sink.count()})")


def checkpoint_offset(checkpoint: Path, batch_id: int) -> SourceOffset:
    """The source's end offset of ``batch_id`` as Spark's offset log recorded it."""
    lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
    # "v1", the batch metadata, then one line per source.
    return SourceOffset.from_json(json.loads(lines[2]))


def planned_offsets(checkpoint: Path, batch_id: int, previous: SourceOffset) -> list[tuple[int, int]]:
    """(partition, offset) pairs batch ``batch_id`` must hold, from its offsets in the checkpoint."""
    end = checkpoint_offset(checkpoint, batch_id)
    return sorted((p.partition, o) for p in batch_pieces(previous, end) for o in range(p.start, p.end))


def keys(rows: Iterable[Row]) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for r in rows)


def duplicates(rows: Iterable[Row]) -> list[tuple[int, int]]:
    return sorted(k for k, n in Counter((r.partition, r.offset) for r in rows).items() if n > 1)


@dataclass(frozen=True)
class Row:
    partition: int
    offset: int
    backfill: bool
    value: str


@dataclass
class Sink:
    """What foreachBatch saw: every attempt of every batch id, in arrival order."""

    attempts: list[tuple[int, list[Row]]] = field(default_factory=list)
    fail_batches: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [
            Row(r.partition, r.offset, r.backfill, (r.value or b"").decode())
            for r in df.select("partition", "offset", "backfill", "value").collect()
        ]
        with self.lock:
            self.attempts.append((batch_id, rows))
            if batch_id in self.fail_batches:
                self.fail_batches.discard(batch_id)
                raise RuntimeError(f"sink fails batch {batch_id} once (test)")

    def rows(self) -> list[Row]:
        with self.lock:
            return [r for _, rows in self.attempts for r in rows]

    def batches(self) -> list[tuple[int, list[Row]]]:
        with self.lock:
            return list(self.attempts)

    def count(self) -> int:
        return len(self.rows())
