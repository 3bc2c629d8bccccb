"""A partition with no committed offset beside partitions that have one: do its replay's records hold up the others?

``python -m fastrecover_tools.bench.uncommitted`` fills partition 0 of a new 3-partition topic with a
backlog and commits partitions 1 and 2 at their log end, as a group whose commits for one partition
never landed before a crash. Each run then starts a consumer of a new group
(``auto.offset.reset=earliest``, static membership) while a producer writes fresh records to
partitions 1 and 2, and the consumer does ``--work-us`` of CPU work per record for ``--window`` seconds.
It records the time from ``subscribe()`` to the first fresh record and the delivery latency of every
fresh record (now minus its produce timestamp): its median, 99th percentile and maximum.

Modes, interleaved per repeat: ``plain`` (confluent_kafka), ``fastrecover`` (the library's default:
the log start of partition 0 is its checkpoint, a large backlog goes to the child) and
``fastrecover-replay`` (``fastrecover.backfill.min.offsets`` above the backlog: the primary replays
partition 0 as plain does). One SQLite store serves every fastrecover run, its schema made before the
first one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Producer, TopicPartition

MODES = ("plain", "fastrecover", "fastrecover-replay")
FRESH = b"F"
#: the partitions with a committed offset; partition 0 has none
CHECKPOINTED = (1, 2)


def _fill(bootstrap: str, topic: str, backlog: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    payload = b"o" * 100
    for _ in range(backlog):
        while True:
            try:
                producer.produce(topic, payload, partition=0)
                break
            except BufferError:
                producer.poll(0.05)
    for partition in CHECKPOINTED:
        for _ in range(100):
            producer.produce(topic, b"s", partition=partition)
    if producer.flush(120):
        raise RuntimeError("the backlog was not delivered in 120 s")


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _commit_checkpoints(bootstrap: str, group: str, topic: str) -> None:
    """Partitions 1 and 2 committed at their log end; partition 0 left without a committed offset."""
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        ends = [plain.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in CHECKPOINTED]
        plain.commit(
            offsets=[TopicPartition(topic, p, end) for p, end in zip(CHECKPOINTED, ends, strict=True)],
            asynchronous=False,
        )
    finally:
        plain.close()


def _consumer(mode: str, bootstrap: str, group: str, store_url: str, backlog: int) -> Any:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.instance.id": group,
        "session.timeout.ms": 10000,
        "auto.offset.reset": "earliest",
    }
    if mode == "plain":
        return PlainConsumer(conf)
    from fastrecover import Consumer

    conf.update({"enable.parallel.rebalance": True, "fastrecover.store.url": store_url})
    if mode == "fastrecover-replay":
        conf["fastrecover.backfill.min.offsets"] = backlog + 1
    return Consumer(conf)


def run_once(
    mode: str, bootstrap: str, topic: str, store_url: str, backlog: int, work_s: float, window_s: float
) -> dict[str, float]:
    """One consumer of a new group for ``window_s`` seconds: first fresh record and fresh latencies."""
    group = f"uncommitted-{mode}-{uuid.uuid4().hex[:8]}"
    _commit_checkpoints(bootstrap, group, topic)
    consumer = _consumer(mode, bootstrap, group, store_url, backlog)
    stop = threading.Event()

    def produce_fresh() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        while not stop.is_set():
            for partition in CHECKPOINTED:
                producer.produce(topic, FRESH, partition=partition)
            producer.poll(0)
            stop.wait(0.002)
        producer.flush(10)

    writer = threading.Thread(target=produce_fresh, name="fresh-producer")
    began = time.monotonic()
    consumer.subscribe([topic])
    writer.start()
    first: float | None = None
    latencies: list[float] = []
    try:
        while time.monotonic() - began < window_s:
            for msg in consumer.consume(500, 0.1):
                if msg.error() is None and msg.partition() in CHECKPOINTED and msg.value() == FRESH:
                    if first is None:
                        first = time.monotonic() - began
                    latencies.append(time.time() - msg.timestamp()[1] / 1000.0)
                if work_s:
                    _busy(work_s)
    finally:
        stop.set()
        writer.join()
        consumer.close()
    if first is None or not latencies:
        raise RuntimeError(f"{mode}: no fresh record in {window_s:g} s")
    latencies.sort()
    return {
        "first_fresh_s": round(first, 3),
        "fresh_latency_p50_s": round(latencies[len(latencies) // 2], 3),
        "fresh_latency_p99_s": round(latencies[int(len(latencies) * 0.99)], 3),
        "fresh_latency_max_s": round(latencies[-1], 3),
    }


def _stats(values: Sequence[float]) -> dict[str, float]:
    median = statistics.median(values)
    return {
        "median": round(median, 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "spread": round((max(values) - min(values)) / median, 2) if median else 0.0,
    }


def run(bootstrap: str, backlog: int, repeats: int, work_us: int, window_s: float) -> dict[str, Any]:
    from fastrecover import Consumer
    from fastrecover_tools.testing.broker import create_topic

    with tempfile.TemporaryDirectory(prefix="fastrecover-uncommitted-") as tmp:
        store_url = f"sqlite:///{Path(tmp) / 'ranges.db'}"
        # the store's schema is made once, before any measured run
        schema_conf = {"bootstrap.servers": bootstrap, "group.id": "schema", "fastrecover.store.url": store_url}
        Consumer({**schema_conf, "enable.parallel.rebalance": True}).close()
        topic = f"uncommitted-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, partitions=3)
        _fill(bootstrap, topic, backlog)
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for rep in range(repeats):
            for mode in MODES if rep % 2 == 0 else tuple(reversed(MODES)):
                runs[mode].append(run_once(mode, bootstrap, topic, store_url, backlog, work_us / 1e6, window_s))
                print(f"[uncommitted] repeat {rep + 1}/{repeats} {mode:18s} {runs[mode][-1]}", flush=True)
    summary = {mode: {metric: _stats([r[metric] for r in rs]) for metric in rs[0]} for mode, rs in runs.items()}
    return {
        "backlog": backlog,
        "work_us": work_us,
        "window_s": window_s,
        "repeats": repeats,
        "load_average": os.getloadavg(),
        "summary": summary,
        "runs": runs,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastrecover_tools.bench.uncommitted", description=__doc__)
    parser.add_argument("--bootstrap", default=os.environ.get("FASTRECOVER_BOOTSTRAP"), required=False)
    parser.add_argument("--backlog", type=int, default=300_000, help="records of partition 0 (default 300,000)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work-us", type=int, default=50, help="CPU work per record (default 50 µs)")
    parser.add_argument("--window", type=float, default=8.0, help="seconds each consumer runs (default 8)")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    if not args.bootstrap:
        parser.error("--bootstrap or FASTRECOVER_BOOTSTRAP is required (make broker prints one)")
    result = run(args.bootstrap, args.backlog, args.repeats, args.work_us, args.window)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
