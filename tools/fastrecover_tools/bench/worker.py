"""The consumer process of the restart benchmarks (``python -m fastrecover_tools.bench.worker``).

Unlike :mod:`fastrecover_tools.testing.worker` it keeps no ledger (no file write per
record): it only counts.  The driver tells it where the lag ends in each
partition (``--lag-end``); a record below that offset is a lag record, one at
or above it was produced after the restart (live).  Events, one JSON line each
on stdout, with wall-clock ``t``:

* ``ready``: the interpreter has started and imported what both clients share (confluent_kafka, this
  module's own imports): from here on, the two runs of a pair execute different code;
* ``imported``: the consumer class is imported (fastrecover: ``fastrecover.consumer``; plain: nothing more);
* ``started``: the consumer object exists (fastrecover: its store opens on a thread, deferred until
  the first recovery when no recovery waits for it);
* ``subscribed``: just before ``subscribe()``: the drain rate is measured from
  here, so group join and fastrecover's recovery count for both consumers; ``cpu`` is the CPU time
  this (the application's) thread has used so far, as in ``drained``;
* ``joined``: the group handed out partitions (fastrecover: before its recovery
  runs, when the consumer still has the private hook ``_recover`` this wraps;
  otherwise, and for plain, the same moment as ``assigned``);
* ``assigned``: the application's on_assign ran (fastrecover: recovery done);
* ``fresh``: the first live record was delivered;
* ``lag_drained``: every lag record was delivered;
* ``drained``: every lag record and every live record the driver announced
  (``live N`` on stdin once it stopped producing) were delivered;
* ``stats`` (once drained, else on exit): peak/base RSS, an RSS time series, the
  child's largest queue.

For the crash runs (:mod:`fastrecover_tools.bench.crash`) the same process is
also the consumer that crashes: ``hold`` on stdin makes it stop reading, commit
what it delivered synchronously and report ``held`` with the committed offsets;
the driver then builds the lag and SIGKILLs it.  ``--set KEY=VALUE`` adds
consumer properties (``group.instance.id``, ``group.protocol``, ...).  A fatal
consumer error (with ``group.protocol=consumer``, a static member whose instance
ID is still held: UNRELEASED_INSTANCE_ID) is reported as ``fatal`` and the
process exits with :data:`FATAL_EXIT`, as an application must.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import threading
import time
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaError, KafkaException

from fastrecover_tools.bench import profiling
from fastrecover_tools.bench.patterns import PATTERNS, busy, commit_ignoring_nothing, consumer_config, hooks
from fastrecover_tools.bench.statements import StatementCounter, delta

#: The store URL comes in the environment, never in argv (``ps`` shows argv; a URL may hold a password).
STORE_URL_ENV = "FASTRECOVER_BENCH_STORE_URL"

#: Exit status after a fatal consumer error (the process must be restarted).
FATAL_EXIT = 3

#: Client keys librdkafka refuses with group.protocol=consumer (the broker owns them there).
CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
    sys.stdout.flush()


def rss_mib() -> float:
    """Resident set size of this process now (Linux /proc; else the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * _PAGE / 2**20
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class _Sampler(threading.Thread):
    """Samples RSS (and the fastrecover child's queue length) every ``interval`` seconds."""

    def __init__(self, interval: float, consumer: Any) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.interval, self.consumer = interval, consumer
        self.t0 = time.monotonic()
        self.series: list[tuple[float, float]] = []
        self.peak = 0.0
        self.max_queue = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            rss = rss_mib()
            self.peak = max(self.peak, rss)
            self.series.append((round(time.monotonic() - self.t0, 2), round(rss, 1)))
            # Diagnostic only: how full the child's bounded queue got (back-pressure at work).
            pending = getattr(getattr(self.consumer, "_child", None), "pending", None)
            if callable(pending):
                self.max_queue = max(self.max_queue, int(pending()))
            self.stop.wait(self.interval)


def _emit_stats(
    sampler: _Sampler,
    base_rss: float,
    lag_seen: int,
    live_seen: int,
    assignments: int,
    counter: StatementCounter | None = None,
) -> None:
    sampler.stop.set()
    sampler.join(2)
    if counter is not None:
        _emit_counts(counter)
    _emit(
        "stats",
        base_rss_mib=round(base_rss, 1),
        peak_rss_mib=round(max(sampler.peak, rss_mib()), 1),
        max_child_queue=sampler.max_queue,
        lag=lag_seen,
        live=live_seen,
        assignments=assignments,
        series=sampler.series[:: max(1, len(sampler.series) // 400)],
    )


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fastrecover_tools.bench.worker")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--mode", choices=["plain", "fastrecover"], required=True)
    p.add_argument(
        "--pattern", default="auto", choices=sorted(PATTERNS), help="how the worker commits (bench/patterns.py)"
    )
    p.add_argument("--lag-end", required=True, help="partition:offset,... where the lag ends")
    p.add_argument(
        "--lag-start", default="", help="partition:offset,... where the lag starts (the committed offsets; default 0)"
    )
    p.add_argument(
        "--assign-in-callback",
        action="store_true",
        help="on_assign calls assign() itself and reports how long it took (fastrecover: the recovery)",
    )
    p.add_argument(
        "--count-statements", action="store_true", help="count the store's SQL statements (fastrecover only)"
    )
    p.add_argument("--name", default="", help="names this run's profile file")
    p.add_argument(
        "--store-open-first",
        action="store_true",
        help="fastrecover: subscribe only once the store has opened (every recovery then takes the range path)",
    )
    p.add_argument("--work-us", type=int, default=0, help="busy work per record (µs)")
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--rss-interval", type=float, default=0.1)
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra consumer property (repeatable)"
    )
    return p.parse_args(argv)


def extra_config(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as consumer properties; with group.protocol=consumer the classic-only keys go."""
    config: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        config[key.strip()] = value.strip()
    return config


def drop_classic_only(config: dict[str, Any]) -> dict[str, Any]:
    """Without the keys librdkafka refuses under group.protocol=consumer ("defined broker side")."""
    if str(config.get("group.protocol", "classic")).lower() == "consumer":
        return {k: v for k, v in config.items() if k not in CLASSIC_ONLY}
    return config


def offsets_arg(text: str) -> dict[int, int]:
    """``partition:offset,...`` as a dict ({} for an empty text)."""
    out: dict[int, int] = {}
    for item in text.split(","):
        if item.strip():
            partition, _, offset = item.partition(":")
            out[int(partition)] = int(offset)
    return out


def lag_records(lag_start: dict[int, int], lag_end: dict[int, int]) -> int:
    """Records between the committed offsets (0 where not given) and the lag's end, over every partition."""
    return sum(max(0, end - lag_start.get(p, 0)) for p, end in lag_end.items())


def _is_fatal(error: Any) -> bool:
    return bool(error.fatal()) or error.code() == KafkaError._FATAL


def run(argv: list[str] | None = None) -> int:
    _emit("ready")
    args = _parse(argv)
    lag_end = offsets_arg(args.lag_end)
    lag_total = lag_records(offsets_arg(args.lag_start), lag_end)
    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        # librdkafka's default session (45 s): per-message async commits can hold heartbeats back for
        # seconds behind thousands of OffsetCommit requests, and a lost session would rebalance mid-run.
        **consumer_config(args.pattern),
        **extra_config(args.set),
    }
    config = drop_classic_only(config)
    consumer: Any
    counter: StatementCounter | None = None
    if args.mode == "fastrecover" and args.count_statements:
        counter = StatementCounter()
        counter.install_in_background()
    if args.mode == "fastrecover":
        from fastrecover.consumer import Consumer

        _emit("imported")
        config.update({"enable.parallel.rebalance": True, "fastrecover.backfill.min.offsets": 1})
        store_url = os.environ.get(STORE_URL_ENV)
        if store_url:
            config["fastrecover.store.url"] = store_url
        consumer = Consumer(config)
    else:
        _emit("imported")
        consumer = PlainConsumer(config)
    base_rss = rss_mib()
    _emit("started", pid=os.getpid(), mode=args.mode, rss_mib=round(base_rss, 1))
    if args.store_open_first and args.mode == "fastrecover":
        _wait_store_open(consumer, counter)
    sampler = _Sampler(args.rss_interval, consumer)
    sampler.start()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    live_expected: list[int] = []
    hold = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            parts = line.split()
            if len(parts) == 2 and parts[0] == "live":
                live_expected.append(int(parts[1]))
            elif parts == ["hold"]:
                hold.set()

    threading.Thread(target=read_stdin, name="stdin", daemon=True).start()

    assignments: list[int] = []  # more than one: the run rebalanced (and may count redelivered records)

    # "joined": the application's on_assign (it runs before fastrecover's recovery); "assigned": the
    # consumer is ready to deliver (plain: the same moment; fastrecover: its recovery has run, which
    # the first consume() returning after the assignment shows in consumer.recoveries)
    pending_recovery: list[list[list[int]]] = []

    def on_assign(_c: Any, partitions: list[Any]) -> None:
        assignments.append(len(partitions))
        _emit("joined", partitions=len(partitions))
        if args.assign_in_callback:
            _assign_timed(consumer, partitions, counter, args.name or args.mode)
            return
        placed = [[tp.partition, tp.offset] for tp in partitions]
        if args.mode == "plain":
            _emit("assigned", partitions=placed)
        else:
            pending_recovery.append(placed)

    on_message, on_batch = hooks(consumer, args.pattern)
    # with --assign-in-callback the profile covers the assign() in on_assign only (_assign_timed)
    profiler = None if args.assign_in_callback else profiling.start()
    _emit("subscribed", cpu=time.thread_time())
    consumer.subscribe([args.topic], on_assign=on_assign)
    lag_seen = live_seen = 0
    fresh = lag_done = drained = False
    work_s = args.work_us / 1e6
    while not stop.is_set():
        if hold.is_set():
            return _hold(consumer, stop)
        try:
            batch = consumer.consume(args.batch, 0.1)
        except KafkaException as exc:
            if exc.args and isinstance(exc.args[0], KafkaError) and _is_fatal(exc.args[0]):
                return _fatal(consumer, exc.args[0])
            raise
        if pending_recovery and (batch or len(consumer.recoveries) >= sum(map(len, pending_recovery))):
            _emit("assigned", partitions=[p for placed in pending_recovery for p in placed])
            pending_recovery.clear()
        for msg in batch:
            error = msg.error()
            if error is not None:
                if _is_fatal(error):
                    return _fatal(consumer, error)
                continue
            msg.value()
            if work_s:
                busy(work_s)
            if on_message is not None:
                on_message(msg)
            if msg.offset() < lag_end.get(msg.partition(), 0):
                lag_seen += 1
            else:
                live_seen += 1
                if not fresh:
                    fresh = True
                    _emit(
                        "fresh",
                        partition=msg.partition(),
                        offset=msg.offset(),
                        produced_ms=msg.timestamp()[1],
                        cpu=time.process_time(),  # every thread's CPU since the process started
                    )
        if batch and on_batch is not None:
            on_batch()
        if not lag_done and lag_seen >= lag_total:
            lag_done = True
            _emit("lag_drained", lag=lag_seen, live=live_seen)
        if lag_done and not drained and live_expected and live_seen >= live_expected[-1]:
            drained = True
            _emit("drained", lag=lag_seen, live=live_seen, cpu=time.thread_time())
            profiling.save(profiler, f"restart-{args.mode}-{args.pattern}-w{args.work_us}")
            _emit_stats(sampler, base_rss, lag_seen, live_seen, len(assignments), counter)
    if not drained:
        _emit_stats(sampler, base_rss, lag_seen, live_seen, len(assignments), counter)
    consumer.close()
    _emit("closed")
    return 0


#: Longest wait for the store's background open with --store-open-first.
STORE_OPEN_TIMEOUT_S = 60.0


def _wait_store_open(consumer: Any, counter: StatementCounter | None) -> None:
    """Wait until the consumer's background store open has ended (a private probe, bench only).

    A recovery that meets a store still opening replays lags up to
    ``fastrecover.recovery.replay.max.offsets`` instead of opening ranges; waiting here
    makes every recovery of the run open its ranges, so their cost is what is measured.
    The open is asked for at once, once ``counter`` listens (so that it counts the open's
    statements too): deferred, it would begin only after
    ``fastrecover.mode_state.STORE_OPEN_DEFER_S``, idle time that every figure of the
    run timed from the spawn would carry.
    """
    from fastrecover_tools.testing.waiting import Deadline, wait_for  # this arm alone: nothing timed yet

    deadline = Deadline(STORE_OPEN_TIMEOUT_S)
    if counter is not None:
        wait_for(lambda: counter.installed_at or counter.error, deadline.remaining(), 0.005, "the statement counter")
    # the mode is built at the first call that needs it (fastrecover/startup.py): build it to reach its store
    mode = getattr(consumer, "_fr", None) or consumer._build_mode()
    link = getattr(mode, "link", None)
    open_soon = getattr(link, "open_soon", None)
    if callable(open_soon):
        open_soon()
    if link is not None:
        wait_for(lambda: not getattr(link, "opening", False), deadline.remaining(), 0.005, "the store to open")
    _emit("store_open", probed=link is not None)


def _emit_counts(counter: StatementCounter) -> None:
    """The store statements counted so far, and since when the counter listened."""
    _emit("statements", counts=counter.snapshot(), installed_at=counter.installed_at, error=counter.error)


def _assign_timed(consumer: Any, partitions: list[Any], counter: StatementCounter | None, name: str) -> None:
    """Assign from the application's on_assign, as confluent_kafka allows, and time it.

    With fastrecover the assign() made inside the rebalance callback is where the
    recovery runs (committed offsets, log ends, tokens written, the child handed its
    ranges), so this is the recovery's whole cost on the application's thread.
    """
    before = counter.snapshot() if counter is not None else None
    profiler = profiling.start()
    began = time.perf_counter()
    consumer.assign(partitions)
    took = time.perf_counter() - began
    profiling.save(profiler, f"{name}-assign")
    reports = list(getattr(consumer, "recoveries", ()))
    _emit(
        "assigned",
        partitions=len(partitions),
        assign_s=took,
        ranges_opened=sum(1 for r in reports if r.new_ranges),
        resumed=sum(1 for r in reports if r.resumed),
        degraded=sum(1 for r in reports if r.degraded),
        recovered=len(reports),
        statements=None if counter is None or before is None else delta(counter.snapshot(), before),
        counting_since=None if counter is None else counter.installed_at,
    )


def _hold(consumer: Any, stop: threading.Event) -> int:
    """Stop reading, commit what was delivered (synchronously), report the offsets, and wait to be killed."""
    commit_ignoring_nothing(consumer.commit, asynchronous=False)
    positions = consumer.position(consumer.assignment())
    _emit("held", positions=[[tp.partition, tp.offset] for tp in positions])
    stop.wait()  # the driver SIGKILLs this process: the crash
    return 0


def _fatal(consumer: Any, error: Any) -> int:
    """A fatal consumer error: report it and exit, as an application must (its supervisor restarts it)."""
    _emit("fatal", error=str(error), code=error.name() if hasattr(error, "name") else str(error.code()))
    try:
        consumer.close()
    except Exception as exc:  # the consumer is unusable; its close may complain too
        _emit("close-failed", error=f"{type(exc).__name__}: {exc}")
    return FATAL_EXIT


if __name__ == "__main__":
    sys.exit(run())
