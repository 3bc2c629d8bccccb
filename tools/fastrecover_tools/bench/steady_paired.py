"""The steady state's cost per record, plain and fastrecover interleaved in one process.

``python -m fastrecover_tools.bench.steady_paired``: the steady-state run of ``fastrecover bench``
reads the whole topic with one consumer, then with the other, a few seconds each.  On a shared
2-core virtual machine the caller's CPU per record of the *same* consumer then varies by 20-35 %
from one run to the next, more than any difference worth finding.  Here both consumers (a plain
``confluent_kafka.Consumer`` and a mode-on ``fastrecover.Consumer``, each in a group of its own, on
the same pre-filled topic) run in one thread, in short alternating segments (ABAB...), and each
segment's CPU time of this thread is taken.  Whatever the machine does on a scale longer than
a segment (a fraction of a second) moves both members of a pair alike, so the ratio of each pair
is what is reported: its median, and the spread of the pairs.

Commit pattern: auto-commit (the README quickstart's).  No record is processed beyond ``value()``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer as RawConsumer

from fastrecover_tools.bench.scenarios import produce_fast
from fastrecover_tools.testing.broker import create_topic

PARTITIONS = 3


def _consumers(bootstrap: str, topic: str, store_url: str) -> dict[str, Any]:
    from fastrecover import Consumer

    base = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest", "enable.auto.commit": True}
    tag = uuid.uuid4().hex[:8]
    made = {
        "plain": RawConsumer({**base, "group.id": f"paired-plain-{tag}", "group.instance.id": f"plain-{tag}"}),
        "fastrecover": Consumer(
            {
                **base,
                "group.id": f"paired-fr-{tag}",
                "group.instance.id": f"fr-{tag}",
                "enable.parallel.rebalance": True,
                "fastrecover.store.url": store_url,
            }
        ),
    }
    for consumer in made.values():
        consumer.subscribe([topic])
    return made


def _reader(consumer: Any, api: str, batch: int) -> Callable[[int], int]:
    """A function reading ``n`` records (what an application's loop does at least), returning how many came."""
    if api == "poll":

        def read(n: int) -> int:
            got = 0
            while got < n:
                msg = consumer.poll(1.0)
                if msg is None:
                    break
                if msg.error() is None:
                    msg.value()
                    got += 1
            return got

    else:

        def read(n: int) -> int:
            got = 0
            while got < n:
                msgs = consumer.consume(batch, 1.0)
                if not msgs:
                    break
                for msg in msgs:
                    if msg.error() is None:
                        msg.value()
                        got += 1
            return got

    return read


def run(
    bootstrap: str, api: str, segments: int, segment_records: int, store_url: str, batch: int = 500
) -> dict[str, Any]:
    """``segments`` pairs of ``segment_records`` records each; the caller's CPU per record of every segment."""
    topic = f"bench-paired-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    # every consumer reads a warm-up segment plus its segments; a little more so the last fetch is never short
    produce_fast(bootstrap, topic, (segments + 2) * segment_records, PARTITIONS)
    consumers = _consumers(bootstrap, topic, store_url)
    readers = {name: _reader(c, api, batch) for name, c in consumers.items()}
    deadline = time.monotonic() + 60
    for name, read in readers.items():  # the join and the first fetches, outside the clocks
        while read(segment_records // 10) == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: no record within 60 s")
    cpu: dict[str, list[float]] = {name: [] for name in readers}
    for i in range(segments):
        order = list(readers) if i % 2 == 0 else list(reversed(readers))  # ABBA: neither always goes first
        for name in order:
            start = time.thread_time()
            got = readers[name](segment_records)
            took = time.thread_time() - start
            if got < segment_records:
                raise RuntimeError(f"{name}: {got} of {segment_records} records in segment {i + 1}")
            cpu[name].append(took * 1e6 / segment_records)
    for consumer in consumers.values():
        consumer.close()
    ratios = [p / f for p, f in zip(cpu["plain"], cpu["fastrecover"], strict=True)]
    # A segment's CPU varies by tens of percent (when librdkafka frees a fetch buffer, whose records the
    # caller's thread releases, is luck): the figure is the ratio of the sums, and its spread the ratio of
    # each fifth of the run.
    fifth = max(1, segments // 5)
    parts = [
        sum(cpu["plain"][i : i + fifth]) / sum(cpu["fastrecover"][i : i + fifth])
        for i in range(0, segments - fifth + 1, fifth)
    ]
    return {
        "plain_over_fastrecover_total": round(sum(cpu["plain"]) / sum(cpu["fastrecover"]), 4),
        "plain_over_fastrecover_fifths": [round(x, 4) for x in parts],
        "api": api,
        "segments": segments,
        "segment_records": segment_records,
        "cpu_us_per_record": {name: _stats(v) for name, v in cpu.items()},
        "plain_over_fastrecover": _stats(ratios),
        "pairs": [round(r, 4) for r in ratios],
    }


def _stats(values: Sequence[float]) -> dict[str, float]:
    median = statistics.median(values)
    q = statistics.quantiles(values, n=4)
    return {
        "median": round(median, 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "iqr_spread": round((q[2] - q[0]) / median, 4),
        "spread": round((max(values) - min(values)) / median, 4),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastrecover_tools.bench.steady_paired", description=__doc__)
    parser.add_argument("--bootstrap", help="Kafka's bootstrap servers (default: a local broker from jars)")
    parser.add_argument("--api", default="poll,consume", help="comma-separated: poll, consume")
    parser.add_argument("--segments", type=int, default=30, help="segment pairs per api (default 30)")
    parser.add_argument("--segment-records", type=int, default=20_000, help="records per segment (default 20,000)")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    broker = None
    if not args.bootstrap:
        from fastrecover_tools.testing.broker import select_broker

        broker = select_broker()
        args.bootstrap = broker.bootstrap
    out: dict[str, Any] = {}
    with __import__("tempfile").TemporaryDirectory(prefix="fastrecover-paired-") as tmp:
        for api in [a.strip() for a in args.api.split(",") if a.strip()]:
            out[api] = run(args.bootstrap, api, args.segments, args.segment_records, f"sqlite:///{tmp}/store.db")
            total, fifths = out[api]["plain_over_fastrecover_total"], out[api]["plain_over_fastrecover_fifths"]
            print(
                f"{api}: plain CPU / fastrecover CPU per record over {args.segments} segment pairs {total:.3f}; "
                f"each fifth of the run {min(fifths):.3f}-{max(fifths):.3f}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    if broker is not None:
        broker.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
