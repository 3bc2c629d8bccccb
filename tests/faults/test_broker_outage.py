"""Fault 4: the broker is stopped and restarted while two consumers run.

Dynamic members must ride the outage out: nobody dies, nobody is restarted.

Static members (classic ``group.instance.id``) can fence *themselves* while the
coordinator is away: a JoinGroup the client gave up on still reaches the
restarted coordinator, the retry takes the instance id under a new member id,
and the older attempt comes back FENCED_INSTANCE_ID, which librdkafka raises as
a fatal error (confluent-kafka-go#494 shows it with a plain client; KAFKA-20985
is the same race in the Java client). fastrecover sends no group request of its
own (the child is assign-only in another group), so it cannot prevent this; it
must lose nothing when it happens and the application restarts the consumer,
which is what the static variant checks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from fastrecover_tools.chaos.driver import ChaosDriver
from fastrecover_tools.testing.broker import LocalJarBroker
from fastrecover_tools.testing.waiting import wait_for
from tests.faults.conftest import DriverFactory, verdict_ok

pytestmark = pytest.mark.faults

#: (group protocol, static members): the classic protocol is run both ways; KIP-848 dynamic only,
#: since its static members are exercised by the kill loops.
MEMBERSHIPS = [("classic", False), ("classic", True), ("consumer", False)]


@pytest.fixture
def private_broker() -> Iterator[LocalJarBroker]:
    """A broker of our own: stopping the session's broker would hit every other test (or be impossible)."""
    broker = LocalJarBroker()
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


def _restart_fenced(driver: ChaosDriver) -> None:
    """What a supervised application does after a fatal consumer error: start a new consumer."""
    for i in (0, 1):
        proc = driver.proc(i)
        if proc is not None and not proc.alive and proc.has("fatal"):
            driver.spawn(i, faults=False)


@pytest.mark.parametrize(
    ("group_protocol", "static"), MEMBERSHIPS, ids=[f"{p}-{'static' if s else 'dynamic'}" for p, s in MEMBERSHIPS]
)
def test_broker_stop_and_restart_loses_nothing_and_both_resume(
    private_broker: LocalJarBroker, chaos_driver: DriverFactory, group_protocol: str, static: bool
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
        static=static,
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

    def both_resumed() -> bool:
        if static:
            _restart_fenced(driver)
        return all(driver.finished_by(i, back_ms) > 0 for i in (0, 1))

    try:
        wait_for(both_resumed, 120, 0.2, "both members to finish records after the broker came back")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{driver.dump_stacks()}") from exc
    for i in (0, 1):
        proc = driver.proc(i)
        assert proc is not None and proc.alive, f"member {i} died with the broker"
    result = driver.finish()
    table = verdict_ok(result)
    assert result.verdict.ok, table
    assert result.verdict.lost == 0, table
    # a restart is only ever the application's answer to a fatal error (static members only)
    assert len(result.incarnations) == 2 + result.fatal_exits, "a member was restarted without a fatal error: " + table
    if not static:
        assert result.fatal_exits == 0, "a dynamic member died with the broker: " + table
