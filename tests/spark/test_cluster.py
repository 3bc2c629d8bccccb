"""The Spark paths on a real standalone cluster: a master and 2 workers, each its own JVM, all on 127.0.0.1.

The driver is this process; executors live in JVMs the workers launch, so plans, options and the readers
are serialised to other processes, and the executors' Kafka consumers are their own. Executor loss is a
real SIGKILL of a worker JVM. Each test starts with both workers alive and both executors registered.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import TopicPartition
from pyspark.sql import SparkSession
from sqlalchemy.engine import make_url

from fastrecover import Consumer
from fastrecover.ranges import RangeProgress
from fastrecover.spark import complete_ranges, start_kafka_stream
from fastrecover.store import ProgressUpdate, open_store
from fastrecover.tokens import TokenState
from fastrecover_tools.testing.broker import Record, produce
from fastrecover_tools.testing.spark_cluster import LOOPBACK, SparkCluster
from fastrecover_tools.testing.waiting import wait_for
from tests.fixtures.broker import TopicFactory
from tests.integration.helpers import offset_of
from tests.spark.conftest import executor_count, wait_executors
from tests.spark.helpers import Sink, start, stream, wait_rows, wait_waiting_for_data

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.spark_cluster]

TRIGGER = {"processingTime": "100 milliseconds"}


@pytest.fixture(autouse=True)
def _whole_cluster(spark_cluster: SparkCluster, cluster_spark: SparkSession) -> Iterator[None]:
    """Every test starts with both workers ALIVE and both executors registered (a killed one is restarted)."""
    for index in range(spark_cluster.workers):
        if not spark_cluster.worker(index).alive:
            spark_cluster.restart_worker(index)
    wait_executors(cluster_spark, spark_cluster.workers, 120)
    yield


# ------------------------------------------------------------------ helpers


def _log_end(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": "cluster-check"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        c.close()


def _ipv4(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(address)
    return ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip


def _every_offset(ends: dict[int, int], starts: dict[int, int] | None = None) -> list[tuple[int, int]]:
    return [(p, o) for p, end in sorted(ends.items()) for o in range((starts or {}).get(p, 0), end)]


def _gate(directory: str, rows: Iterable[Any]) -> Iterator[Any]:
    """mapPartitions function: a task holding backfill records says where it runs (its executor's working
    directory, under its worker's work directory) and waits for ``release``, so the test can kill a worker
    while the task runs. A task without backfill records passes through."""
    held = list(rows)
    if any(r.backfill for r in held):
        (Path(directory) / f"started-{uuid.uuid4().hex}").write_text(os.getcwd())
        release = Path(directory) / "release"
        deadline = time.monotonic() + 300
        while not release.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{release} never appeared")
            time.sleep(0.05)
    return iter(held)


def _started(directory: Path) -> list[str]:
    """Working directories of the gated task attempts so far."""
    return [f.read_text() for f in directory.glob("started-*")]


def _kill_worker_under_running_tasks(cluster: SparkCluster, gate: Path, victim: int = 1) -> int:
    """Wait until a gated task runs on each worker, SIGKILL worker ``victim``'s JVM, wait until its executor
    is gone too, then release the gate. Returns how many task attempts had started at the kill."""

    def on_both() -> bool:
        started = _started(gate)
        return all(any(f"worker-{w.index}{os.sep}" in d for d in started) for w in map(cluster.worker, (0, 1)))

    wait_for(on_both, 120, 0.05, "a gated task running on each worker")
    at_kill = len(_started(gate))
    assert cluster.executor_pids(victim), "the victim worker has no executor"
    cluster.kill_worker(victim)
    # The executor sees its worker gone and exits (Spark's WorkerWatcher), as when a host's daemon dies.
    wait_for(lambda: not cluster.executor_pids(victim), 60, 0.1, f"worker {victim}'s executor to exit")
    (gate / "release").touch()
    return at_kill


def _commit_at(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        plain.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        plain.close()


def _open_group_ranges(
    bootstrap: str, topic: str, group: str, store_url: str, partitions: int, lag: int
) -> tuple[dict[int, int], list[tuple[int, int]]]:
    """A fastrecover consumer of ``group`` recovers a lag of ``lag`` records on each partition (one range
    each), backfills a little and closes (ranges handed back, left open). Returns where the ranges start
    and the (partition, offset) pairs the consumer delivered."""
    for p in range(partitions):
        produce(bootstrap, topic, [f"done-{p}-{i}" for i in range(10)], partition=p)
    _commit_at(bootstrap, group, topic, dict.fromkeys(range(partitions), 10))
    for p in range(partitions):
        produce(bootstrap, topic, [f"lag-{p}-{i}" for i in range(lag)], partition=p)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "enable.parallel.rebalance": True,
            "fastrecover.store.url": store_url,
            "fastrecover.backfill.min.offsets": 10,
            "fastrecover.recovery.replay.max.offsets": 0,  # ranges at the first recovery, open store or not
            "fastrecover.backfill.queue.max.messages": 50,
        }
    )
    delivered: list[tuple[int, int]] = []
    try:
        consumer.subscribe([topic])

        def holds_every_partition() -> bool:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                delivered.append((int(msg.partition() or 0), offset_of(msg)))
            return len({t.partition for t, _ in consumer.backfill_progress()}) == partitions

        wait_for(holds_every_partition, 90, 0.01, f"the consumer to open a range on each of {partitions} partitions")
    finally:
        consumer.close()
    return dict.fromkeys(range(partitions), 10), delivered


def _ranges_reader(spark: SparkSession, bootstrap: str, store_url: str, group: str, tasks: int, **kafka: str) -> Any:
    reader = (
        spark.read.format("fastrecover-ranges")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("fastrecover.store.url", store_url)
        .option("group", group)
        .option("backfillTasks", tasks)
    )
    for key, value in kafka.items():
        reader = reader.option(key, value)
    return reader


# ------------------------------------------------------------------ the cluster itself


def test_every_cluster_process_listens_on_the_loopback_address_only(
    spark_cluster: SparkCluster, cluster_spark: SparkSession
) -> None:
    assert executor_count(cluster_spark) == 2

    def every_jvm_listening() -> set[tuple[int, str, int]]:
        found = spark_cluster.listening_addresses()
        return found if len({pid for pid, _, _ in found}) == 5 else set()

    # The master, both workers and both executors listen on something; all of it on 127.0.0.1. An executor
    # registers with the driver before its block manager binds its port, so wait for the last socket.
    try:
        listening = wait_for(every_jvm_listening, 60, 0.2, "all 5 cluster JVMs listening")
    except TimeoutError:
        listening = spark_cluster.listening_addresses()
    pids = {pid for pid, _, _ in listening}
    assert len(pids) == 5, f"listening JVMs: {sorted(pids)} of {spark_cluster.pids()}"
    # The JVM binds dual-stack sockets: 127.0.0.1 shows as its IPv4-mapped IPv6 form, which is still loopback only.
    addresses = {str(_ipv4(address)) for _, address, _ in listening}
    assert addresses == {LOOPBACK}, sorted(listening)
    conf = cluster_spark.sparkContext.getConf()
    assert conf.get("spark.driver.host") == LOOPBACK and conf.get("spark.master") == spark_cluster.master_url
    hosts = {
        str(info.host())
        for info in cluster_spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()  # driver included
    }
    assert hosts == {LOOPBACK}


# ------------------------------------------------------------------ the ranges job


def test_a_ranges_job_on_the_cluster_backfills_several_ranges_of_a_group(
    cluster_spark: SparkSession, bootstrap: str, topic_factory: TopicFactory, unique_group: str, store_url: str
) -> None:
    """SQLite on a path every process shares, and PostgreSQL; 4 ranges read by executors in the worker JVMs."""
    topic = topic_factory(partitions=4)
    starts, by_consumer = _open_group_ranges(bootstrap, topic, unique_group, store_url, 4, 3000)
    df = _ranges_reader(cluster_spark, bootstrap, store_url, unique_group, 4).load()
    assert df.rdd.getNumPartitions() == 4
    rows = df.select("partition", "offset", "backfill").collect()
    read = Counter((r.partition, r.offset) for r in rows)
    assert all(r.backfill for r in rows) and max(read.values()) == 1
    lag = _every_offset(_log_end(bootstrap, topic, 4), starts)
    assert set(read) <= set(lag)
    assert set(lag) <= set(read) | set(by_consumer), "a lag record was delivered by neither"
    done = complete_ranges(store_url, unique_group)
    assert len(done.completed) == 4 and done.fenced == []
    with open_store(store_url) as store:
        assert store.open_ranges(unique_group) == []
        assert {store.get(t.id).state for t in done.completed} == {TokenState.DONE}


def test_a_worker_killed_mid_ranges_job_loses_nothing_and_the_ranges_stay_fenced(
    spark_cluster: SparkCluster,
    cluster_spark: SparkSession,
    bootstrap: str,
    topic_factory: TopicFactory,
    unique_group: str,
    tmp_path: Path,
) -> None:
    store_url = f"sqlite:///{tmp_path / 'fastrecover.db'}"
    topic = topic_factory(partitions=4)
    starts, by_consumer = _open_group_ranges(bootstrap, topic, unique_group, store_url, 4, 2000)
    with open_store(store_url) as store:
        before = {t.id: t for t in store.open_ranges(unique_group)}
    gate = tmp_path / "gate"
    gate.mkdir()
    df = _ranges_reader(cluster_spark, bootstrap, store_url, unique_group, 4).load()
    gated = df.select("partition", "offset", "backfill").rdd.mapPartitions(functools.partial(_gate, str(gate)))
    result: list[Any] = []
    failure: list[BaseException] = []

    def collect() -> None:
        try:
            result.extend(gated.collect())
        except BaseException as exc:
            failure.append(exc)

    job = threading.Thread(target=collect, name="ranges-job")
    job.start()
    at_kill = _kill_worker_under_running_tasks(spark_cluster, gate)
    job.join(240)
    assert not job.is_alive() and not failure, failure
    # The lost executor's task ran again elsewhere: more attempts than the tasks that were running.
    assert len(_started(gate)) > at_kill
    read = Counter((r.partition, r.offset) for r in result)
    assert max(read.values()) == 1
    lag = _every_offset(_log_end(bootstrap, topic, 4), starts)
    assert set(read) <= set(lag) and set(lag) <= set(read) | set(by_consumer)

    done = complete_ranges(store_url, unique_group)
    assert len(done.completed) == 4 and done.fenced == []
    with open_store(store_url) as store:
        # A late write under any earlier (owner, epoch), the consumer's or a dead task's, cannot move a range.
        for old in before.values():
            stale = RangeProgress(old.span.start, old.span.end, old.span.start)
            late = store.commit_progress([ProgressUpdate(old.id, "spark-ranges:default", old.epoch, stale)])
            assert late.fenced == [old.id]
        assert all(store.get(i).state is TokenState.DONE for i in before)


# ------------------------------------------------------------------ start_kafka_stream


class _GatedSink:
    """foreachBatch function: every attempt's rows, read through the gate on the executors."""

    def __init__(self, gate: Path | None = None, fail_batch: int | None = None) -> None:
        self.gate = gate
        self.fail_batch = fail_batch
        self.attempts: list[tuple[int, list[tuple[int, int, bool, str]]]] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        rdd = df.select("partition", "offset", "backfill", "value").rdd
        if self.gate is not None:
            rdd = rdd.mapPartitions(functools.partial(_gate, str(self.gate)))
        rows = [(r.partition, r.offset, r.backfill, (r.value or b"").decode()) for r in rdd.collect()]
        self.attempts.append((batch_id, rows))
        if batch_id == self.fail_batch:
            self.fail_batch = None
            raise RuntimeError(f"batch {batch_id} fails once (the driver's query crashes)")

    def committed_keys(self, checkpoint: Path) -> Counter[tuple[int, int]]:
        """Keys of the last attempt of every batch the checkpoint committed."""
        committed = {int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit()}
        last: dict[int, list[tuple[int, int, bool, str]]] = {}
        for batch, rows in self.attempts:
            last[batch] = rows
        return Counter((p, o) for b, rows in last.items() if b in committed for p, o, _, _ in rows)

    def count(self, prefix: str) -> int:
        return sum(1 for _, rows in self.attempts for r in rows if r[3].startswith(prefix))


def _options(bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "startingOffsets": "earliest",
        "fastrecover.backfill.min.offsets": "100",
        **extra,
    }


def _run(spark: SparkSession, options: dict[str, str], sink: _GatedSink, checkpoint: Path, until: Any) -> None:
    query = start_kafka_stream(spark, options, sink, str(checkpoint), trigger=TRIGGER)
    try:

        def ready() -> bool:
            if query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            return bool(until())

        wait_for(ready, 240, 0.1, "the query's records")
        query.processAllAvailable()
    finally:
        query.stop()


def test_start_kafka_stream_on_the_cluster_survives_a_crash_of_the_drivers_query(
    cluster_spark: SparkSession, bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """Warm-up, downtime, restart (the jump), a crash in a chunk's batch, restart: every record once."""
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    options = _options(bootstrap, topic, maxBackfillOffsetsPerTrigger="1500", backfillTasks="2")
    produce(bootstrap, topic, [Record(b"W%d" % i, partition=i % 2) for i in range(10)])
    sink = _GatedSink()
    _run(cluster_spark, options, sink, checkpoint, lambda: sink.count("W") >= 10)
    jump = max(int(f.name) for f in (checkpoint / "offsets").iterdir() if f.name.isdigit()) + 1
    produce(bootstrap, topic, [Record(b"L%d" % i, partition=i % 2) for i in range(4000)])
    # The restart jumps; the batch after the first chunk's fails: the query stops with it uncommitted.
    sink.fail_batch = jump + 2
    query = start_kafka_stream(cluster_spark, options, sink, str(checkpoint), trigger=TRIGGER)
    try:
        produce(bootstrap, topic, [Record(b"F%d" % i, partition=i % 2) for i in range(4)])
        wait_for(lambda: query.exception() is not None, 240, 0.1, "the failing batch to stop the query")
    finally:
        query.stop()
    failed = jump + 2
    first = sorted((p, o) for b, rows in sink.attempts if b == failed for p, o, _, _ in rows)
    assert first and not (checkpoint / "commits" / str(failed)).exists()
    produce(bootstrap, topic, [Record(b"G%d" % i, partition=i % 2) for i in range(4)])
    ends = _log_end(bootstrap, topic, 2)
    _run(cluster_spark, options, sink, checkpoint, lambda: sink.count("G") >= 4 and sink.count("L") >= 4000)
    # The failed batch ran again with the same records; every offset of the log, once over the committed batches.
    again = [sorted((p, o) for p, o, _, _ in rows) for b, rows in sink.attempts if b == failed]
    assert len(again) == 2 and again[1] == first
    keys = sink.committed_keys(checkpoint)
    assert sorted(keys) == _every_offset(ends) and max(keys.values()) == 1
    assert all(b for _, rows in sink.attempts for _, _, b, v in rows if v.startswith("L"))


def test_a_worker_killed_mid_streaming_batch_loses_nothing(
    spark_cluster: SparkCluster,
    cluster_spark: SparkSession,
    bootstrap: str,
    topic_factory: TopicFactory,
    tmp_path: Path,
) -> None:
    """A chunk's batch runs a task on each worker; one worker JVM is SIGKILLed; Spark runs the task again."""
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    options = _options(bootstrap, topic, maxBackfillOffsetsPerTrigger="100000", backfillTasks="2")
    produce(bootstrap, topic, [Record(b"W%d" % i, partition=i % 2) for i in range(10)])
    warm = _GatedSink()
    _run(cluster_spark, options, warm, checkpoint, lambda: warm.count("W") >= 10)
    produce(bootstrap, topic, [Record(b"L%d" % i, partition=i % 2) for i in range(4000)])
    gate = tmp_path / "gate"
    gate.mkdir()
    sink = _GatedSink(gate)
    query = start_kafka_stream(cluster_spark, options, sink, str(checkpoint), trigger=TRIGGER)
    try:
        produce(bootstrap, topic, [Record(b"F%d" % i, partition=i % 2) for i in range(4)])
        at_kill = _kill_worker_under_running_tasks(spark_cluster, gate)

        def drained() -> bool:
            if query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            return sink.count("L") >= 4000 and sink.count("F") >= 4

        wait_for(drained, 240, 0.1, "the lag and the fresh records")
        query.processAllAvailable()
    finally:
        query.stop()
    assert len(_started(gate)) > at_kill
    keys = warm.committed_keys(checkpoint) + sink.committed_keys(checkpoint)
    assert sorted(keys) == _every_offset(_log_end(bootstrap, topic, 2)) and max(keys.values()) == 1


# ------------------------------------------------------------------ format("fastrecover")


def test_the_streaming_source_on_the_cluster_delivers_fresh_records_first_then_the_whole_lag(
    cluster_spark: SparkSession, bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """format("fastrecover"): plans in the driver's Python process, records read by Python workers of the
    executors (the pickled reader and its options, the per-worker consumer cache), the store (SQLite on a path
    every process shares) written by the driver only."""
    store_url = f"sqlite:///{tmp_path / 'fastrecover.db'}"
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    options = {
        "startingOffsets": "earliest",
        "fastrecover__backfill__min__offsets": 100,
        "maxBackfillOffsetsPerTrigger": 1500,
        "backfillTasks": 2,
        "freshWaitMs": 60_000,
    }
    produce(bootstrap, topic, [Record(f"early-{i}", partition=i % 2) for i in range(20)])
    before = Sink()
    query = start(stream(cluster_spark, bootstrap, topic, store_url, "cluster", **options), before, checkpoint)
    wait_rows(before, query, 20)
    query.processAllAvailable()
    query.stop()
    produce(bootstrap, topic, [Record(f"lag-{i}", partition=i % 2) for i in range(3000)])
    after = Sink()
    query = start(stream(cluster_spark, bootstrap, topic, store_url, "cluster", **options), after, checkpoint)
    try:
        wait_waiting_for_data(query)
        produce(bootstrap, topic, [Record(f"fresh-{i}", partition=i % 2) for i in range(10)])
        wait_rows(after, query, 3010)
        query.processAllAvailable()
    finally:
        query.stop()
    batches = [rows for _, rows in after.batches() if rows]
    assert batches[0] and all(r.value.startswith("fresh-") and not r.backfill for r in batches[0])
    assert all(r.backfill for rows in batches for r in rows if r.value.startswith("lag-"))
    rows = before.rows() + after.rows()
    assert sorted((r.partition, r.offset) for r in rows) == _every_offset(_log_end(bootstrap, topic, 2))


# ------------------------------------------------------------------ secrets


def test_store_and_kafka_secrets_stay_out_of_the_executors_logs_and_work_dirs(
    spark_cluster: SparkCluster,
    cluster_spark: SparkSession,
    bootstrap: str,
    topic_factory: TopicFactory,
    unique_group: str,
    pg_url: str,
    pg_admin_engine: Any,
    tmp_path: Path,
) -> None:
    """A ranges job and a start_kafka_stream run whose options carry a store password and SASL/SSL secrets
    (unused on this PLAINTEXT broker, so the clients hold them and log their configuration): no secret is
    in any file under the workers' work directories (executors' stdout/stderr) nor in the workers' logs."""
    secrets = {name: f"{name}-{uuid.uuid4().hex}" for name in ("storepw", "saslpw", "jaaspw", "sslpw")}
    # A PostgreSQL URL with a password (the test server trusts 127.0.0.1, so the password is carried, not checked).
    name = f"fr_test_{uuid.uuid4().hex[:16]}"
    with pg_admin_engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        base = make_url(pg_url).set(database=name)
        if base.password:
            secrets["storepw"] = str(base.password)
        store_url = base.set(password=secrets["storepw"]).render_as_string(hide_password=False)
        topic = topic_factory(partitions=2)
        starts, by_consumer = _open_group_ranges(bootstrap, topic, unique_group, store_url, 2, 500)
        df = _ranges_reader(
            cluster_spark,
            bootstrap,
            store_url,
            unique_group,
            2,
            **{"kafka.sasl.username": "user", "kafka.sasl.password": secrets["saslpw"]},
        ).load()
        rows = df.select("partition", "offset").collect()
        lag = _every_offset(_log_end(bootstrap, topic, 2), starts)
        assert set(lag) <= {(r.partition, r.offset) for r in rows} | set(by_consumer)
        assert len(complete_ranges(store_url, unique_group).completed) == 2
    finally:
        with pg_admin_engine.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    checkpoint = tmp_path / "checkpoint"
    options = _options(
        bootstrap,
        topic,
        backfillTasks="2",
        **{
            "kafka.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="user" password="{secrets["jaaspw"]}";'
            ),
            "kafka.ssl.truststore.password": secrets["sslpw"],
        },
    )
    sink = _GatedSink()
    _run(cluster_spark, options, sink, checkpoint, lambda: len(sink.committed_keys(checkpoint)) >= 2 * 510)

    files = [*spark_cluster.executor_logs(), *spark_cluster.worker_logs()]
    stderr = [f for f in files if f.name == "stderr"]
    assert len(stderr) >= 2, f"no executor stderr among {files}"
    # The secrets reached the executors' Kafka clients, which logged their configuration with them masked: the
    # check reads the files the secrets would be in.
    logged = "".join(f.read_text(errors="replace") for f in stderr)
    assert "sasl.jaas.config = [hidden]" in logged and "ssl.truststore.password = [hidden]" in logged
    found = [(label, str(f)) for f in files for label, secret in secrets.items() if secret.encode() in f.read_bytes()]
    assert found == []
