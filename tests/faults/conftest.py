"""Helpers of the fault campaign: a ChaosDriver on the session broker, named after the test.

The bounded CI versions run a few dozen kill cycles; ``FASTRECOVER_FAULT_CYCLES``
scales them (e.g. 100 for the issue's full single-member loop), and
``fastrecover chaos`` runs the long campaign outside pytest.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fastrecover_tools.chaos.checker import ranges_handed_over, read_ledgers
from fastrecover_tools.chaos.driver import GROUP_PROTOCOLS as GROUP_PROTOCOLS  # the fault tests' parametrisation
from fastrecover_tools.chaos.driver import ChaosConfig, ChaosDriver, ChaosResult, WorkerProc
from fastrecover_tools.chaos.report import format_result
from fastrecover_tools.testing.proxy import FreezableProxy
from fastrecover_tools.testing.waiting import wait_for

log = logging.getLogger("fastrecover_tools.chaos")

# The fault tests run with every one of the driver's GROUP_PROTOCOLS, imported above (issue 10:
# KIP-848 groups on the real broker). ``chaos_driver`` makes KIP-848 members dynamic unless asked
# otherwise: a static member restarted before the broker expired its SIGKILLed predecessor is fenced
# with UNRELEASED_INSTANCE_ID, a fatal error, which would only renumber the incarnations the fault
# tests follow; the kill loops keep static members (``static=True``) and exercise that path on purpose.

#: The scripted fault tests' campaign: one member on one 3-partition topic, no random kills (the
#: test kills and restarts the member itself).
SCRIPTED = {"members": 1, "cycles": 0, "topics": 1, "partitions": 3}

#: Multiplier of the bounded cycle counts (FASTRECOVER_FAULT_CYCLES=100 runs fault 1 with 100 kills).
CYCLES = int(os.environ.get("FASTRECOVER_FAULT_CYCLES", "0") or 0)

DriverFactory = Callable[..., ChaosDriver]


def cycles(bounded: int) -> int:
    return CYCLES or bounded


@pytest.fixture
def chaos_driver(
    bootstrap: str, topic_factory: Any, unique_group: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[DriverFactory]:
    """Make a ChaosDriver on test-owned topics; every process it started is killed at teardown."""
    made: list[ChaosDriver] = []

    def make(
        *,
        topics: int = 3,
        partitions: int = 6,
        store_url: str | None = None,
        bootstrap_servers: str | None = None,
        on_kill: Any = None,
        group_protocol: str = "classic",
        static: bool | None = None,
        networks: Sequence[FreezableProxy] = (),
        **kwargs: Any,
    ) -> ChaosDriver:
        """``static`` defaults to static members for classic groups and dynamic ones for KIP-848 groups
        (see GROUP_PROTOCOLS); the kill loops ask for static KIP-848 members on purpose.  ``networks``
        (the members' own proxies to the broker at ``bootstrap_servers``) go to the driver."""
        kwargs["static"] = group_protocol == "classic" if static is None else static
        kwargs["group_protocol"] = group_protocol
        servers = bootstrap_servers or bootstrap
        names = None
        make_topic = topic_factory
        if group_protocol != "classic" and bootstrap_servers is None:
            # KIP-848 groups: a broker that fences dead members within seconds (the worker leaves out
            # the classic-only client keys librdkafka refuses under group.protocol=consumer)
            servers = request.getfixturevalue("kip848_bootstrap")
            make_topic = request.getfixturevalue("kip848_topic_factory")
        if bootstrap_servers is None:
            names = [make_topic(partitions=partitions) for _ in range(topics)]
        seed = int(os.environ.get("FASTRECOVER_CHAOS_SEED", "0")) or zlib.crc32(request.node.name.encode())
        config = ChaosConfig(
            bootstrap=servers,
            store_url=store_url or f"sqlite:///{tmp_path / 'ranges.db'}",
            workdir=tmp_path / "chaos",
            topics=topics,
            partitions=partitions,
            group=unique_group,
            topic_names=names,
            seed=seed,
            **kwargs,
        )
        log.info("chaos seed %d (FASTRECOVER_CHAOS_SEED reproduces it), work dir %s", seed, config.workdir)
        driver = ChaosDriver(config, on_kill=on_kill, networks=networks)
        made.append(driver)
        return driver

    yield make
    for d in made:
        d.abort()


def crash_with_lag(driver: ChaosDriver, *, finished: int, lag: int) -> WorkerProc:
    """The scripted tests' start: a first incarnation (sync commits) finishes ``finished`` records
    and is SIGKILLed, then the producer gets ``lag`` more records acknowledged while nobody reads.

    Returns the killed incarnation.
    """
    driver.start(spawn=False)
    first = driver.spawn(0, faults=False, extra=["--commit", "sync"])
    wait_for(
        lambda: driver.finished_by(0, 0) >= finished, 60, 0.1, f"the first incarnation to finish {finished} records"
    )
    driver.kill(0)
    producer = driver.producer
    assert producer is not None
    target = producer.acked + lag
    wait_for(lambda: producer.acked >= target, 60, 0.1, f"{lag} more records acknowledged (the lag)")
    return first


def wait_or_report(
    driver: ChaosDriver,
    predicate: Callable[[], Any],
    timeout: float,
    interval: float,
    what: str,
    *,
    summary: Callable[[], str] | None = None,
) -> None:
    """wait_for, and on a timeout every member's threads and log tail in the failure (a fault test's timing
    depends on the group and the broker: a report must say where each member stood), after ``summary``."""
    try:
        wait_for(predicate, timeout, interval, what)
    except TimeoutError as exc:
        head = f"{summary()}\n" if summary is not None else ""
        raise AssertionError(f"{exc}\n{head}{driver.dump_stacks()}") from exc


def wait_range_handed_over(driver: ChaosDriver, what: str) -> None:
    """Until the ledgers show a range that incarnations of two members delivered from (at most 120 s)."""
    ledgers = driver.workdir / "ledger"
    wait_or_report(
        driver, lambda: ranges_handed_over(read_ledgers(sorted(ledgers.glob("*.ledger")))[0]) > 0, 120, 0.25, what
    )


def verdict_ok(result: ChaosResult) -> str:
    """The table, logged and returned for assertion messages."""
    table = format_result(result)
    log.info("checker verdict:\n%s", table)
    print(table)
    return table
