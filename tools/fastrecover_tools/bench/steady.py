"""One steady-state run, in its own process (``python -m fastrecover_tools.bench.steady``).

Reads a pre-filled topic with a new group (nothing committed: with the mode on,
fastrecover opens no range), committing as one pattern of the matrix does, and
prints one JSON line ``{"event": "result", ...}``.  Then it leaves with
``os._exit``: a ``close()`` would wait for every commit still in flight, which
measures nothing and can take minutes.  The store URL comes in the environment
(:data:`fastrecover_tools.bench.worker.STORE_URL_ENV`), never in argv.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer as RawConsumer

from fastrecover_tools.bench import profiling
from fastrecover_tools.bench.patterns import BATCH, PATTERNS, consumer_config, hooks
from fastrecover_tools.bench.worker import STORE_URL_ENV

_ALIVE: list[Any] = []


def make_steady_consumer(mode: str, pattern: str, bootstrap: str, store_url: str) -> Any:
    """A consumer in a new group (nothing committed: with the mode on, no range opens)."""
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-steady-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        **consumer_config(pattern),
    }
    if mode == "plain":
        return RawConsumer(conf)
    from fastrecover import Consumer

    return Consumer({**conf, "enable.parallel.rebalance": True, "fastrecover.store.url": store_url})


def steady_once(
    bootstrap: str, topic: str, mode: str, api: str, pattern: str, records: int, store_url: str
) -> dict[str, float]:
    """Read ``records`` records of a pre-filled topic; the clocks start at the first record (join excluded).

    The loop is what every application does at least: check error(), read
    value(), then commit as ``pattern`` says.  Measured: wall clock, the CPU
    time of this (the caller's) thread, which other load on the machine barely
    moves, and the CPU of the whole process (librdkafka's threads included).
    Nothing else runs in the loop: the time limit is a watchdog thread (see :func:`main`).
    """
    consumer = make_steady_consumer(mode, pattern, bootstrap, store_url)
    # Kept referenced until os._exit: the consumer's deallocation would close it, waiting for in-flight commits.
    _ALIVE.append(consumer)
    on_message, on_batch = hooks(consumer, pattern)
    consumer.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 60
    while got == 0:  # the group join, excluded from the clocks: up to the first record
        if time.monotonic() > deadline:
            raise TimeoutError(f"steady {mode}/{api}/{pattern}: no record within 60 s")
        batch = consumer.consume(1, 0.5)
        for msg in batch:
            if msg.error() is None:
                msg.value()
                if on_message is not None:
                    on_message(msg)
                got += 1
        if batch and on_batch is not None:
            on_batch()
    first = got
    wall0, cpu0, proc0 = time.perf_counter(), time.thread_time(), time.process_time()
    if api == "poll":
        poll = consumer.poll
        while got < records:
            msg = poll(1.0)
            if msg is None or msg.error() is not None:
                continue
            msg.value()
            if on_message is not None:
                on_message(msg)
            got += 1
    else:
        consume = consumer.consume
        while got < records:
            batch = consume(BATCH, 1.0)
            for msg in batch:
                if msg.error() is not None:
                    continue
                msg.value()
                if on_message is not None:
                    on_message(msg)
                got += 1
            if batch and on_batch is not None:
                on_batch()
    wall = time.perf_counter() - wall0
    cpu, proc = time.thread_time() - cpu0, time.process_time() - proc0
    measured = got - first
    if measured <= 0:
        raise ValueError(f"steady {mode}/{api}/{pattern}: nothing measured ({records} records asked, {got} read)")
    return {
        "records_per_s": measured / wall,
        "cpu_us_per_record": cpu / measured * 1e6,
        "process_cpu_us_per_record": proc / measured * 1e6,
        "records": measured,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fastrecover_tools.bench.steady")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--mode", choices=["plain", "fastrecover"], required=True)
    p.add_argument("--api", choices=["poll", "consume"], required=True)
    p.add_argument("--pattern", choices=sorted(PATTERNS), required=True)
    p.add_argument("--records", type=int, required=True)
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    # The time limit, without a clock read in the measured loop: a thread that reports and ends the process.
    limit = f"TimeoutError: {args.records:,} records not read within {args.timeout:.0f} s"
    watchdog = threading.Timer(args.timeout, _report_and_exit, ({"event": "result", "error": limit},))
    watchdog.daemon = True
    watchdog.start()
    event: dict[str, Any]
    profiler = profiling.start()
    try:
        result = steady_once(
            args.bootstrap,
            args.topic,
            args.mode,
            args.api,
            args.pattern,
            args.records,
            os.environ.get(STORE_URL_ENV, ""),
        )
        event = {"event": "result", **result}
    except Exception as exc:  # reported to the driver, which records the run as failed
        event = {"event": "result", "error": f"{type(exc).__name__}: {exc}"}
    profiling.save(profiler, f"steady-{args.mode}-{args.api}-{args.pattern}")
    _report_and_exit(event)


def _report_and_exit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
