"""Fault 4: the broker is stopped and restarted while two consumers run."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from fastrecover_tools.testing.broker import LocalJarBroker
from fastrecover_tools.testing.waiting import wait_for
from tests.faults.conftest import GROUP_PROTOCOLS, DriverFactory, verdict_ok

pytestmark = pytest.mark.faults


@pytest.fixture
def private_broker() -> Iterator[LocalJarBroker]:
    """A broker of our own: stopping the session's broker would hit every other test (or be impossible)."""
    broker = LocalJarBroker()
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@pytest.mark.parametrize("group_protocol", GROUP_PROTOCOLS)
def test_broker_stop_and_restart_loses_nothing_and_both_resume(
    private_broker: LocalJarBroker, chaos_driver: DriverFactory, group_protocol: str
) -> None:
    driver = chaos_driver(
        members=2,
        cycles=0,
        topics=2,
        partitions=4,
        rate=200.0,
        bootstrap_servers=private_broker.bootstrap,  # a LocalJarBroker has the KIP-848 session settings
        commit_modes=("sync", "message"),
        stall_share=0.0,
        fail_child_share=0.0,
        group_protocol=group_protocol,
    )
    driver.start()
    wait_for(lambda: all(driver.finished_by(i, 0) >= 100 for i in (0, 1)), 90, 0.2, "both members to finish records")
    producer = driver.producer
    assert producer is not None
    private_broker.stop()
    # keep it away while the producer queues several seconds of records
    wait_for(lambda: producer.sent - producer.acked >= 1000, 60, 0.1, "a backlog of 1000 unacknowledged records")
    private_broker.start()
    back_ms = int(time.time() * 1000)
    wait_for(
        lambda: all(driver.finished_by(i, back_ms) > 0 for i in (0, 1)),
        120,
        0.2,
        "both members to finish records after the broker came back",
    )
    for i in (0, 1):
        proc = driver.proc(i)
        assert proc is not None and proc.alive, f"member {i} died with the broker"
    result = driver.finish()
    table = verdict_ok(result)
    assert result.verdict.ok, table
    assert result.verdict.lost == 0, table
    assert len(result.incarnations) == 2, "nobody had to be restarted: " + table
