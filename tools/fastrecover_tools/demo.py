"""``fastrecover demo``: the KIP's story, end to end, plain consumer vs parallel rebalance.

A producer writes a steady stream; a consumer *process* that commits as it goes
is SIGKILLed; production continues so a lag builds; the consumer is restarted.
We measure the time from the restart until the first record produced after the
restart is delivered ("time to fresh"), once with a plain consumer and once
with ``enable.parallel.rebalance``.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fastrecover.store.sql import mask_url, url_for_child
from fastrecover_tools.testing.broker import (
    Broker,
    create_topic,
    delete_topic,
    docker_available,
    group_is_empty,
    select_broker,
)
from fastrecover_tools.testing.driver import EventProcess, SteadyProducer
from fastrecover_tools.testing.mock_cluster import MockCluster
from fastrecover_tools.testing.waiting import Deadline, wait_for

log = logging.getLogger("fastrecover_tools.demo")

_WORKER = "fastrecover_tools.testing.worker"


@dataclass(frozen=True)
class DemoResult:
    mode: str
    lag: int
    time_to_fresh_s: float
    backfill_drained_s: float | None


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
) -> DemoResult:
    mode = "fastrecover (enable.parallel.rebalance)" if parallel else "plain confluent_kafka.Consumer"
    topic = f"demo-{'parallel' if parallel else 'plain'}-{uuid.uuid4().hex[:6]}"
    group = f"demo-{uuid.uuid4().hex[:8]}"
    if not auto_create:  # librdkafka's mock cluster creates topics on first use instead
        create_topic(bootstrap, topic, partitions)
    ledger = workdir / f"{topic}.ledger"
    base = [
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--group",
        group,
        "--ledger",
        str(ledger),
        "--commit",
        "sync",
        "--commit-every",
        "200",
        "--work-us",
        str(work_us),
    ]
    # the store URL on argv carries no secret (ps shows argv); main() put the secrets in the environment
    argv_url, _ = url_for_child(store_url)
    base += ["--parallel", "--store-url", argv_url, "--min-offsets", "100"] if parallel else ["--plain"]

    def say(text: str) -> None:
        print(f"  [{'parallel' if parallel else 'plain   '}] {text}", file=out, flush=True)

    try:
        with SteadyProducer(bootstrap, topic, rate) as producer, open(workdir / f"{topic}.log", "w") as wlog:
            first = EventProcess(_WORKER, base, wlog)

            def warmed_up() -> bool:
                return int((first.latest("progress") or {}).get("finished", 0)) >= rate * 2

            wait_for(warmed_up, 60, 0.1, "the first consumer to make progress")
            first.kill()
            killed_at = producer.sent
            say(f"consumer killed with SIGKILL after {killed_at} records were produced; producing on")
            deadline = Deadline(lag_seconds)

            def lag_built() -> bool:
                # the mock cluster cannot describe groups; the dead member's session expires meanwhile
                return deadline.expired() and (auto_create or group_is_empty(bootstrap, group))

            wait_for(lag_built, lag_seconds + 60, 0.1, "the lag to build and the dead member to leave the group")
            restart_wall = time.time()
            lag_estimate = producer.sent - killed_at
            say(f"restarting the consumer; about {lag_estimate} records arrived while it was down")
            second = EventProcess(_WORKER, [*base, "--first-fresh-after", f"{restart_wall:.3f}"], wlog)

            def fresh_seen() -> dict[str, Any]:
                return second.event("fresh") or {}

            try:
                fresh = wait_for(fresh_seen, 600, 0.05, "the first fresh record")
                ttf = float(fresh["t"]) - restart_wall
                say(f"first record produced after the restart delivered after {ttf:.2f} s")
            finally:
                second.kill(signal.SIGTERM)
        return DemoResult(mode, lag_estimate, ttf, None)
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
    out: TextIO = sys.stdout,
) -> list[DemoResult]:
    workdir = Path(tempfile.mkdtemp(prefix="fastrecover-demo-"))
    store = store_url or f"sqlite:///{os.path.join(os.getcwd(), 'fastrecover-demo.db')}"
    print(f"store: {mask_url(store)}", file=out)
    # Secrets reach the worker processes through their environment, inherited from ours, never argv.
    _, secret_env = url_for_child(store)
    os.environ.update(secret_env)
    print(
        f"story: {rate} records/s on {partitions} partitions, {work_us} µs of work per record, "
        f"consumer down for {lag_seconds:g} s",
        file=out,
        flush=True,
    )
    results: list[DemoResult] = []
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
                )
            )
    print("\ntime until the first record produced after the restart is delivered:", file=out)
    print(f"  {'consumer':<44} {'lag (records)':>14} {'time to fresh':>14}", file=out)
    for r in results:
        print(f"  {r.mode:<44} {r.lag:>14} {r.time_to_fresh_s:>12.2f} s", file=out)
    if len(results) == 2 and results[1].time_to_fresh_s > 0:
        print(
            f"  ratio plain / fastrecover: {results[0].time_to_fresh_s / results[1].time_to_fresh_s:.1f}x",
            file=out,
            flush=True,
        )
    return results
