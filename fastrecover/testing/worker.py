"""A consumer *process* for crash tests, the demo and the chaos driver.

It consumes a topic like a real application, appends every record it finishes
to a ledger file (``topic partition offset source``), commits the way it is
told, and reports milestones as JSON lines on stdout so a driver can wait on
them and then SIGKILL it at exactly the moment a test needs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any, TextIO

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Message, TopicPartition

from fastrecover.consumer import Consumer


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
    sys.stdout.flush()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fastrecover.testing.worker")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True, action="append", help="repeat for several topics")
    p.add_argument("--group", required=True)
    p.add_argument("--parallel", action="store_true", help="enable.parallel.rebalance")
    p.add_argument("--plain", action="store_true", help="use confluent_kafka.Consumer itself (baseline)")
    p.add_argument("--store-url")
    p.add_argument("--min-offsets", type=int, default=1)
    p.add_argument("--ledger", required=True, help="append-only file of finished records")
    p.add_argument(
        "--commit",
        choices=["message", "sync", "async", "auto", "none"],
        default="sync",
        help="message: commit(message) per record; sync/async: commit() every --commit-every; "
        "auto: enable.auto.commit",
    )
    p.add_argument("--commit-every", type=int, default=100)
    p.add_argument(
        "--commit-at",
        type=int,
        action="append",
        default=[],
        help="commit(offsets=[o]) once the record at o-1 is finished (single partition)",
    )
    p.add_argument("--block-at", type=int, help="stop making progress once the record at N-1 is finished")
    p.add_argument("--work-us", type=int, default=0, help="simulated processing time per record")
    p.add_argument("--session-ms", type=int, default=3000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument(
        "--first-fresh-after",
        type=float,
        help="report the first record whose produce timestamp (ms) is at or after this epoch time",
    )
    return p.parse_args(argv)


def run(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": args.session_ms,
        "heartbeat.interval.ms": max(100, args.session_ms // 6),
        "enable.auto.commit": args.commit == "auto",
        "auto.commit.interval.ms": 500,
    }
    if args.parallel:
        config.update(
            {
                "enable.parallel.rebalance": True,
                "fastrecover.backfill.min.offsets": args.min_offsets,
            }
        )
        if args.store_url:
            config["fastrecover.store.url"] = args.store_url
    consumer: Any = PlainConsumer(config) if args.plain else Consumer(config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def on_assign(c: Any, partitions: list[Any]) -> None:
        _emit("assigned", partitions=[[tp.topic, tp.partition, tp.offset] for tp in partitions])

    consumer.subscribe(args.topic, on_assign=on_assign)
    _emit("started", pid=os.getpid(), parallel=args.parallel)
    finished = 0
    fresh_seen = False
    commit_at = set(args.commit_at)
    with open(args.ledger, "a", buffering=1) as ledger:
        while not stop.is_set():
            batch = consumer.consume(args.batch, 0.2)
            done: list[Message] = []
            for msg in batch:
                if msg.error() is not None:
                    continue
                _process(msg, args.work_us, ledger)
                done.append(msg)
                finished += 1
                offset = msg.offset() or 0
                if args.first_fresh_after is not None and not fresh_seen:
                    _ts_type, ts = msg.timestamp()
                    if ts >= args.first_fresh_after * 1000:
                        fresh_seen = True
                        _emit("fresh", offset=offset, partition=msg.partition(), produced_ms=ts)
                if args.commit == "message":
                    consumer.commit(message=msg, asynchronous=False)
                if offset + 1 in commit_at:
                    consumer.commit(
                        offsets=[TopicPartition(msg.topic(), msg.partition(), offset + 1)], asynchronous=False
                    )
                    _emit("committed", offset=offset + 1)
                if args.block_at is not None and offset + 1 >= args.block_at:
                    ledger.flush()
                    _emit("blocked", offset=offset + 1, finished=finished)
                    stop.wait()  # the driver SIGKILLs us here: the crash at offset block_at
                    return 0
            if done and args.commit in ("sync", "async") and finished % args.commit_every < len(done):
                consumer.commit(asynchronous=args.commit == "async")
            if done:
                _emit("progress", finished=finished) if finished % 1000 < len(done) else None
    consumer.close()
    _emit("closed", finished=finished)
    return 0


def _process(msg: Message, work_us: int, ledger: TextIO) -> None:
    if work_us:
        end = time.perf_counter() + work_us / 1e6
        while time.perf_counter() < end:
            pass
    ledger.write(f"{msg.topic()} {msg.partition()} {msg.offset()}\n")


if __name__ == "__main__":
    sys.exit(run())
