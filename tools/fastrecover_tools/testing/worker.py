"""A consumer *process* for crash tests, the demo and the chaos driver.

It consumes a topic like a real application, appends every record it finishes
to a ledger file, commits the way it is told, and reports milestones as JSON
lines on stdout so a driver can wait on them and then SIGKILL it at exactly the
moment a test needs.

Ledger lines are ``topic partition offset`` by default.  With ``--member NAME``
(the chaos harness) they are
``topic partition offset done_ms produced_ms member token epoch``: when the
record was finished (wall clock, ms), its produce timestamp, which incarnation
finished it, and the backfill range (token id and epoch, ``-`` for a record the
primary read) it was routed to.  A line is written before the record is
committed, so a SIGKILL can only cost a duplicate, never a ledger entry for a
committed record.

Fault injection (all off by default):

* ``--fail-child-after N``: the child thread raises on its N-th batch (once);
* ``--stall-at POINT [--stall-after K]``: at the K-th time the worker reaches
  POINT it reports ``stalled`` and blocks there until it is killed.  Points:
  ``batch`` (half-way through a batch, nothing of it committed), ``backfill``
  (after finishing a backfilled record), ``token-write`` (inside the store
  transaction that creates a range token), ``claim`` (inside the transaction
  that claims one), ``store-commit`` (inside the transaction that commits range
  progress, row locks held), ``between-commits`` (range progress committed to
  the store, the Kafka commit not yet sent).
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from fastrecover import hooks
from fastrecover.consumer import Consumer
from fastrecover.errors import FastRecoverError

#: Exit status of an incarnation whose consumer reported a fatal error.
FATAL_EXIT = 3

#: Client keys librdkafka refuses with group.protocol=consumer; the worker leaves them out there.
CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")

STALL_POINTS = ("batch", "backfill", "token-write", "claim", "store-commit", "between-commits")
#: how the worker reads: consume(--batch), or poll() per record (poll's steady path is C, consume's Python)
APIS = ("consume", "poll")


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
    sys.stdout.flush()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m fastrecover_tools.testing.worker")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True, action="append", help="repeat for several topics")
    p.add_argument("--group", required=True)
    p.add_argument("--parallel", action="store_true", help="enable.parallel.rebalance")
    p.add_argument("--plain", action="store_true", help="use confluent_kafka.Consumer itself (baseline)")
    p.add_argument("--store-url", default=os.environ.get("FASTRECOVER_STORE_URL"))
    p.add_argument("--min-offsets", type=int, default=1)
    p.add_argument("--ledger", required=True, help="append-only file of finished records")
    p.add_argument(
        "--commit",
        choices=["message", "message-async", "store", "sync", "async", "auto", "none"],
        default="sync",
        help="message(-async): commit(message) per record, sync (async); sync/async: commit() every "
        "--commit-every records and after an empty poll; auto: enable.auto.commit; store: "
        "store_offsets(message) per record + auto-commit",
    )
    p.add_argument("--commit-every", type=int, default=100)
    p.add_argument(
        "--commit-at",
        type=int,
        action="append",
        default=[],
        help="commit(offsets=[o]) once the record at o-1 is finished (single partition)",
    )
    p.add_argument("--commit-metadata", help="the application's own metadata on the --commit-at commits")
    p.add_argument("--block-at", type=int, help="stop making progress once the record at N-1 is finished")
    p.add_argument("--work-us", type=int, default=0, help="simulated processing time per record")
    p.add_argument("--session-ms", type=int, default=3000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--api", choices=APIS, default="consume", help="consume(--batch) or poll()")
    p.add_argument(
        "--first-fresh-after",
        type=float,
        help="report the first record whose produce timestamp (ms) is at or after this epoch time",
    )
    p.add_argument("--member", help="incarnation name: switches the ledger to the chaos format")
    p.add_argument("--group-instance-id", help="static membership (group.instance.id)")
    p.add_argument("--fail-child-after", type=int, help="the child thread raises on its N-th batch (once)")
    p.add_argument("--stall-at", choices=STALL_POINTS, help="block at this point until killed")
    p.add_argument("--stall-after", type=int, default=1, help="block the K-th time --stall-at is reached")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra consumer property (repeatable)"
    )
    return p.parse_args(argv)


def _stall(point: str) -> None:
    _emit("stalled", point=point)
    threading.Event().wait()  # the driver SIGKILLs us here


class _Faults:
    """Counts arrivals at the stall point and blocks at the chosen one."""

    def __init__(self, point: str | None, after: int) -> None:
        self.point = point
        self.after = after
        self.hits = 0

    def at(self, point: str) -> None:
        if point == self.point:
            self.hits += 1
            if self.hits == self.after:
                _stall(point)

    def install(self) -> None:
        """Wrap store and consumer internals so the store-side stall points exist."""

        point = self.point
        if point in hooks.POINTS:
            hooks.register(point, lambda: self.at(point))


def _inject_child_failure(after: int) -> None:
    """Make the child fail on its ``after``-th fetched batch, once per process."""
    calls = {"n": 0}

    def failing() -> None:
        calls["n"] += 1
        if calls["n"] == after:
            _emit("child-failure-injected", batch=after)
            raise RuntimeError(f"injected child failure on batch {after}")

    hooks.register("child-batch", failing)


def _routes(consumer: Any) -> dict[tuple[str, int], list[tuple[int, int, int, int]]]:
    """(topic, partition) -> [(start, end, token id, epoch)] of the ranges this member holds.

    Parked ranges (negative ids: kept in the commit metadata while the store is down or still opening,
    and read by the child early after a jump) have no store token and no epoch to fence: their records
    are logged without one, as the primary's are.
    """
    out: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
    for token, _progress in consumer.backfill_progress():
        if token.id < 0:
            continue
        out.setdefault((token.topic, token.partition), []).append(
            (token.span.start, token.span.end, token.id, token.epoch)
        )
    return out


def _report_recoveries(consumer: Any, seen: int) -> int:
    reports = getattr(consumer, "recoveries", [])
    for r in reports[seen:]:
        _emit(
            "recovery",
            topic=r.key.topic,
            partition=r.key.partition,
            committed=r.committed,
            log_end=r.log_end,
            primary_start=r.primary_start,
            new_ranges=[[s.start, s.end] for s in r.new_ranges],
            resumed=list(r.resumed),
            degraded=r.degraded,
        )
    return len(reports)


def _commit(action: Callable[[], Any], what: str) -> bool:
    """Commit like an application that keeps going: a failed commit is reported and retried later."""
    try:
        action()
        return True
    except (KafkaException, FastRecoverError) as exc:
        _emit("commit-failed", what=what, error=f"{type(exc).__name__}: {exc}")
        return False


def run(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # SIGUSR1 writes every thread's stack to stderr (the member's log): how a hung member is diagnosed
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": args.session_ms,
        "heartbeat.interval.ms": max(100, args.session_ms // 6),
        "enable.auto.commit": args.commit in ("auto", "store"),
        "enable.auto.offset.store": args.commit != "store",
        "auto.commit.interval.ms": 500,
    }
    if args.group_instance_id:
        config["group.instance.id"] = args.group_instance_id
    if args.parallel:
        config.update(
            {
                "enable.parallel.rebalance": True,
                "fastrecover.backfill.min.offsets": args.min_offsets,
                # a lag at the first recovery becomes a range whether the store is open yet or not (the
                # tests count on it); --set fastrecover.recovery.replay.max.offsets=N gives the default's path
                "fastrecover.recovery.replay.max.offsets": 0,
            }
        )
        if args.store_url:
            config["fastrecover.store.url"] = args.store_url
    for item in args.set:
        key, _, value = item.partition("=")
        config[key.strip()] = value.strip()
    if str(config.get("group.protocol", "classic")).lower() == "consumer":
        # KIP-848 groups: the broker owns these and librdkafka refuses them ("defined broker side")
        for key in CLASSIC_ONLY:
            config.pop(key, None)
    faults = _Faults(args.stall_at, args.stall_after)
    faults.install()
    if args.fail_child_after:
        _inject_child_failure(args.fail_child_after)
    consumer: Any = PlainConsumer(config) if args.plain else Consumer(config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def on_assign(c: Any, partitions: list[Any]) -> None:
        _emit("assigned", partitions=[[tp.topic, tp.partition, tp.offset] for tp in partitions])

    def on_revoke(c: Any, partitions: list[Any]) -> None:
        _emit("revoked", partitions=[[tp.topic, tp.partition] for tp in partitions])

    consumer.subscribe(args.topic, on_assign=on_assign, on_revoke=on_revoke)
    _emit("started", pid=os.getpid(), parallel=args.parallel, member=args.member)
    finished = 0
    pending = 0  # finished since the last sync/async commit
    fresh_seen = False
    commit_at = set(args.commit_at)
    reported = 0
    chaos = args.member is not None
    with open(args.ledger, "a", buffering=1) as ledger:
        while not stop.is_set():
            if args.api == "poll":  # one record a call: the path of applications that poll() per record
                one = consumer.poll(0.2)
                batch = [] if one is None else [one]
            else:
                batch = consumer.consume(args.batch, 0.2)
            if args.parallel:
                reported = _report_recoveries(consumer, reported)
            routes = _routes(consumer) if chaos and args.parallel and batch else {}
            done: list[Message] = []
            half = len(batch) // 2
            for index, msg in enumerate(batch):
                error = msg.error()
                if error is not None:
                    _emit("consume-error", error=str(error))
                    if error.fatal() or error.code() == KafkaError._FATAL:
                        # The consumer is unusable (with group.protocol=consumer a static member
                        # restarted before its predecessor's session ended is fenced with
                        # UNRELEASED_INSTANCE_ID): exit like an application must, and be restarted.
                        _emit("fatal", error=str(error))
                        consumer.close()
                        return FATAL_EXIT
                    continue
                if index == half and half:
                    faults.at("batch")
                route = _process(msg, args.work_us, ledger, args.member, routes)
                done.append(msg)
                finished += 1
                offset = msg.offset() or 0
                if route is not None:
                    faults.at("backfill")
                if args.first_fresh_after is not None and not fresh_seen:
                    _ts_type, ts = msg.timestamp()
                    if ts >= args.first_fresh_after * 1000:
                        fresh_seen = True
                        _emit("fresh", offset=offset, partition=msg.partition(), produced_ms=ts)
                if args.commit == "message":
                    _commit(functools.partial(consumer.commit, message=msg, asynchronous=False), "message")
                elif args.commit == "message-async":
                    _commit(functools.partial(consumer.commit, message=msg, asynchronous=True), "message-async")
                elif args.commit == "store":
                    consumer.store_offsets(message=msg)
                if offset + 1 in commit_at:
                    extra = {} if args.commit_metadata is None else {"metadata": args.commit_metadata}
                    consumer.commit(
                        offsets=[TopicPartition(msg.topic(), msg.partition(), offset + 1, **extra)],
                        asynchronous=False,
                    )
                    _emit("committed", offset=offset + 1)
                if args.block_at is not None and offset + 1 >= args.block_at:
                    ledger.flush()
                    _emit("blocked", offset=offset + 1, finished=finished)
                    stop.wait()  # the driver SIGKILLs us here: the crash at offset block_at
                    return 0
            if args.commit in ("sync", "async"):
                pending += len(done)
                # every --commit-every records, and whenever a poll comes back empty (an application that
                # also commits when idle: the last records of a range must not wait for 50 more)
                if pending and (finished % args.commit_every < len(done) or not batch):
                    _commit(lambda: consumer.commit(asynchronous=args.commit == "async"), args.commit)
                    pending = 0
            if done:
                _emit("progress", finished=finished) if finished % 1000 < len(done) else None
    if args.commit in ("sync", "async") and finished:
        _commit(lambda: consumer.commit(asynchronous=False), "final")
    consumer.close()
    _emit("closed", finished=finished)
    return 0


def _process(
    msg: Message,
    work_us: int,
    ledger: TextIO,
    member: str | None,
    routes: dict[tuple[str, int], list[tuple[int, int, int, int]]],
) -> int | None:
    """Do the record's "work" and append it to the ledger; returns its range's token id (None: primary)."""
    if work_us:
        end = time.perf_counter() + work_us / 1e6
        while time.perf_counter() < end:
            pass
    if member is None:
        ledger.write(f"{msg.topic()} {msg.partition()} {msg.offset()}\n")
        return None
    offset = msg.offset() or 0
    token, epoch = "-", "-"
    found: int | None = None
    for start, end_, token_id, token_epoch in routes.get((msg.topic() or "", msg.partition() or 0), ()):
        if start <= offset < end_:
            token, epoch, found = str(token_id), str(token_epoch), token_id
            break
    _ts_type, produced_ms = msg.timestamp()
    ledger.write(
        f"{msg.topic()} {msg.partition()} {offset} {int(time.time() * 1000)} {produced_ms} {member} {token} {epoch}\n"
    )
    return found


if __name__ == "__main__":
    sys.exit(run())
