"""The benchmark scenarios, each against the real broker (and the real stores).

* :func:`restart_run`: one restart after a lag of L records, in a consumer
  process (plain confluent_kafka.Consumer or fastrecover): time to fresh data,
  time to drain, RSS.  Feeds the ``ttf``, ``drain`` and ``memory`` figures.
* :func:`steady_once`: consume a pre-filled topic with no crash and no open
  range, in this process, committing as one pattern of the matrix does:
  records/s and caller-thread CPU per record.
* :func:`store_once`: backfill commits straight to a RangeStore: per-message
  and batched, commits/s and per-commit latency.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Producer, TopicPartition

from fastrecover.ranges import RangeProgress
from fastrecover.store import ProgressUpdate, open_store, upgrade
from fastrecover_tools.testing.broker import create_topic, delete_topic
from fastrecover_tools.testing.driver import EventProcess, SteadyProducer
from fastrecover_tools.testing.waiting import wait_for

log = logging.getLogger("fastrecover_tools.bench")

PARTITIONS = 6
VALUE_SIZE = 100
LIVE_RATE = 1000  # live records/s produced from the restart on
RUN_TIMEOUT_S = 900.0
KILL_GRACE_S = 1.0

#: A high-throughput producer for building the lag before the restart.
FAST_PRODUCER = {
    "linger.ms": 50,
    "batch.size": 1_000_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "acks": 1,
}


def _values(count: int = 4096, size: int = VALUE_SIZE, seed: int = 333) -> list[bytes]:
    """A pool of random (incompressible) values, so lz4 does not shrink the fetches unrealistically."""
    rnd = random.Random(seed)
    return [rnd.randbytes(size) for _ in range(count)]


def produce_fast(bootstrap: str, topic: str, count: int, partitions: int = PARTITIONS) -> float:
    """Produce ``count`` records round-robin over the partitions as fast as possible; returns records/s."""
    producer = Producer({"bootstrap.servers": bootstrap, **FAST_PRODUCER})
    pool = _values()
    started = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, pool[i % len(pool)], partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 20_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise TimeoutError(f"{left} records to {topic} still undelivered after 120 s")
    return count / max(1e-9, time.perf_counter() - started)


def commit_offsets(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit ``offsets`` for the group without joining it (the consumer's last checkpoint)."""
    consumer = RawConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def log_ends(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    consumer = RawConsumer({"bootstrap.servers": bootstrap, "group.id": f"bench-probe-{uuid.uuid4().hex[:8]}"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        consumer.close()


def _tail(log_file: TextIO | None, lines: int = 15) -> str:
    """The last lines the workers wrote to stderr: why a worker died, for the error message."""
    name = getattr(log_file, "name", None)
    if not isinstance(name, str):
        return ""
    try:
        log_file.flush()  # type: ignore[union-attr]
        with open(name, errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError:
        return ""


def _wait_event(proc: EventProcess, name: str, timeout: float, log_file: TextIO | None = None) -> dict[str, Any]:
    def seen() -> dict[str, Any]:
        event = proc.event(name)
        if event is None and not proc.alive():
            raise RuntimeError(
                f"bench worker exited (code {proc.proc.returncode}) before '{name}'; its stderr ends:\n"
                + _tail(log_file)
            )
        return event or {}

    return wait_for(seen, timeout, 0.005, f"the bench worker's '{name}' event")


@dataclass(frozen=True)
class RestartSpec:
    bootstrap: str
    lag: int
    mode: str  # "plain" or "fastrecover"
    store_url: str
    partitions: int = PARTITIONS
    live_rate: int = LIVE_RATE
    work_us: int = 0
    pattern: str = "auto"
    timeout_s: float = RUN_TIMEOUT_S  # for each of lag drained, then drained; past it the run fails


@contextmanager
def _store_url_in_environment(url: str | None) -> Iterator[None]:
    """Hand the store URL to the worker through its environment: argv is visible to every user in ``ps``."""
    from fastrecover_tools.bench.worker import STORE_URL_ENV

    before = os.environ.get(STORE_URL_ENV)
    if url is None:
        os.environ.pop(STORE_URL_ENV, None)
    else:
        os.environ[STORE_URL_ENV] = url
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(STORE_URL_ENV, None)
        else:
            os.environ[STORE_URL_ENV] = before


def restart_run(spec: RestartSpec, log_file: TextIO) -> dict[str, Any]:
    """One restart after a lag of ``spec.lag`` records; all times in seconds from the process start."""
    tag = uuid.uuid4().hex[:6]
    topic, group = f"bench-{spec.mode}-{spec.lag}-{tag}", f"bench-{spec.mode}-{tag}"
    setup = time.monotonic()
    create_topic(spec.bootstrap, topic, spec.partitions)
    try:
        # The consumer's last checkpoint is the log start; everything produced after it is the lag.
        commit_offsets(spec.bootstrap, group, topic, dict.fromkeys(range(spec.partitions), 0))
        produce_rate = produce_fast(spec.bootstrap, topic, spec.lag, spec.partitions)
        lag_end = log_ends(spec.bootstrap, topic, spec.partitions)
        lag = sum(lag_end.values())
        args = [
            "--bootstrap",
            spec.bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--mode",
            spec.mode,
            "--lag-end",
            ",".join(f"{p}:{o}" for p, o in lag_end.items()),
            "--work-us",
            str(spec.work_us),
            "--pattern",
            spec.pattern,
        ]
        if spec.mode == "fastrecover" and spec.store_url:
            # The consumer that crashed had created its store: a restart finds the schema in place
            # (creating it imports Alembic and runs the migration, ~0.5 s, once per store, not per restart).
            upgrade(spec.store_url)
        restart = time.time()
        setup_s = time.monotonic() - setup
        with _store_url_in_environment(spec.store_url if spec.mode == "fastrecover" else None):
            worker = EventProcess("fastrecover_tools.bench.worker", args, log_file, stdin=True)
        live = SteadyProducer(spec.bootstrap, topic, spec.live_rate, value_size=VALUE_SIZE, partitions=spec.partitions)
        live.start()
        stopped = False
        try:
            _wait_event(worker, "lag_drained", spec.timeout_s, log_file)
            live.stop()
            stopped = True
            live_total = sum(log_ends(spec.bootstrap, topic, spec.partitions).values()) - lag
            worker.tell(f"live {live_total}")
            drained = _wait_event(worker, "drained", spec.timeout_s, log_file)
            _wait_event(worker, "stats", 30, log_file)
        finally:
            if not stopped:
                live.stop()
            teardown = time.monotonic()
            # The worker has reported everything: a graceful close only costs matrix time (it may wait
            # on thousands of in-flight commits), so it gets a few seconds, then SIGKILL.
            worker.kill(signal.SIGTERM, timeout=KILL_GRACE_S)
        ev = {
            name: worker.event(name) for name in ("started", "subscribed", "joined", "assigned", "fresh", "lag_drained")
        }
        stats = worker.event("stats") or {}
        missing = [name for name, e in ev.items() if e is None]
        if missing:
            raise RuntimeError(f"bench worker reported no {', '.join(missing)} event(s)")
        t = {name: float(e["t"]) for name, e in ev.items() if e is not None}
        t["drained"] = float(drained["t"])
        cpu_end, cpu_start = drained.get("cpu"), (ev["subscribed"] or {}).get("cpu")
        return {
            "lag": lag,
            "live": live_total,
            "produce_records_per_s": round(produce_rate),
            "setup_s": round(setup_s, 3),
            "teardown_s": round(time.monotonic() - teardown, 3),
            "started_s": t["started"] - restart,
            "join_s": t["joined"] - restart,
            "recovery_s": t["assigned"] - t["joined"],
            "total_s": t["fresh"] - restart,
            "replay_s": t["fresh"] - t["joined"],
            "lag_drained_s": t["lag_drained"] - restart,
            "drain_s": t["drained"] - restart,
            # From just before subscribe(): group join and fastrecover's recovery count for both consumers.
            "records_per_s": (lag + live_total) / max(1e-9, t["drained"] - t["subscribed"]),
            # the application's thread, over the same span: what a consumer costs the thread that also
            # processes the records (a drain without work is paced by the network as much as by it)
            "cpu_us_per_record": (
                (float(cpu_end) - float(cpu_start)) * 1e6 / max(1, lag + live_total)
                if cpu_end is not None and cpu_start is not None
                else None
            ),
            "base_rss_mib": stats.get("base_rss_mib"),
            "peak_rss_mib": stats.get("peak_rss_mib"),
            "growth_mib": (stats["peak_rss_mib"] - stats["base_rss_mib"]) if "peak_rss_mib" in stats else None,
            "max_child_queue": stats.get("max_child_queue") if spec.mode == "fastrecover" else None,
            "assignments": stats.get("assignments"),
            "rss_series": stats.get("series", []),
        }
    finally:
        try:
            delete_topic(spec.bootstrap, topic)
        except Exception as exc:  # a leftover topic must not lose the measurements
            log.warning("could not delete %s: %s", topic, exc)


# -- steady state -----------------------------------------------------------------------------------


def steady_run(
    bootstrap: str,
    topic: str,
    mode: str,
    api: str,
    pattern: str,
    records: int,
    store_url: str,
    timeout_s: float,
    log_file: TextIO,
) -> dict[str, float]:
    """One steady-state run in its own process (``python -m fastrecover_tools.bench.steady``).

    A process per run: no run inherits another's librdkafka threads or heap,
    and the process exits without ``close()``, which waits for every commit
    still in flight (minutes, after a million async commits on a busy broker)
    and measures nothing.
    """
    args = ["--bootstrap", bootstrap, "--topic", topic, "--mode", mode, "--api", api, "--pattern", pattern]
    args += ["--records", str(records), "--timeout", str(timeout_s)]
    with _store_url_in_environment(store_url if mode == "fastrecover" else None):
        worker = EventProcess("fastrecover_tools.bench.steady", args, log_file)
    try:
        event = _wait_event(worker, "result", timeout_s + 90, log_file)
    finally:
        worker.kill(signal.SIGKILL, timeout=30)
    if "error" in event:
        raise RuntimeError(str(event["error"]))
    return {k: float(event[k]) for k in ("records_per_s", "cpu_us_per_record", "process_cpu_us_per_record", "records")}


# -- store ------------------------------------------------------------------------------------------


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def _timed(calls: int, one: Callable[[int], None]) -> dict[str, float]:
    latencies: list[float] = []
    started = time.perf_counter()
    for i in range(calls):
        t0 = time.perf_counter()
        one(i)
        latencies.append(time.perf_counter() - t0)
    total = time.perf_counter() - started
    return {
        "commits_per_s": calls / total,
        "p50_ms": _percentile(latencies, 50) * 1e3,
        "p99_ms": _percentile(latencies, 99) * 1e3,
    }


def store_once(
    url: str, per_message: int, batched: int, batch_records: int = 500, ranges: int = PARTITIONS
) -> dict[str, dict[str, float]]:
    """Commit backfill progress the way the consumer does, straight to the store.

    per-message: one transaction per record (``commit(message=...)`` of a
    backfill record), round-robin over ``ranges`` open ranges.  batched: one
    transaction per ``batch_records`` records spread over all ranges (what a
    ``commit()`` after ``consume(500)`` writes).
    """
    owner = f"bench-{uuid.uuid4().hex[:6]}"
    group = f"bench-store-{uuid.uuid4().hex[:8]}"
    size = 10**9
    with open_store(url) as store:
        tokens = [store.create_range(group, "bench-store", p, 0, size, owner) for p in range(ranges)]
        committed = [0] * ranges

        def update(r: int) -> ProgressUpdate:
            t = tokens[r]
            return ProgressUpdate(t.id, owner, t.epoch, RangeProgress(0, size, committed[r]))

        def one_record(i: int) -> None:
            r = i % ranges
            committed[r] += 1
            store.commit_progress([update(r)])

        def one_batch(_i: int) -> None:
            share = -(-batch_records // ranges)
            for r in range(ranges):
                committed[r] += share
            store.commit_progress([update(r) for r in range(ranges)])

        per = _timed(per_message, one_record)
        per["records_per_s"] = per["commits_per_s"]
        bat = _timed(batched, one_batch)
        bat["records_per_s"] = bat["commits_per_s"] * batch_records
        return {"per_message": per, "batched": bat}


def sqlite_url(workdir: Path) -> str:
    return f"sqlite:///{workdir / 'bench-store.db'}"


def store_settings(url: str) -> dict[str, Any]:
    """Durability settings that decide commit latency, recorded next to the figures."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                return {
                    "sqlite_version": conn.exec_driver_sql("select sqlite_version()").scalar(),
                    "journal_mode": conn.exec_driver_sql("pragma journal_mode").scalar(),
                    "synchronous": conn.exec_driver_sql("pragma synchronous").scalar(),
                }
            return {
                k: conn.execute(text(f"show {k}")).scalar() for k in ("server_version", "fsync", "synchronous_commit")
            }
    finally:
        engine.dispose()


class ThrowawayPostgres:
    """A database created on the server of ``url`` for the run, and dropped afterwards."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url

        self.name = f"fastrecover_bench_{uuid.uuid4().hex[:10]}"
        self._admin = create_engine(url, isolation_level="AUTOCOMMIT")
        self.url = make_url(url).set(database=self.name).render_as_string(hide_password=False)

    def __enter__(self) -> str:
        from sqlalchemy import text

        with self._admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.name}"'))
        return self.url

    def __exit__(self, *exc: object) -> None:
        from sqlalchemy import text

        try:
            with self._admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        finally:
            self._admin.dispose()


def workdir_filesystem(path: Path) -> str:
    """The filesystem type under ``path`` (from /proc/mounts; 'unknown' elsewhere)."""
    try:
        best, kind = "", "unknown"
        real = os.path.realpath(path)
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 2 and real.startswith(parts[1]) and len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
        return kind
    except OSError:
        return "unknown"
