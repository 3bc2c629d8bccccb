"""The broker the other tests stand on: it answers, groups commit, and it survives a restart.

If these fail, every other integration failure is noise; the restart test is
what the fault tests rely on when they take the broker away under clients.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from fastrecover_tools.testing import broker as broker_module
from fastrecover_tools.testing.broker import Broker, Record, group_is_empty, produce
from fastrecover_tools.testing.waiting import Deadline, wait_for
from tests.fixtures.broker import TopicFactory

REPO_ROOT = Path(__file__).resolve().parents[2]


def _consumer(bootstrap: str, group: str, topic: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            # Longer than a broker restart takes on a loaded machine (up to ~15 s seen): this
            # test is about the broker coming back, not about the client's session-timeout path.
            "session.timeout.ms": 45000,
            # Reconnect quickly once a restarted broker is back.
            "reconnect.backoff.max.ms": 1000,
        }
    )
    consumer.subscribe([topic])
    return consumer


def _poll_values(consumer: Consumer, count: int, timeout: float) -> list[str]:
    values: list[str] = []
    deadline = Deadline(timeout)
    while len(values) < count and not deadline.expired():
        msg = consumer.poll(min(0.5, max(0.05, deadline.remaining())))
        if msg is None:
            continue
        if msg.error() is not None:
            # Transient errors (e.g. the broker going away) are reported here; keep polling.
            continue
        value = msg.value()
        assert isinstance(value, bytes)
        values.append(value.decode())
    assert len(values) == count, f"got {len(values)} of {count} records in {timeout:g} s: {values}"
    return values


def _committed(consumer: Consumer, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    result = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=30)
    return {tp.partition: tp.offset for tp in result}


@pytest.mark.integration
def test_broker_answers_metadata(kafka_broker: Broker, bootstrap: str) -> None:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    assert metadata.brokers
    assert kafka_broker.kind in ("env", "container", "local-jars")
    assert bootstrap in kafka_broker.describe()
    if kafka_broker.kind != "env":
        assert kafka_broker.version[0].isdigit(), kafka_broker.version


@pytest.mark.integration
def test_produce_consume_commit(bootstrap: str, topic_factory: TopicFactory, unique_group: str) -> None:
    topic = topic_factory(partitions=2)
    first = produce(bootstrap, topic, [f"a{i}" for i in range(5)], partition=0)
    second = produce(bootstrap, topic, [Record(value=f"b{i}", key="k", partition=1) for i in range(3)])
    assert [d.offset for d in first] == [0, 1, 2, 3, 4]
    assert [(d.partition, d.offset) for d in second] == [(1, 0), (1, 1), (1, 2)]

    consumer = _consumer(bootstrap, unique_group, topic)
    try:
        values = _poll_values(consumer, 8, timeout=60)
        assert sorted(values) == sorted([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(3)])
        consumer.commit(asynchronous=False)
        assert _committed(consumer, topic, [0, 1]) == {0: 5, 1: 3}
        assert not group_is_empty(bootstrap, unique_group)
    finally:
        consumer.close()
    wait_for(lambda: group_is_empty(bootstrap, unique_group), 30, 0.2, f"group {unique_group} to be empty")


@pytest.mark.integration
@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "sigkill"])
def test_stop_and_start_while_a_client_runs(
    kafka_broker: Broker, bootstrap: str, topic_factory: TopicFactory, unique_group: str, graceful: bool
) -> None:
    if kafka_broker.kind == "env":
        pytest.skip("an external broker (FASTRECOVER_BOOTSTRAP) cannot be stopped by the tests")
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, ["before-0", "before-1"])
    consumer = _consumer(bootstrap, unique_group, topic)
    try:
        assert _poll_values(consumer, 2, timeout=60) == ["before-0", "before-1"]
        consumer.commit(asynchronous=False)

        kafka_broker.stop(graceful=graceful)
        assert not kafka_broker.running
        try:
            # The client keeps polling while the broker is away; that must not raise.
            consumer.poll(1.0)
        finally:
            kafka_broker.start()
        assert kafka_broker.running
        assert kafka_broker.bootstrap == bootstrap, "restart must keep the address clients know"

        after = produce(bootstrap, topic, ["after-0", "after-1"])
        assert [d.offset for d in after] == [2, 3], "data written before the stop must survive it"
        assert _poll_values(consumer, 2, timeout=90) == ["after-0", "after-1"]
        consumer.commit(asynchronous=False)
        assert _committed(consumer, topic, [0]) == {0: 4}
    finally:
        consumer.close()

    # A fresh group still sees everything: the log survived the restart.
    fresh = _consumer(bootstrap, unique_group + "-fresh", topic)
    try:
        assert _poll_values(fresh, 4, timeout=60) == ["before-0", "before-1", "after-0", "after-1"]
    finally:
        fresh.close()


def test_maven_reads_the_one_packaged_pom(tmp_path: Path) -> None:
    """Jars are resolved from the POM shipped inside fastrecover_tools.testing; there is no second copy to drift."""
    packaged = Path(broker_module.__file__).with_name("kafka-pom.xml")
    pom = broker_module._pom_path(tmp_path)
    assert pom.read_text(encoding="utf-8") == packaged.read_text(encoding="utf-8")
    assert "<artifactId>kafka_2.13</artifactId>" in pom.read_text(encoding="utf-8")
    assert not (REPO_ROOT / "tools" / "kafka" / "pom.xml").exists()
