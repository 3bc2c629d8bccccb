"""``fastrecover demo``: the KIP's story, end to end, plain consumer vs parallel rebalance.

A producer writes a steady stream and remembers every record the broker
acknowledged; a consumer *process* that commits as it goes is SIGKILLed;
production continues so a lag builds; the consumer is restarted.  Once with a
plain ``confluent_kafka.Consumer``, once with ``enable.parallel.rebalance``.

The consumer runs with the README quickstart's settings
(:data:`fastrecover_tools.quickstart.QUICKSTART`: a ``group.instance.id``, the same for
the crashed and the restarted process, a 10 s session and a 20 ms reconnect back-off),
and the restart is what a supervisor does: a new process ``--down-seconds`` after the
kill, without waiting for anything else, such as the dead member leaving the group. The
table shows the time from the SIGKILL to the first fresh record besides the times from
the restart.

Each run goes on until the restarted consumer has delivered every record the
producer had acknowledged and, with fastrecover, until the store holds no open
range of the group (with deadlines: a run that does not get there fails, and
says so).  The numbers then come from the producer's acknowledgements and the
consumers' ledgers (:mod:`fastrecover_tools.demo_report`): time to the first
fresh record, time until the lag was caught up, records lost, duplicates, and
a PNG of every record's delivery latency since the restart.

Its files (SQLite store, ledgers, worker logs, results.json, the PNG) go to
``--out`` (``./demo-output``), emptied at the start of each run.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import TopicPartition

from fastrecover.errors import ConfigError, FastRecoverError
from fastrecover.secrets import mask_url
from fastrecover.store import open_store
from fastrecover.store.sql import url_for_child, validate_url
from fastrecover_tools import demo_report
from fastrecover_tools.demo_report import Ledger, StoryResult
from fastrecover_tools.quickstart import QUICKSTART, QUICKSTART_SESSION_MS
from fastrecover_tools.testing.broker import (
    Broker,
    create_topic,
    delete_topic,
    docker_available,
    select_broker,
)
from fastrecover_tools.testing.driver import EventProcess, SteadyProducer
from fastrecover_tools.testing.mock_cluster import MockCluster
from fastrecover_tools.testing.waiting import Deadline, wait_for

log = logging.getLogger("fastrecover_tools.demo")

_WORKER = "fastrecover_tools.testing.worker"
DEFAULT_OUT = "demo-output"
#: A file the demo writes into its output directory: only a directory holding it is ever emptied.
MARKER = ".fastrecover-demo"
PLAIN = "plain confluent_kafka.Consumer"
PARALLEL = "fastrecover.Consumer with enable.parallel.rebalance"


def quickstart_args(label: str) -> list[str]:
    """Worker arguments for the quickstart's settings; one ``group.instance.id`` per story (both processes)."""
    return [
        *("--group-instance-id", f"demo-{label}-1", "--session-ms", str(QUICKSTART_SESSION_MS)),
        *(f"--set={key}={value}" for key, value in QUICKSTART.items() if key != "session.timeout.ms"),
    ]


# kept for callers of the old API (tests monkeypatch run_story with a function returning one)
DemoResult = StoryResult


class DemoFailed(Exception):
    """The story did not complete as promised (a deadline passed, records lost, ranges left open)."""


def _store_url(value: str) -> str:
    try:
        validate_url(value)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-servers",
        help="use this Kafka (default: $FASTRECOVER_BOOTSTRAP, a "
        "container when Docker answers, else a local Apache Kafka from Maven Central jars)",
    )
    parser.add_argument(
        "--store-url", type=_store_url, help="range store (default: the SQLite file demo.db in the --out directory)"
    )
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"directory for the store, ledgers, logs, results.json and demo.png; emptied at the start of "
        f"every run (default ./{DEFAULT_OUT}; a non-empty directory the demo did not create is refused)",
    )
    parser.add_argument("--rate", type=int, default=2000, help="records produced per second (default 2000)")
    parser.add_argument(
        "--down-seconds",
        type=float,
        default=15.0,
        help="how long the SIGKILLed consumer stays down while the lag builds; then a new process starts at "
        "once, like a supervisor's restart (default 15)",
    )
    parser.add_argument(
        "--work-us", type=int, default=100, help="simulated processing time per record in microseconds (default 100)"
    )
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument(
        "--catch-up-timeout",
        type=float,
        default=180.0,
        help="seconds a restarted consumer may take to deliver the lag and finish its ranges (default 180)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        results = main(
            args.bootstrap_servers,
            args.store_url,
            args.rate,
            args.down_seconds,
            args.work_us,
            args.partitions,
            out_dir=Path(args.out),
            catch_up_timeout=args.catch_up_timeout,
        )
    except DemoFailed as exc:
        print(f"fastrecover demo: FAILED: {exc}", file=sys.stderr)
        return 1
    problems = [f"{r.label}: {r.lost} acknowledged records never delivered" for r in results if r.lost]
    problems += [f"{r.label}: no delivery of a fresh record measured" for r in results if r.time_to_fresh_s is None]
    problems += [f"{r.label}: {r.open_ranges_left} open ranges left" for r in results if r.open_ranges_left]
    if problems:
        print(f"fastrecover demo: FAILED: {'; '.join(problems)}", file=sys.stderr)
        return 1
    return 0


def prepare_out(path: Path) -> Path:
    """Empty (or create) the demo's output directory; refuse one the demo did not make."""
    path = path.resolve()
    if path.exists():
        if not path.is_dir():
            raise DemoFailed(f"--out {path} exists and is not a directory")
        if any(path.iterdir()) and not (path / MARKER).exists():
            raise DemoFailed(f"--out {path} is not empty and was not made by fastrecover demo; choose another")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text("made by `fastrecover demo`, which empties this directory on every run\n")
    return path


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset of each partition (the log start where none), read without joining."""
    c = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=15)
        out = {}
        for tp in tps:
            low, _high = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=15)
            out[tp.partition] = tp.offset if tp.offset >= 0 else low
        return out
    finally:
        c.close()


def _open_ranges(store_url: str, group: str) -> int:
    with open_store(store_url, create=False, read_only=True) as store:
        return len(store.open_ranges(group, skip_corrupt=True))


def run_story(
    bootstrap: str,
    *,
    parallel: bool,
    store_url: str,
    rate: int,
    lag_seconds: float,
    work_us: int,
    partitions: int,
    workdir: Path,
    out: TextIO,
    auto_create: bool = False,
    catch_up_timeout: float = 180.0,
) -> StoryResult:
    label = "fastrecover" if parallel else "plain"
    topic = f"demo-{label}-{uuid.uuid4().hex[:6]}"
    group = f"demo-{uuid.uuid4().hex[:8]}"
    if not auto_create:  # librdkafka's mock cluster creates topics on first use instead
        create_topic(bootstrap, topic, partitions)
    ledger = Ledger(workdir / f"{label}.ledger")
    base = [
        *("--bootstrap", bootstrap, "--topic", topic, "--group", group, "--ledger", str(ledger.path)),
        *("--commit", "sync", "--commit-every", "200", "--work-us", str(work_us)),
        *quickstart_args(label),
    ]
    # the store URL on argv carries no secret (ps shows argv); main() put the secrets in the environment
    argv_url, _ = url_for_child(store_url)
    base += ["--parallel", "--store-url", argv_url, "--min-offsets", "100"] if parallel else ["--plain"]

    def say(text: str) -> None:
        print(f"  [{label:<11}] {text}", file=out, flush=True)

    try:
        with (
            SteadyProducer(bootstrap, topic, rate, track_acks=True) as producer,
            open(workdir / f"{label}.worker.log", "w") as wlog,
        ):
            first = EventProcess(_WORKER, [*base, "--member", "first"], wlog)
            wait_for(
                lambda: int((first.latest("progress") or {}).get("finished", 0)) >= rate * 2,
                60,
                0.1,
                "the first consumer to make progress",
            )
            crash_wall = time.time()
            first.kill()
            killed_at = producer.sent
            say(f"consumer killed with SIGKILL after {killed_at} records were produced; producing on")
            down = Deadline(lag_seconds)
            # the dead process's last commit, read during the downtime: the lag is everything produced after it
            committed = _committed(bootstrap, group, topic, partitions)
            # a supervisor restarts the process when the downtime is over; nothing else is awaited
            wait_for(down.expired, lag_seconds + 60, 0.01, f"the downtime of {lag_seconds:g} s")
            restart_wall = time.time()
            say(f"restarting the consumer {restart_wall - crash_wall:.2f} s after the kill")
            second = EventProcess(
                _WORKER, [*base, "--member", demo_report.RESTARTED, "--first-fresh-after", f"{restart_wall:.3f}"], wlog
            )
            try:
                deadline = Deadline(catch_up_timeout)
                fresh = wait_for(
                    lambda: second.event("fresh") or {}, deadline.remaining(), 0.05, "the first fresh record"
                )
                fresh_at = float(fresh["t"])
                say(
                    f"first record produced after the restart delivered {fresh_at - restart_wall:.2f} s after the "
                    f"restart, {fresh_at - crash_wall:.2f} s after the kill"
                )

                def caught_up() -> bool:
                    ledger.read()
                    now_ms = time.time() * 1000
                    # everything from before the restart is in, and for 2 s every record came in time
                    return (
                        ledger.missing(producer.acked(), restart_wall * 1000) == 0
                        and now_ms - ledger.last_late_ms >= 2000
                        and now_ms - ledger.last_done_ms <= 1000
                    )

                wait_for(caught_up, deadline.remaining(), 0.5, "the restarted consumer to catch up with the lag")
                late = demo_report.caught_up_s(ledger, restart_wall)
                say(
                    f"caught up at {'-' if late is None else f'{late:.2f} s'}: {demo_report.CAUGHT_UP_MEANING} "
                    "(none since for 2 s)"
                )
                if parallel:
                    # production goes on meanwhile, so the worker keeps committing and the last backfill commit lands
                    wait_for(
                        lambda: _open_ranges(store_url, group) == 0,
                        deadline.remaining(),
                        0.25,
                        f"every backfill range of group {group} to be done in the store",
                        ignore=(FastRecoverError,),  # e.g. busy or not yet created: look again
                    )
                    say(f"every backfill range done in the store after {time.time() - restart_wall:.2f} s")
                producer.stop()

                def all_delivered() -> bool:
                    ledger.read()
                    return ledger.missing(producer.acked()) == 0

                wait_for(
                    all_delivered,
                    max(30.0, deadline.remaining()),
                    0.5,
                    "the restarted consumer to deliver every acknowledged record",
                )
            except TimeoutError as exc:
                left = f"; open ranges of group {group}: {_open_ranges(store_url, group)}" if parallel else ""
                raise DemoFailed(
                    f"{label}: {exc}{left} (worker log: {workdir / f'{label}.worker.log'}; "
                    f"inspect with: fastrecover status --store-url {mask_url(store_url)} --group {group})"
                ) from exc
            finally:
                second.kill(signal.SIGTERM)  # commits what it finished and closes
        acked = producer.acked()
        return demo_report.measure(
            label,
            PARALLEL if parallel else PLAIN,
            ledger,
            acked,
            restart_wall=restart_wall,
            crash_wall=crash_wall,
            lag_at_restart=demo_report.lag_at(acked, committed, restart_wall),
            open_ranges_left=_open_ranges(store_url, group) if parallel else None,
        )
    finally:
        if not auto_create:
            delete_topic(bootstrap, topic)


@contextmanager
def _broker(bootstrap: str | None, out: TextIO) -> Iterator[tuple[str, bool]]:
    """(bootstrap, is_mock): the given address, a real broker, or librdkafka's mock cluster.

    The mock cluster is the last resort, for machines with neither Java nor a
    Docker engine (FASTRECOVER_BROKER=mock forces it); tests never use it.
    """
    if bootstrap:
        print(f"broker: {bootstrap} (from --bootstrap-servers)", file=out, flush=True)
        yield bootstrap, False
        return
    forced_mock = os.environ.get("FASTRECOVER_BROKER") == "mock"
    from_env = os.environ.get("FASTRECOVER_BOOTSTRAP") or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not forced_mock and (from_env or shutil.which("java") or docker_available()):
        broker: Broker = select_broker()
        try:
            print(f"broker: {broker.describe()}", file=out, flush=True)
            yield broker.bootstrap, False
        finally:
            broker.close()
        return
    mock = MockCluster()
    try:
        print(f"broker: {mock.describe()}", file=out, flush=True)
        yield mock.bootstrap, True
    finally:
        mock.close()


def main(
    bootstrap: str | None,
    store_url: str | None,
    rate: int,
    lag_seconds: float,
    work_us: int,
    partitions: int,
    out: TextIO | None = None,
    *,
    out_dir: Path = Path(DEFAULT_OUT),
    catch_up_timeout: float = 180.0,
    picture: bool = True,
) -> list[StoryResult]:
    out = out or sys.stdout  # looked up now, not at import: a test's captured stdout counts
    workdir = prepare_out(out_dir)
    store = store_url or f"sqlite:///{workdir / 'demo.db'}"
    print(f"output: {workdir} (emptied at the start of every run)", file=out)
    print(f"store: {mask_url(store)}", file=out)
    # Secrets reach the worker processes through their environment, inherited from ours, never argv.
    _, secret_env = url_for_child(store)
    os.environ.update(secret_env)
    story = (
        f"{rate} records/s on {partitions} partitions, {work_us} µs of work per record, "
        f"consumer down for {lag_seconds:g} s"
    )
    print(f"story: {story}", file=out, flush=True)
    results: list[StoryResult] = []
    with _broker(bootstrap, out) as (servers, mock):
        for parallel in (False, True):
            results.append(
                run_story(
                    servers,
                    parallel=parallel,
                    store_url=store,
                    rate=rate,
                    lag_seconds=lag_seconds,
                    work_us=work_us,
                    partitions=partitions,
                    workdir=workdir,
                    out=out,
                    auto_create=mock,
                    catch_up_timeout=catch_up_timeout,
                )
            )
    demo_report.print_report(results, out)
    demo_report.write_json(
        results,
        workdir / "results.json",
        {"rate": rate, "partitions": partitions, "work_us": work_us, "down_seconds": lag_seconds},
    )
    if picture:
        png = workdir / "demo.png"
        demo_report.plot(results, png, story)
        print(f"\npicture: {png}  (delivery latency of every record since the restart)", file=out)
    print(f"numbers: {workdir / 'results.json'}", file=out, flush=True)
    return results
