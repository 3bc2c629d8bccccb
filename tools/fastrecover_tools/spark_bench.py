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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

log = logging.getLogger("fastrecover.spark")

#: spark-kafka: Spark's built-in source; fastrecover-jvm: fastrecover.spark.start_stream (planning in
#: format("fastrecover"), records read by Spark's JVM Kafka reader); fastrecover: format("fastrecover")
#: reading records in Python workers; fastrecover-kafka: fastrecover.spark.start_kafka_stream (Spark's own
#: source for live records, the driver jumps the checkpoint and reads the lag in chunks with the JVM reader);
#: fastrecover-kafka-no-jump: start_kafka_stream with a lag threshold above any lag, so it never jumps and
#: Spark's source reads the lag with the first fresh records (what a user gets by choosing drain over freshness).
SOURCES = ("spark-kafka", "fastrecover-jvm", "fastrecover", "fastrecover-kafka", "fastrecover-kafka-no-jump")
_KAFKA_STREAM = ("fastrecover-kafka", "fastrecover-kafka-no-jump")
#: fastrecover.backfill.min.offsets of fastrecover-kafka-no-jump: far above any real lag (offsets are 63-bit)
NO_JUMP_MIN_OFFSETS = 1 << 62
SINKS = ("count", "parquet", "python-udf")
PARTITIONS = 2
FRESH_RATE = 500  # fresh records per second during the restart
RUN_TIMEOUT_S = 900.0
#: format("fastrecover") settings of the benchmark (each backfill batch delays the next fresh one by its
#: duration, so this trades fresh-record latency during the drain against drain time).
BACKFILL_PER_TRIGGER = 500_000
BACKFILL_TASKS = 4
#: start_stream reads at JVM speed and pays a per-batch overhead (planning, a batch Kafka read): bigger steps.
JVM_BACKFILL_PER_TRIGGER = 2_000_000
#: Steady state: offsets per micro-batch for both sources (Spark's maxOffsetsPerTrigger).
STEADY_PER_TRIGGER = 500_000


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
    #: Spark's batch id of each entry of ``batches`` (to find the batch's own duration in the query's progress)
    batch_ids: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: None: the sink only counts; a path: it also appends every batch there as Parquet.
    parquet: str | None = None
    #: The sink also runs a Python UDF over every record (the per-record cost of a PySpark pipeline).
    python_udf: bool = False
    #: First byte of the values the fresh producer of THIS restart writes.
    fresh_marker: str = "F"

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
            lag, fresh = counts.get("L", 0), counts.get(self.fresh_marker, 0)
            self.lag_seen += lag
            self.fresh_seen += fresh
            self.other_seen += sum(n for k, n in counts.items() if k not in ("L", self.fresh_marker))
            self.batches.append((round(now, 3), lag, fresh))
            self.batch_ids.append(batch_id)
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
    def __init__(self, bootstrap: str, topic: str, rate: int, marker: bytes = b"F") -> None:
        super().__init__(name="bench-fresh-producer", daemon=True)
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self._topic = topic
        self._rate = rate
        self._halt = threading.Event()
        self._marker = marker
        self.sent = 0

    def run(self) -> None:
        began = time.monotonic()
        while not self._halt.is_set():
            due = int((time.monotonic() - began) * self._rate) + 1
            while self.sent < due:
                self._producer.produce(self._topic, value=self._marker + b"%d" % self.sent)
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


def _produce_lag(bootstrap: str, topic: str, count: int, marker: bytes = b"L") -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
            "compression.type": "lz4",
        }
    )
    payload = marker + b"x" * 99
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


def _options(source: str, bootstrap: str, topic: str, store_url: str, query: str, **extra: str) -> dict[str, str]:
    if source == "spark-kafka":
        opts = {"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "latest"}
        opts["failOnDataLoss"] = "true"
    else:
        opts = {
            "kafka.bootstrap.servers": bootstrap,
            "subscribe": topic,
            "startingOffsets": "latest",
            "fastrecover.store.url": store_url,
            "fastrecover.query": query,
            "maxBackfillOffsetsPerTrigger": str(
                JVM_BACKFILL_PER_TRIGGER if source == "fastrecover-jvm" else BACKFILL_PER_TRIGGER
            ),
            "backfillTasks": str(BACKFILL_TASKS),
        }
    if source in _KAFKA_STREAM:  # start_kafka_stream's own defaults, as a user gets them
        del opts["maxBackfillOffsetsPerTrigger"], opts["backfillTasks"]
    if source == "fastrecover-kafka-no-jump":
        opts["fastrecover.backfill.min.offsets"] = str(NO_JUMP_MIN_OFFSETS)
    opts.update(extra)
    if source == "spark-kafka":
        opts = {k: v for k, v in opts.items() if not k.startswith(("fastrecover.", "maxBackfill", "backfill"))}
    return opts


def _start(spark: Any, source: str, options: dict[str, str], sink: Any, checkpoint: str) -> Any:
    if source == "fastrecover-jvm":
        from fastrecover.spark import start_stream

        return start_stream(spark, options, sink, checkpoint)
    if source in _KAFKA_STREAM:
        from fastrecover.spark import start_kafka_stream

        return start_kafka_stream(spark, options, sink, checkpoint)
    fmt = "kafka" if source == "spark-kafka" else "fastrecover"
    reader = spark.readStream.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    return writer.trigger(processingTime="0 seconds").start()


def run_round(
    spark: Any, bootstrap: str, sources: Sequence[str], lag: int, workdir: Path, sink: str = "count"
) -> dict[str, dict[str, Any]]:
    """One measurement of each source, in the given order, after the same downtime on one topic.

    Every source's query runs once so its checkpoint sits at the log end; the
    lag is produced once; then each source restarts in turn while fresh records
    arrive, each restart with its own fresh-record marker (the records an
    earlier restart's producer wrote are part of a later source's backlog: a
    few thousand records, counted as neither lag nor fresh).
    """
    from fastrecover_tools.testing.broker import create_topic, delete_topic, produce

    topic = f"bench-spark-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    store_url = f"sqlite:///{workdir / 'bench-store.db'}"
    checkpoints = {src: str(workdir / f"ck-{topic}-{src}") for src in sources}
    options = {src: _options(src, bootstrap, topic, store_url, f"{topic}-{src}") for src in sources}
    out: dict[str, dict[str, Any]] = {}
    try:
        # 1. The queries have been running: a batch committed at the log end.
        produce(bootstrap, topic, [b"W"] * PARTITIONS)
        for src in sources:
            warm = _Tally(time.monotonic(), 0)
            opts = {**options[src], "startingOffsets": "earliest"}
            q = _start(spark, src, opts, warm, checkpoints[src])
            try:
                _wait(lambda w=warm: w.other_seen >= PARTITIONS, q, "the warm-up records")  # type: ignore[misc]
                q.processAllAvailable()  # the warm-up batch is committed: the restart does not replay it
            finally:
                q.stop()
        # 2. Downtime.
        _produce_lag(bootstrap, topic, lag)
        # 3. Each source restarts with fresh records arriving.
        for i, src in enumerate(sources):
            marker = "FGHIJ"[i]
            fresh = _FreshProducer(bootstrap, topic, FRESH_RATE, marker.encode())
            tally = _Tally(time.monotonic(), lag, fresh_marker=marker)
            if sink == "parquet":
                tally.parquet = str(workdir / f"out-{topic}-{src}")
            tally.python_udf = sink == "python-udf"
            load = os.getloadavg()[0]
            fresh.start()
            tally.started = time.monotonic()
            q = _start(spark, src, options[src], tally, checkpoints[src])
            deadline = time.monotonic() + RUN_TIMEOUT_S
            try:
                while not tally.done() and time.monotonic() < deadline:
                    if q.exception() is not None:
                        raise RuntimeError(f"{src} query failed: {q.exception()}")
                    time.sleep(0.02)
                durations = _trigger_durations(q)
            finally:
                q.stop()
                fresh.stop()
            out[src] = {
                "first_fresh_s": tally.first_fresh_s,
                "drain_s": tally.drained_s,
                "fresh_only_batches_s": _fresh_only_batches_s(tally, durations),
                "first_batch_s": tally.batches[0][0] if tally.batches else None,
                "load_avg_1m": load,
                "batches": tally.batches,
            }
            log.info(
                "spark bench: %s sink, lag %d, %s: first fresh %.2fs, drained %.2fs (load %.1f)",
                sink,
                lag,
                src,
                tally.first_fresh_s or -1,
                tally.drained_s or -1,
                load,
            )
        return out
    finally:
        for src in sources:
            shutil.rmtree(workdir / f"out-{topic}-{src}", ignore_errors=True)
            shutil.rmtree(checkpoints[src], ignore_errors=True)
        try:
            delete_topic(bootstrap, topic)
        except Exception as exc:
            log.warning("could not delete bench topic %s: %r", topic, exc)


def _trigger_durations(query: Any) -> dict[int, float]:
    """Each recent batch's own duration (Spark's ``durationMs.triggerExecution``), in seconds, by batch id."""
    out: dict[int, float] = {}
    for progress in query.recentProgress:
        batch = progress["batchId"] if isinstance(progress, dict) else progress.batchId
        took = progress["durationMs"] if isinstance(progress, dict) else progress.durationMs
        if took and "triggerExecution" in took:
            out[int(batch)] = took["triggerExecution"] / 1000.0
    return out


def _fresh_only_batches_s(tally: _Tally, durations: dict[int, float]) -> float | None:
    """How long the batches holding fresh records and no lag record took, until the lag was drained.

    That is what a restart that serves fresh records first adds to the drain: the goal is "the drain
    takes at most Spark's own plus one micro-batch", and this is the micro-batch, timed by Spark.
    None when a batch's duration is not in the query's progress (it keeps the last 100).
    """
    total = 0.0
    for (end, lag, fresh), batch in zip(tally.batches, tally.batch_ids, strict=True):
        if tally.drained_s is not None and end > tally.drained_s:
            break
        if fresh and not lag:
            if batch not in durations:
                return None
            total += durations[batch]
    return round(total, 3)


def run_steady(
    spark: Any, bootstrap: str, sources: Sequence[str], records: int, workdir: Path
) -> dict[str, dict[str, Any]]:
    """Steady state, no restart: ``records`` are in one topic; each source in turn reads them with a new
    query from the start, in batches of at most STEADY_PER_TRIGGER offsets, through the count sink.
    The rate counts the batches after the first (the start-up cost is measured separately)."""
    from fastrecover_tools.testing.broker import create_topic, delete_topic

    topic = f"bench-steady-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    out: dict[str, dict[str, Any]] = {}
    try:
        _produce_lag(bootstrap, topic, records, marker=b"F")
        for src in sources:
            checkpoint = str(workdir / f"ck-{topic}-{src}")
            extra = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": str(STEADY_PER_TRIGGER)}
            if src != "spark-kafka":
                extra["fastrecover.backfill.min.offsets"] = str(10**15)  # a new query: no recovery, plain reading
            store = f"sqlite:///{workdir / 'bench-store.db'}"
            opts = _options(src, bootstrap, topic, store, f"{topic}-{src}", **extra)
            tally = _Tally(time.monotonic(), 0)
            load = os.getloadavg()[0]
            q = _start(spark, src, opts, tally, checkpoint)
            try:
                _wait(lambda t=tally: t.fresh_seen >= records, q, f"{records} records", RUN_TIMEOUT_S)  # type: ignore[misc]
            finally:
                q.stop()
                shutil.rmtree(checkpoint, ignore_errors=True)
            (t0, l0, f0), (t1, _, _) = tally.batches[0], tally.batches[-1]
            rate = (records - l0 - f0) / (t1 - t0) if t1 > t0 else None
            out[src] = {"rate_per_s": rate, "total_s": t1, "load_avg_1m": load, "batches": tally.batches}
            log.info("spark bench: steady %s: %.0f records/s (load %.1f)", src, rate or -1, load)
        return out
    finally:
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


def _paired(baseline: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]], source: str) -> dict[str, Any]:
    """Per-round ratios source / spark-kafka of both times (rounds where both measured), with their spread.

    Runs are paired by position: round k of every source comes from the same round (same topic, same lag).
    """
    if source == "spark-kafka" or not baseline:
        return {}
    out: dict[str, Any] = {}
    for metric in ("first_fresh_s", "drain_s"):
        ratios = [
            r[metric] / b[metric] for b, r in zip(baseline, runs, strict=False) if r.get(metric) and b.get(metric)
        ]
        stats: dict[str, Any] = dict(_stats(ratios))
        if ratios:
            stats["spread"] = round((max(ratios) - min(ratios)) / statistics.median(ratios), 2)
            stats["rounds"] = [round(x, 3) for x in ratios]
        out[f"{metric.removesuffix('_s')}_ratio"] = stats
    extra = [
        (r["drain_s"] - b["drain_s"], r.get("fresh_only_batches_s"))
        for b, r in zip(baseline, runs, strict=False)
        if r.get("drain_s") and b.get("drain_s")
    ]
    if extra:
        out["drain_extra_s"] = {**_stats([e for e, _ in extra]), "rounds": [round(e, 3) for e, _ in extra]}
        out["fresh_only_batches_s"] = _stats([f for _, f in extra])
        timed = [(e, f) for e, f in extra if f is not None]
        out["drain_within_one_batch"] = {"rounds": len(timed), "held": sum(e <= f for e, f in timed)}
    return out


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
    """spark-sql-kafka-0-10's version (see :func:`fastrecover.spark.jvm.connector_package`)."""
    from fastrecover.spark.jvm import connector_package

    return connector_package().rsplit(":", 1)[1]


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

    from fastrecover_tools.testing.spark_cluster import LOOPBACK

    # the driver's JVM binds to and advertises the loopback address, never the machine's network address
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName("fastrecover-bench")
        .config("spark.driver.host", LOOPBACK)
        .config("spark.driver.bindAddress", LOOPBACK)
        .config("spark.jars.packages", f"org.apache.spark:spark-sql-kafka-0-10_2.13:{kafka_package_version()}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        # The machine is shared: a Python worker may take long to start under load.
        .config("spark.python.authenticate.socketTimeout", "120s")
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
    warmup: int = 1,
    sinks: Sequence[str] = ("count",),
    sources: Sequence[str] = SOURCES,
    steady_records: int = 0,
    spark: Any = None,
    workdir: str | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Measure the sources at each lag ``repeats`` times; returns raw runs and median/min/max summaries.

    ``sinks``: ``count`` (the sink only counts the batch), ``parquet`` (it also
    appends the batch to Parquet files) and/or ``python-udf`` (it also runs a
    Python UDF over every record): the last two have a per-record cost, as real
    pipelines do.  Each repeat is one round on one topic in which the sources
    restart in turn; the order is reversed every other repeat (ABAB), so a
    change of the machine's load hits both.  ``steady_records`` > 0 adds the
    steady-state throughput scenario (:func:`run_steady`).  ``progress`` gets
    the result so far after every round (a long run can be stopped and keeps
    what it measured).  ``summary`` and ``runs`` are keyed by sink, then lag,
    then source.  ``warmup`` rounds run first at each sink (at the first lag) and are
    kept apart (``warmup_runs``), out of the summary: the first rounds in a new JVM
    compile the Kafka reader and the sink's code paths and take up to twice as
    long, which a 3-repeat median cannot absorb.  ``first_fresh_ratio`` and
    ``drain_ratio`` pair each source with ``spark-kafka`` round by round (both restarted after the same downtime,
    minutes apart), which cancels most of the machine's drift between rounds.
    """
    import fastrecover.spark

    for sink in sinks:
        if sink not in SINKS:
            raise ValueError(f"unknown sink {sink!r}; expected one of {SINKS}")
    for src in sources:
        if src not in SOURCES:
            raise ValueError(f"unknown source {src!r}; expected one of {SOURCES}")
    own = spark is None
    if spark is None:
        spark = spark_session()
    fastrecover.spark.register(spark)
    tmp = tempfile.TemporaryDirectory(prefix="fastrecover-spark-bench-") if workdir is None else None
    base = Path(workdir or (tmp.name if tmp else "."))
    runs: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    warmups: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    steady: dict[str, list[dict[str, Any]]] = {src: [] for src in sources}
    failures: list[str] = []

    def result() -> dict[str, Any]:
        return {
            **_result(spark, own, sources, repeats, runs, steady),
            "warmup_runs": warmups,
            "failed_attempts": list(failures),
        }

    try:
        for sink in sinks:
            for lag in lags:
                per = runs.setdefault(sink, {}).setdefault(str(lag), {s: [] for s in sources})
                warm = warmups.setdefault(sink, {}).setdefault(str(lag), {s: [] for s in sources})
                for rep in range(-warmup if lag == lags[0] else 0, repeats):
                    order = tuple(sources) if rep % 2 == 0 else tuple(reversed(sources))
                    kept = warm if rep < 0 else per
                    what = "warm-up round" if rep < 0 else f"repeat {rep + 1}"
                    log.info("spark bench: %s sink, lag %d, %s, order %s", sink, lag, what, order)
                    for src, measured in _retried(
                        lambda o=order, lg=lag, sk=sink: run_round(spark, bootstrap, o, lg, base, sk),  # type: ignore[misc]
                        failures,
                        f"{sink} sink, lag {lag}, {what}",
                    ).items():
                        kept[src].append(measured)
                    if progress is not None:
                        progress(result())
        if steady_records > 0:
            for rep in range(repeats):
                order = tuple(sources) if rep % 2 == 0 else tuple(reversed(sources))
                for src, measured in _retried(
                    lambda o=order: run_steady(spark, bootstrap, o, steady_records, base),  # type: ignore[misc]
                    failures,
                    f"steady, repeat {rep + 1}",
                ).items():
                    steady[src].append(measured)
                if progress is not None:
                    progress(result())
    finally:
        final = result()
        if own:
            spark.stop()
        if tmp is not None:
            tmp.cleanup()
    return final


def _retried(run: Callable[[], dict[str, dict[str, Any]]], failures: list[str], what: str) -> dict[str, dict[str, Any]]:
    """Run one round, again (up to twice) when it fails; every failure is kept for the result.

    On a loaded machine a Python process Spark starts may not connect back within
    Spark's fixed 10 s, which fails the query: that is a failed attempt, not a measurement.
    """
    for attempt in range(3):
        try:
            return run()
        except (RuntimeError, TimeoutError) as exc:
            failures.append(f"{what}, attempt {attempt + 1}: {str(exc).splitlines()[0][:300]}")
            log.warning("spark bench: %s failed (attempt %d): %s", what, attempt + 1, str(exc).splitlines()[0])
    return {}


def _result(
    spark: Any,
    own: bool,
    sources: Sequence[str],
    repeats: int,
    runs: dict[str, dict[str, dict[str, list[dict[str, Any]]]]],
    steady: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    summary = {
        sink: {
            lag: {
                source: {
                    "first_fresh_s": _stats([r["first_fresh_s"] for r in rs]),
                    "drain_s": _stats([r["drain_s"] for r in rs]),
                    **_paired(per.get("spark-kafka", []), rs, source),
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
            "sources": list(sources),
            "spark_sql_kafka": kafka_package_version(),
            "spark_token_provider_kafka": os.environ.get("FASTRECOVER_SPARK_TOKEN_PROVIDER_VERSION")
            or kafka_package_version(),
            "fastrecover_options": {
                "maxBackfillOffsetsPerTrigger": BACKFILL_PER_TRIGGER,
                "maxBackfillOffsetsPerTrigger (fastrecover-jvm)": JVM_BACKFILL_PER_TRIGGER,
                "fastrecover-kafka": "start_kafka_stream's defaults (5M offsets per chunk, a task per core)",
                "fastrecover-kafka-no-jump": "fastrecover-kafka with fastrecover.backfill.min.offsets="
                f"{NO_JUMP_MIN_OFFSETS}",
                "backfillTasks": BACKFILL_TASKS,
            },
            "steady_max_offsets_per_trigger": STEADY_PER_TRIGGER,
            "master": spark.sparkContext.master,
        },
        "summary": summary,
        "steady": {
            src: {"rate_per_s": _stats([r["rate_per_s"] for r in rs]), "runs": rs} for src, rs in steady.items() if rs
        },
        "runs": runs,
    }


# ------------------------------------------------------------------ the ranges job on a cluster

#: Partitions of the ranges-scaling topic: one range each, enough tasks for 2 workers.
RANGES_PARTITIONS = 4
RANGES_TASKS = 4


def _produce_spread(bootstrap: str, topic: str, count: int, partitions: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
            "compression.type": "lz4",
        }
    )
    payload = b"R" + b"x" * 99
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=payload, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    if left:
        raise RuntimeError(f"{left} records undelivered")


def _recovering_consumer(bootstrap: str, group: str, store_url: str, **extra: Any) -> Any:
    """A fastrecover consumer of ``group`` whose committed offsets are 0: it recovers the whole topic as lag."""
    from fastrecover import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.parallel.rebalance": True,
            "fastrecover.store.url": store_url,
            "fastrecover.backfill.min.offsets": 10,
            **extra,
        }
    )


def _commit_zero(bootstrap: str, group: str, topic: str, partitions: int) -> None:
    from confluent_kafka import Consumer as PlainConsumer
    from confluent_kafka import TopicPartition

    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        plain.commit(offsets=[TopicPartition(topic, p, 0) for p in range(partitions)], asynchronous=False)
    finally:
        plain.close()


def _open_ranges(bootstrap: str, topic: str, group: str, store_url: str, partitions: int) -> None:
    """A consumer of ``group`` recovers (a range per partition), then closes: the ranges stay open for a job."""
    _commit_zero(bootstrap, group, topic, partitions)
    consumer = _recovering_consumer(bootstrap, group, store_url, **{"fastrecover.backfill.queue.max.messages": 10})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 120
        while len({t.partition for t, _ in consumer.backfill_progress()}) < partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(f"group {group}: the consumer opened no range on every partition in 120 s")
            consumer.poll(0.2)
    finally:
        consumer.close()


def run_child(bootstrap: str, topic: str, lag: int, store_url: str, partitions: int) -> dict[str, Any]:
    """One fastrecover consumer recovers ``lag`` records; its child backfills them. ``records_per_s`` is over
    the wall time from ``subscribe`` (group join and recovery included, as the ranges job's includes its
    planning and executors' start); ``records_per_s_reading`` from the first backfilled record to the last."""
    group = f"bench-child-{uuid.uuid4().hex[:8]}"
    _commit_zero(bootstrap, group, topic, partitions)
    consumer = _recovering_consumer(bootstrap, group, store_url)
    got = 0
    first: float | None = None
    try:
        began = time.monotonic()
        consumer.subscribe([topic])
        while got < lag:
            if time.monotonic() - began > RUN_TIMEOUT_S:
                raise TimeoutError(f"the child backfilled {got} of {lag} records in {RUN_TIMEOUT_S:g} s")
            msgs = consumer.consume(1000, 0.5)
            for msg in msgs:
                if msg.error() is None:
                    got += 1
            if msgs and first is None:
                first = time.monotonic()
            if got and got % 50_000 < len(msgs):
                consumer.commit(asynchronous=True)
        end = time.monotonic()
    finally:
        consumer.close()
    assert first is not None
    seconds, reading = end - began, end - first
    return {
        "records": got,
        "seconds": round(seconds, 3),
        "records_per_s": round(got / seconds),
        "records_per_s_reading": round(got / reading),
    }


def _cluster_session(cluster: Any, cores: int) -> Any:
    """A driver on ``cluster`` using ``cores`` executors of 1 core (one per worker)."""
    from pyspark.sql import SparkSession

    from fastrecover_tools.testing.spark_cluster import LOOPBACK, session_conf

    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = session_conf(
        cluster,
        {"spark.cores.max": str(cores), "spark.sql.shuffle.partitions": "2", "spark.ui.showConsoleProgress": "false"},
    )
    builder = SparkSession.builder.appName(f"fastrecover-ranges-bench-{cores}")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    deadline = time.monotonic() + 120
    while len(spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()) - 1 < cores:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{cores} executor(s) did not register in 120 s")
        time.sleep(0.2)
    return spark


def run_ranges_job(spark: Any, bootstrap: str, topic: str, lag: int, store_url: str, partitions: int) -> dict[str, Any]:
    """A group's ranges over ``lag`` records, drained by a ranges job (a ``noop`` write); records/s over the
    job's wall time, planning (the claim) included. The ranges are completed after."""
    from fastrecover.spark import complete_ranges

    group = f"bench-ranges-{uuid.uuid4().hex[:8]}"
    _open_ranges(bootstrap, topic, group, store_url, partitions)
    began = time.monotonic()
    df = (
        spark.read.format("fastrecover-ranges")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("fastrecover.store.url", store_url)
        .option("group", group)
        .option("backfillTasks", RANGES_TASKS)
        .load()
    )
    df.write.format("noop").mode("overwrite").save()
    seconds = time.monotonic() - began
    done = complete_ranges(store_url, group)
    if done.fenced or done.records < lag:
        raise RuntimeError(f"ranges job on {group}: {done.records} of {lag} records completed, fenced {done.fenced}")
    return {"records": done.records, "seconds": round(seconds, 3), "records_per_s": round(done.records / seconds)}


def run_ranges_scaling(
    bootstrap: str,
    lag: int = 10_000_000,
    repeats: int = 3,
    *,
    workers: Sequence[int] = (1, 2),
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The ranges job on a standalone cluster of 1-core workers (1 and 2 of them) against one fastrecover child
    consumer, over the same ``lag`` records (one topic, a new group per measurement), ``repeats`` times in
    alternating order. Returns every run and records/s medians with their spread."""
    from fastrecover.spark import register
    from fastrecover_tools.testing.broker import create_topic
    from fastrecover_tools.testing.spark_cluster import SparkCluster

    tmp = tempfile.TemporaryDirectory(prefix="fastrecover-ranges-bench-")
    base = Path(tmp.name)
    store_url = f"sqlite:///{base / 'ranges.db'}"
    topic = f"bench-ranges-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=RANGES_PARTITIONS)
    log.info("ranges bench: producing %d records to %s", lag, topic)
    _produce_spread(bootstrap, topic, lag, RANGES_PARTITIONS)
    kinds = [f"spark-{n}-worker" for n in workers] + ["fastrecover-child"]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    failures: list[str] = []

    def result() -> dict[str, Any]:
        summary: dict[str, Any] = {k: _stats([r["records_per_s"] for r in v]) for k, v in runs.items()}
        for stats in summary.values():
            if stats["n"] and stats["median"]:
                stats["spread"] = round((stats["max"] - stats["min"]) / stats["median"], 2)
        ratios: dict[str, Any] = {}
        if len(workers) >= 2:
            one, two = runs[kinds[0]], runs[kinds[1]]
            ratios["scaling"] = _stats(
                [b["records_per_s"] / a["records_per_s"] for a, b in zip(one, two, strict=False)]
            )
            ratios[f"{kinds[1]}_vs_child"] = _stats(
                [b["records_per_s"] / c["records_per_s"] for b, c in zip(two, runs["fastrecover-child"], strict=False)]
            )
        return {
            "machine": machine(),
            "lag": lag,
            "partitions": RANGES_PARTITIONS,
            "tasks": RANGES_TASKS,
            "repeats": repeats,
            "runs": runs,
            "summary": summary,
            "ratios": ratios,
            "failed_attempts": failures,
        }

    cluster = SparkCluster(base / "cluster", workers=max(workers), cores=1, memory="2g")
    cluster.start()
    try:
        for rep in range(repeats):
            order = kinds if rep % 2 == 0 else list(reversed(kinds))
            for kind in order:
                log.info("ranges bench: repeat %d, %s", rep + 1, kind)
                if kind == "fastrecover-child":
                    runs[kind].append(run_child(bootstrap, topic, lag, store_url, RANGES_PARTITIONS))
                else:
                    spark = _cluster_session(cluster, int(kind.split("-")[1]))
                    try:
                        register(spark)
                        runs[kind].append(run_ranges_job(spark, bootstrap, topic, lag, store_url, RANGES_PARTITIONS))
                    finally:
                        spark.stop()
                log.info("ranges bench: %s", runs[kind][-1])
                if progress is not None:
                    progress(result())
    finally:
        cluster.stop()
        tmp.cleanup()
    return result()


def format_table(result: dict[str, Any]) -> str:
    """The summary as a Markdown table (medians, with min-max; ratios paired per round with spark-kafka)."""
    lines = [
        "| sink | lag | source | restart -> first fresh record (s) | restart -> lag drained (s) "
        "| drained, / spark-kafka per round | drained, extra over spark-kafka per round (s) "
        "| its fresh-only batches (s) | rounds where the extra <= those batches |",
        "| --- | ---: | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for sink, by_lag in result["summary"].items():
        for lag, per in by_lag.items():
            for source, stats in per.items():
                cells = []
                for metric in ("first_fresh_s", "drain_s", "drain_ratio", "drain_extra_s", "fresh_only_batches_s"):
                    m = stats.get(metric) or {"median": None}
                    cells.append("n/a" if m["median"] is None else f"{m['median']} ({m['min']}-{m['max']})")
                held = stats.get("drain_within_one_batch")
                cells.append("n/a" if not held else f"{held['held']} of {held['rounds']}")
                lines.append(f"| {sink} | {int(lag):,} | {source} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastrecover_tools.spark_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", default=os.environ.get("FASTRECOVER_BOOTSTRAP"))
    parser.add_argument("--lags", default="100000,1000000", help="comma-separated lags")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--warmup", type=int, default=1, help="rounds per sink run first (at the first lag) and not summarised"
    )
    parser.add_argument("--sinks", default="count", help="comma-separated: count, parquet, python-udf")
    parser.add_argument("--sources", default=",".join(SOURCES), help="comma-separated: " + ", ".join(SOURCES))
    parser.add_argument("--steady", type=int, default=0, help="records of the steady-state scenario (0: none)")
    parser.add_argument("--json", help="write the full result here")
    parser.add_argument(
        "--ranges-scaling",
        action="store_true",
        help="instead: the ranges job on a local standalone cluster, 1 and 2 workers of 1 core, against one "
        "fastrecover child consumer (records/s)",
    )
    parser.add_argument("--ranges-lag", type=int, default=10_000_000, help="records of the --ranges-scaling lag")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("py4j", "alembic", "fastrecover.store"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not args.bootstrap:
        from fastrecover_tools.testing.broker import select_broker

        broker = select_broker()
        args.bootstrap = broker.bootstrap

    def save(partial: dict[str, Any]) -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(partial, indent=2))

    if args.ranges_scaling:
        scaling = run_ranges_scaling(args.bootstrap, args.ranges_lag, args.repeats, progress=save)
        save(scaling)
        print(json.dumps({"summary": scaling["summary"], "ratios": scaling["ratios"]}, indent=2))
        return 0

    result = run_spark_bench(
        args.bootstrap,
        [int(x) for x in args.lags.split(",") if x.strip()],
        args.repeats,
        warmup=args.warmup,
        sinks=[x.strip() for x in args.sinks.split(",") if x.strip()],
        sources=[x.strip() for x in args.sources.split(",") if x.strip()],
        steady_records=args.steady,
        progress=save,
    )
    save(result)
    print(json.dumps(result["machine"]))
    print(format_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
