"""Scale in partitions: one member restarts on N partitions, each behind its committed offset.

Recovery plans every partition of an assignment: it reads committed offsets and
log ends, writes a range token per partition, and hands the child its ranges.
Whether that stays cheap at thousands of partitions per member is what this
scenario measures.  Per partition count N:

1. one topic of N partitions, ``lag_per_partition`` records produced into each
   (made once per N and shared by the repeats: each run has a group of its own);
2. per run, a new group whose committed offsets are ``lag_per_partition`` below
   the log end of every partition: a lag above fastrecover's
   ``fastrecover.backfill.min.offsets`` on each, so each gets a range of its own;
3. a consumer process with the README quickstart's settings (static
   ``group.instance.id``, ``session.timeout.ms`` 10000, auto-commit) is
   spawned and subscribes while a producer writes fresh records across the N
   partitions; its on_assign calls ``assign()`` itself and times it (with
   fastrecover that call is the recovery);
4. the run ends once every lag record was delivered and the store has no open
   range left: then the rows of the store are read, and the worker, told to stop
   (SIGTERM), reports the statements it sent the store (counted in the arm that
   subscribes once the store is open: :data:`ARMS`).

Every wait has a deadline; a run that misses one is recorded with its error.
"""

from __future__ import annotations

import signal
import sqlite3
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import KafkaException, TopicPartition

from fastrecover.store import upgrade
from fastrecover_tools.bench.scenarios import (
    VALUE_SIZE,
    _store_url_in_environment,
    _tail,
    _wait_event,
    commit_offsets,
    produce_fast,
)
from fastrecover_tools.bench.statements import writes
from fastrecover_tools.quickstart import QUICKSTART
from fastrecover_tools.testing.broker import create_topic
from fastrecover_tools.testing.driver import EventProcess, SteadyProducer
from fastrecover_tools.testing.waiting import wait_for

_WORKER = "fastrecover_tools.bench.worker"

COUNTS = (1, 64, 512, 2048)
#: Records behind the committed offset on every partition: twice fastrecover's default
#: ``fastrecover.backfill.min.offsets`` (100), so every partition gets a range.
LAG_PER_PARTITION = 200
#: Fresh records/s across the partitions.  Lower than the other scenarios' LIVE_RATE: spread over 2,048
#: partitions a record is a batch of its own, and on a busy 2-core machine the producer fell seconds behind
#: 1,000/s; a fresh record every 5 ms still times the first one to well under the figures measured.
LIVE_RATE = 200
#: Seconds the store gets, once the lag is delivered, to record every range as finished.
SETTLE_TIMEOUT_S = 60.0
#: A request about every partition of a large topic (create, offsets) may take this long.
ADMIN_TIMEOUT_S = 180.0
RANGES_TABLE = "fastrecover_ranges"


@dataclass(frozen=True)
class PartitionSpec:
    bootstrap: str
    topic: str  # made by prepare_topic: ``partitions`` partitions, each with at least ``lag_per_partition`` records
    partitions: int
    mode: str  # "plain" or "fastrecover"
    store_url: str  # a sqlite file of this run (fastrecover)
    lag_per_partition: int = LAG_PER_PARTITION
    live_rate: int = LIVE_RATE
    timeout_s: float = 120.0  # for each wait: first fresh record, lag delivered, store settled
    name: str = ""  # the run's profile file name
    store_open_first: bool = False  # fastrecover: subscribe once the store is open (ranges on every partition)


#: The arms of every repeat: plain, fastrecover as it starts (a recovery that meets the store still
#: opening replays lags up to fastrecover.recovery.replay.max.offsets), and fastrecover subscribing
#: once its store is open (every partition gets its range: the recovery's whole cost).
ARMS = ("plain", "fastrecover", "fastrecover-store-open")


def arm_mode(arm: str) -> tuple[str, bool]:
    """(worker mode, store open first) of an arm."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose from {', '.join(ARMS)}")
    return ("plain", False) if arm == "plain" else ("fastrecover", arm == "fastrecover-store-open")


def arm_order(rep: int, index: int) -> tuple[str, ...]:
    """The arms rotated by repeat and cell, so each runs first, second and third equally often."""
    shift = (rep + index) % len(ARMS)
    return ARMS[shift:] + ARMS[:shift]


def prepare_topic(bootstrap: str, partitions: int, lag_per_partition: int) -> tuple[str, float]:
    """A topic of ``partitions`` partitions with ``lag_per_partition`` records in each; (name, records/s)."""
    topic = f"bench-partitions-{partitions}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions, timeout=ADMIN_TIMEOUT_S)
    rate = produce_fast(bootstrap, topic, partitions * lag_per_partition, partitions)
    return topic, rate


def log_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Every partition's log end, in one ListOffsets request (not a watermark request per partition).

    Asked again until every partition answers: a new topic's partitions refuse the request
    (NOT_LEADER_FOR_PARTITION) until their leaders have loaded them.
    """
    consumer = RawConsumer({"bootstrap.servers": bootstrap, "group.id": f"bench-probe-{uuid.uuid4().hex[:8]}"})

    def ask() -> dict[int, int]:
        """Every partition's end, or {} (falsy: asked again) while one is missing."""
        answered = consumer.offsets_for_times([TopicPartition(topic, p, -1) for p in range(partitions)], timeout=30)
        ends = {tp.partition: tp.offset for tp in answered if tp.error is None and tp.offset >= 0}
        return ends if len(ends) == partitions else {}

    try:
        found = wait_for(
            ask, ADMIN_TIMEOUT_S, 0.2, f"the log ends of {partitions} partitions of {topic}", ignore=(KafkaException,)
        )
        return found
    finally:
        consumer.close()


def lag_starts(ends: Mapping[int, int], lag_per_partition: int) -> dict[int, int]:
    """Committed offsets that leave ``lag_per_partition`` records (or the whole partition) on every partition."""
    return {p: max(0, end - lag_per_partition) for p, end in ends.items()}


def offsets_text(offsets: Mapping[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(offsets.items()))


def store_rows(store_url: str) -> dict[str, int]:
    """Rows of the run's SQLite store by state, and in all (read-only; the consumer may still be writing)."""
    path = store_url.removeprefix("sqlite:///")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        by_state = dict(conn.execute(f"select state, count(*) from {RANGES_TABLE} group by state").fetchall())
    finally:
        conn.close()
    return {"rows": sum(by_state.values()), **{f"rows_{state}": n for state, n in sorted(by_state.items())}}


def worker_args(
    spec: PartitionSpec, group: str, starts: Mapping[int, int], ends: Mapping[int, int], member: str
) -> list[str]:
    """The bench worker's command line for one run of ``spec``."""
    args = ["--bootstrap", spec.bootstrap, "--topic", spec.topic, "--group", group]
    args += ["--mode", spec.mode, "--pattern", "auto", "--assign-in-callback"]
    args += ["--lag-start", offsets_text(starts), "--lag-end", offsets_text(ends), "--name", spec.name or spec.mode]
    if spec.store_open_first:
        # Counted in this arm alone: the counter imports SQLAlchemy on a thread of its own (about 0.1 s of
        # CPU, holding the GIL), which in the arm timed from the spawn slowed the consumer's own start-up,
        # join and recovery, a cost no other arm paid.  Here the store opens, and SQLAlchemy is imported,
        # before the consumer subscribes.
        args += ["--store-open-first", "--count-statements"]
    return [*args, f"--set=group.instance.id={member}", *(f"--set={k}={v}" for k, v in QUICKSTART.items())]


def partitions_run(spec: PartitionSpec, log_file: TextIO) -> dict[str, Any]:
    """One restart on ``spec.partitions`` partitions; times in seconds from the spawn or the subscribe."""
    tag = uuid.uuid4().hex[:6]
    group = f"bench-partitions-{spec.mode}-{spec.partitions}-{tag}"
    ends = log_ends(spec.bootstrap, spec.topic, spec.partitions)
    starts = lag_starts(ends, spec.lag_per_partition)
    commit_offsets(spec.bootstrap, group, spec.topic, starts)
    fast = spec.mode == "fastrecover"
    if fast:
        upgrade(spec.store_url)  # the consumer that went down had created its store's schema
    args = worker_args(spec, group, starts, ends, f"bench-member-{tag}")
    result: dict[str, Any] = {"partitions": spec.partitions, "lag": sum(ends[p] - starts[p] for p in ends)}
    live = SteadyProducer(spec.bootstrap, spec.topic, spec.live_rate, value_size=VALUE_SIZE, partitions=spec.partitions)
    spawned = time.time()
    with _store_url_in_environment(spec.store_url if fast else None):
        worker = EventProcess(_WORKER, args, log_file, stdin=True)
    live.start()
    try:
        _wait_event(worker, "fresh", spec.timeout_s, log_file)
        _wait_event(worker, "lag_drained", spec.timeout_s, log_file)
        if fast:
            result["settled_s"] = _settle(spec, worker, log_file)
            result.update(store_rows(spec.store_url))
        # SIGTERM ends the worker's loop: it reports its statistics (the statements counted), then closes
        worker.proc.send_signal(signal.SIGTERM)
        _wait_event(worker, "stats", 30, log_file)
    finally:
        live.stop()
        # everything is reported: a graceful close would only cost time (a static member does not leave)
        worker.kill(signal.SIGKILL, timeout=30)
    result.update(figures(worker.events, spawned))
    opened = next((e for e in worker.events if e.get("event") == "store_open"), None)
    if spec.store_open_first and (opened is None or not opened.get("probed")):
        # the arm measures recoveries with a range on every partition: one that never waited for the store
        # replayed instead, and its figures would be the other arm's under this arm's name
        raise RuntimeError(f"{spec.name}: the worker could not wait for its consumer's store to open")
    return result


def _settle(spec: PartitionSpec, worker: EventProcess, log_file: TextIO) -> float:
    """Wait until the store holds no open range (every backfill recorded as done); seconds it took."""
    began = time.monotonic()

    def settled() -> bool:
        if not worker.alive():
            raise RuntimeError(
                f"bench worker exited (code {worker.proc.returncode}) before the store settled; its stderr ends:\n"
                + _tail(log_file)
            )
        return store_rows(spec.store_url).get("rows_open", 0) == 0

    wait_for(settled, SETTLE_TIMEOUT_S, 0.05, "the store to record every range as finished")
    return time.monotonic() - began


def figures(events: Sequence[Mapping[str, Any]], spawned: float) -> dict[str, Any]:
    """The run's figures from the worker's events (wall-clock ``t``); None where an event is missing."""
    first: dict[str, Mapping[str, Any]] = {}
    for e in events:
        first.setdefault(str(e.get("event")), e)
    t = {name: float(e["t"]) for name, e in first.items() if "t" in e}

    def span(start: float | str, end: str) -> float | None:
        a = t.get(start) if isinstance(start, str) else start
        b = t.get(end)
        return None if a is None or b is None else b - a

    assigned = first.get("assigned") or {}
    counted = (first.get("statements") or {}).get("counts")
    recovery_counts = assigned.get("statements")
    since = assigned.get("counting_since")
    # statements of the recovery count only when the counter listened before it began
    complete = since is not None and "joined" in t and float(since) <= t["joined"]
    return {
        "spawn_to_fresh_s": span(spawned, "fresh"),
        "started_s": span(spawned, "started"),
        "subscribe_to_assigned_s": span("subscribed", "assigned"),
        "subscribe_to_joined_s": span("subscribed", "joined"),
        "spawn_to_store_open_s": span(spawned, "store_open"),
        "recovery_s": assigned.get("assign_s"),
        "joined_to_fresh_s": span("joined", "fresh"),
        "spawn_to_lag_drained_s": span(spawned, "lag_drained"),
        "ranges_opened": assigned.get("ranges_opened"),
        "degraded": assigned.get("degraded"),
        "recovery_statements": _total(recovery_counts, "statements") if complete else None,
        "recovery_writes": writes(recovery_counts) if complete and recovery_counts is not None else None,
        "recovery_commits": _total(recovery_counts, "commits") if complete else None,
        "statements": _total(counted, "statements"),
        "store_writes": writes(counted) if counted is not None else None,
        "store_commits": _total(counted, "commits"),
        "statement_kinds": counted,
        "recovery_statement_kinds": recovery_counts if complete else None,
        "assignments": (first.get("stats") or {}).get("assignments"),
    }


def _total(counts: Mapping[str, int] | None, key: str) -> int | None:
    return None if counts is None else int(counts.get(key, 0))
