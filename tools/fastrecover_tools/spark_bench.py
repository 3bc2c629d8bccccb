"""Benchmark: Spark's built-in Kafka source vs ``format("fastrecover")`` after the same downtime.

For each lag and repeat, and for each source, on a fresh topic:

1. a query runs once (startingOffsets=latest) so its checkpoint sits at the
   log end, and stops;
2. downtime: ``lag`` records are produced;
3. the query restarts from its checkpoint while a producer writes fresh
   records at a steady rate, and a foreachBatch sink counts lag and fresh
   records per batch.

Measured from the restart (``start()`` call): the time until the sink has
finished a batch holding a fresh record, and the time until it has every lag
record.  Spark's Kafka source is ``spark-sql-kafka-0-10`` at the PySpark
version, resolved from Maven Central through ``spark.jars.packages``.

``run_spark_bench`` is what ``fastrecover bench --spark`` calls;
``python -m fastrecover_tools.spark_bench`` runs it stand-alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

log = logging.getLogger("fastrecover.spark")

SOURCES = ("spark-kafka", "fastrecover")
SINKS = ("count", "parquet", "python-udf")
PARTITIONS = 2
FRESH_RATE = 500  # fresh records per second during the restart
RUN_TIMEOUT_S = 900.0
#: format("fastrecover") settings of the benchmark (each backfill batch delays the next fresh one by its
#: duration, so this trades fresh-record latency during the drain against drain time).
BACKFILL_PER_TRIGGER = 500_000
BACKFILL_TASKS = 4


@dataclass
class _Tally:
    """What the sink has seen since the restart (foreachBatch runs on the driver)."""

    started: float
    lag_target: int
    lag_seen: int = 0
    fresh_seen: int = 0
    other_seen: int = 0
    first_fresh_s: float | None = None
    drained_s: float | None = None
    batches: list[tuple[float, int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: None: the sink only counts; a path: it also appends every batch there as Parquet.
    parquet: str | None = None
    #: The sink also runs a Python UDF over every record (the per-record cost of a PySpark pipeline).
    python_udf: bool = False

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        if self.parquet is not None:
            df = df.persist()
            df.write.mode("append").parquet(self.parquet)
        aggregates = [F.count(F.lit(1)).alias("n")]
        if self.python_udf:
            aggregates.append(F.sum(F.length(_digest_udf()(F.col("value")))).alias("digest_chars"))
        counts = {
            row["kind"]: row["n"]
            for row in df.groupBy(F.expr("substring(cast(value as string), 1, 1)").alias("kind"))
            .agg(*aggregates)
            .collect()
        }
        if self.parquet is not None:
            df.unpersist()
        now = time.monotonic() - self.started
        with self.lock:
            lag, fresh = counts.get("L", 0), counts.get("F", 0)
            self.lag_seen += lag
            self.fresh_seen += fresh
            self.other_seen += sum(n for k, n in counts.items() if k not in ("L", "F"))
            self.batches.append((round(now, 3), lag, fresh))
            if fresh and self.first_fresh_s is None:
                self.first_fresh_s = now
            if self.drained_s is None and self.lag_seen >= self.lag_target:
                self.drained_s = now

    def done(self) -> bool:
        with self.lock:
            return self.first_fresh_s is not None and self.drained_s is not None


def _digest_udf() -> Any:
    """A Python UDF hashing each record's value: a typical per-record PySpark transformation."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def digest(value: bytes | None) -> str:
        import hashlib

        return hashlib.sha256(value or b"").hexdigest()

    return F.udf(digest, StringType())


class _FreshProducer(threading.Thread):
    def __init__(self, bootstrap: str, topic: str, rate: int) -> None:
        super().__init__(name="bench-fresh-producer", daemon=True)
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self._topic = topic
        self._rate = rate
        self._halt = threading.Event()
        self.sent = 0

    def run(self) -> None:
        began = time.monotonic()
        while not self._halt.is_set():
            due = int((time.monotonic() - began) * self._rate) + 1
            while self.sent < due:
                self._producer.produce(self._topic, value=b"F%d" % self.sent)
                self.sent += 1
            self._producer.poll(0)
            self._halt.wait(0.01)
        self._producer.flush(30)

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


def _wait(predicate: Any, query: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if query.exception() is not None:
            raise RuntimeError(f"query failed while waiting for {what}: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def _produce_lag(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
            "compression.type": "lz4",
        }
    )
    payload = b"L" + b"x" * 99
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=payload, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} lag records undelivered")


def _reader(spark: Any, source: str, bootstrap: str, topic: str, store_url: str, query: str) -> Any:
    if source == "spark-kafka":
        return (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "latest")
            .option("failOnDataLoss", "true")
            .load()
        )
    return (
        spark.readStream.format("fastrecover")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "latest")
        .option("fastrecover.store.url", store_url)
        .option("fastrecover.query", query)
        .option("maxBackfillOffsetsPerTrigger", str(BACKFILL_PER_TRIGGER))
        .option("backfillTasks", str(BACKFILL_TASKS))
        .load()
    )


def _start(spark: Any, df: Any, sink: Any, checkpoint: str, available_now: bool) -> Any:
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="0 seconds")
    return writer.start()


def run_once(spark: Any, bootstrap: str, source: str, lag: int, workdir: Path, sink: str = "count") -> dict[str, Any]:
    """One measurement of one source at one lag; returns its timings (seconds) and batch trace."""
    from fastrecover_tools.testing.broker import create_topic, delete_topic, produce

    topic = f"bench-spark-{source}-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    checkpoint = str(workdir / f"ck-{topic}")
    store_url = f"sqlite:///{workdir / 'bench-store.db'}"
    query = topic
    try:
        # 1. The query has been running: a batch committed at the log end.
        warm = _Tally(time.monotonic(), 0)
        q = _start(spark, _reader(spark, source, bootstrap, topic, store_url, query), warm, checkpoint, False)
        try:
            _wait(lambda: q.status["message"] == "Waiting for data to arrive", q, "the warm-up query to plan")
            produce(bootstrap, topic, [b"W"] * PARTITIONS)
            _wait(lambda: warm.other_seen >= PARTITIONS, q, "the warm-up records")
            q.processAllAvailable()  # the warm-up batch is committed: the restart does not replay it
        finally:
            q.stop()
        # 2. Downtime.
        _produce_lag(bootstrap, topic, lag)
        # 3. Restart with fresh records arriving.
        fresh = _FreshProducer(bootstrap, topic, FRESH_RATE)
        tally = _Tally(time.monotonic(), lag)
        if sink == "parquet":
            tally.parquet = str(workdir / f"out-{topic}")
        tally.python_udf = sink == "python-udf"
        fresh.start()
        q = _start(spark, _reader(spark, source, bootstrap, topic, store_url, query), tally, checkpoint, False)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        try:
            while not tally.done() and time.monotonic() < deadline:
                if q.exception() is not None:
                    raise RuntimeError(f"{source} query failed: {q.exception()}")
                time.sleep(0.05)
        finally:
            q.stop()
            fresh.stop()
        return {
            "first_fresh_s": tally.first_fresh_s,
            "drain_s": tally.drained_s,
            "batches": tally.batches,
        }
    finally:
        shutil.rmtree(workdir / f"out-{topic}", ignore_errors=True)
        shutil.rmtree(checkpoint, ignore_errors=True)
        try:
            delete_topic(bootstrap, topic)
        except Exception as exc:
            log.warning("could not delete bench topic %s: %r", topic, exc)


def _stats(values: Sequence[float | None]) -> dict[str, float | None]:
    got = [v for v in values if v is not None]
    if not got:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": round(statistics.median(got), 2),
        "min": round(min(got), 2),
        "max": round(max(got), 2),
        "n": len(got),
    }


def machine() -> dict[str, Any]:
    try:
        with open("/proc/meminfo") as fh:
            mem_kb = int(fh.readline().split()[1])
        mem = f"{mem_kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        mem = "unknown"
    import pyspark

    return {
        "cpus": os.cpu_count(),
        "memory": mem,
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "platform": platform.platform(),
    }


def kafka_package_version() -> str:
    """spark-sql-kafka-0-10's version: the PySpark version unless FASTRECOVER_SPARK_KAFKA_VERSION is set.

    (A PySpark release can reach PyPI before its connector reaches Maven Central.)
    """
    import pyspark

    return os.environ.get("FASTRECOVER_SPARK_KAFKA_VERSION") or pyspark.__version__


_CENTRAL = "https://repo1.maven.org/maven2"
_TOKEN_PROVIDER = "spark-token-provider-kafka-0-10_2.13"


def _token_provider_jar(version: str) -> str:
    """Fetch spark-token-provider-kafka-0-10 at ``version`` from Maven Central into the user cache."""
    import urllib.request

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fastrecover" / "spark-jars"
    cache.mkdir(parents=True, exist_ok=True)
    jar = cache / f"{_TOKEN_PROVIDER}-{version}.jar"
    if not jar.is_file():
        url = f"{_CENTRAL}/org/apache/spark/{_TOKEN_PROVIDER}/{version}/{_TOKEN_PROVIDER}-{version}.jar"
        part = jar.with_suffix(".part")
        with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
            out.write(response.read())
        part.rename(jar)
    return str(jar)


def spark_session(master: str = "local[2]") -> Any:
    """A session with Spark's Kafka source (spark-sql-kafka-0-10 from Maven Central).

    FASTRECOVER_SPARK_TOKEN_PROVIDER_VERSION pins its spark-token-provider-kafka
    dependency to another published version when the matching one is missing.
    """
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName("fastrecover-bench")
        .config("spark.jars.packages", f"org.apache.spark:spark-sql-kafka-0-10_2.13:{kafka_package_version()}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
    )
    token_version = os.environ.get("FASTRECOVER_SPARK_TOKEN_PROVIDER_VERSION")
    if token_version:
        builder = builder.config("spark.jars.excludes", f"org.apache.spark:{_TOKEN_PROVIDER}").config(
            "spark.jars", _token_provider_jar(token_version)
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_spark_bench(
    bootstrap: str,
    lags: Sequence[int] = (100_000, 1_000_000),
    repeats: int = 3,
    *,
    sinks: Sequence[str] = ("count",),
    spark: Any = None,
    workdir: str | None = None,
) -> dict[str, Any]:
    """Measure both sources at each lag ``repeats`` times; returns raw runs and median/min/max summaries.

    ``sinks``: ``count`` (the sink only counts the batch), ``parquet`` (it also
    appends the batch to Parquet files) and/or ``python-udf`` (it also runs a
    Python UDF over every record): the last two have a per-record cost, as real
    pipelines do.
    The result's ``summary`` and ``runs`` are keyed by sink, then lag, then source.
    """
    import fastrecover.spark

    for sink in sinks:
        if sink not in SINKS:
            raise ValueError(f"unknown sink {sink!r}; expected one of {SINKS}")
    own = spark is None
    if spark is None:
        spark = spark_session()
    fastrecover.spark.register(spark)
    tmp = tempfile.TemporaryDirectory(prefix="fastrecover-spark-bench-") if workdir is None else None
    base = Path(workdir or (tmp.name if tmp else "."))
    runs: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    try:
        for sink in sinks:
            for lag in lags:
                per = runs.setdefault(sink, {}).setdefault(str(lag), {s: [] for s in SOURCES})
                for rep in range(repeats):
                    # Alternate which source goes first, so warm-up effects do not favour one.
                    order = SOURCES if rep % 2 == 0 else tuple(reversed(SOURCES))
                    for source in order:
                        log.info("spark bench: %s sink, lag %d, repeat %d, %s", sink, lag, rep + 1, source)
                        result = run_once(spark, bootstrap, source, lag, base, sink)
                        log.info(
                            "spark bench: %s sink, lag %d, %s: first fresh %.2fs, drained %.2fs",
                            sink,
                            lag,
                            source,
                            result["first_fresh_s"] or -1,
                            result["drain_s"] or -1,
                        )
                        per[source].append(result)
    finally:
        if own:
            spark.stop()
        if tmp is not None:
            tmp.cleanup()
    summary = {
        sink: {
            lag: {
                source: {
                    "first_fresh_s": _stats([r["first_fresh_s"] for r in rs]),
                    "drain_s": _stats([r["drain_s"] for r in rs]),
                }
                for source, rs in per.items()
            }
            for lag, per in by_lag.items()
        }
        for sink, by_lag in runs.items()
    }
    return {
        "machine": machine(),
        "config": {
            "partitions": PARTITIONS,
            "fresh_rate_per_s": FRESH_RATE,
            "repeats": repeats,
            "spark_sql_kafka": kafka_package_version(),
            "spark_token_provider_kafka": os.environ.get("FASTRECOVER_SPARK_TOKEN_PROVIDER_VERSION"),
            "fastrecover_options": {
                "maxBackfillOffsetsPerTrigger": BACKFILL_PER_TRIGGER,
                "backfillTasks": BACKFILL_TASKS,
            },
            "master": spark.sparkContext.master if not own else "local[2]",
        },
        "summary": summary,
        "runs": runs,
    }


def format_table(result: dict[str, Any]) -> str:
    """The summary as a Markdown table (medians, with min-max)."""
    lines = [
        "| sink | lag | source | restart -> first fresh record (s) | restart -> lag drained (s) |",
        "| --- | ---: | --- | --- | --- |",
    ]
    for sink, by_lag in result["summary"].items():
        for lag, per in by_lag.items():
            for source, stats in per.items():
                cells = []
                for metric in ("first_fresh_s", "drain_s"):
                    m = stats[metric]
                    cells.append("n/a" if m["median"] is None else f"{m['median']} ({m['min']}-{m['max']})")
                lines.append(f"| {sink} | {int(lag):,} | {source} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastrecover_tools.spark_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("FASTRECOVER_BOOTSTRAP"))
    parser.add_argument("--lags", default="100000,1000000", help="comma-separated lags")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sinks", default="count", help="comma-separated: count, parquet, python-udf")
    parser.add_argument("--json", help="write the full result here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("py4j", "alembic", "fastrecover.store"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.bootstrap:
        from fastrecover_tools.testing.broker import select_broker

        broker = select_broker()
        args.bootstrap = broker.bootstrap
    result = run_spark_bench(
        args.bootstrap,
        [int(x) for x in args.lags.split(",")],
        args.repeats,
        sinks=[x.strip() for x in args.sinks.split(",") if x.strip()],
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps(result["machine"]))
    print(format_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
