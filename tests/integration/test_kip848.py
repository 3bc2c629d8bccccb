"""Issue 10: KIP-333 recovery in KIP-848 groups (``group.protocol=consumer``) on a real Kafka 4 broker.

The consumer group protocol moves session and heartbeat settings to the broker
(``kip848_bootstrap`` is a broker that fences a dead member within seconds), hands partitions
out incrementally and lets a member that stalls past ``max.poll.interval.ms`` leave on its own.
The KIP's story must hold there too: commit at 70, SIGKILL at 100, a lag, a restart that backfills
it while live records flow; a stall; several members sharing the ranges.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import Message, TopicPartition

from fastrecover import Consumer
from fastrecover_tools.testing.broker import group_is_empty, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.dropin import make_lag
from tests.integration.procs import WorkerProcess

pytestmark = pytest.mark.integration

MAX_POLL_MS = 6000


def _config(bootstrap: str, group: str, store_url: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": "consumer",
        "enable.auto.commit": True,  # with the auto offset store: what an application has had is committed
        "auto.commit.interval.ms": 500,
        "auto.offset.reset": "earliest",
        "max.poll.interval.ms": MAX_POLL_MS,
        "enable.parallel.rebalance": True,
        "fastrecover.store.url": store_url,
        "fastrecover.backfill.min.offsets": 10,
        "fastrecover.recovery.replay.max.offsets": 0,  # ranges at the first recovery, open store or not
    }
    conf.update(extra)
    return conf


def _kafka_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    probe = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return [tp.offset for tp in probe.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)]
    finally:
        probe.close()


def _drain(consumer: Consumer, sink: list[Message], done: Any, timeout: float, what: str) -> None:
    """consume() into ``sink`` until ``done()``; auto-commit commits what was returned."""

    def step() -> bool:
        sink.extend(m for m in consumer.consume(500, 0.2) if m.error() is None)
        return bool(done())

    wait_for(step, timeout, 0.001, what)


def test_kip_story_with_the_consumer_group_protocol(
    kip848_bootstrap: str, kip848_topic_factory: Any, tmp_path: Path, store_url: str
) -> None:
    bootstrap = kip848_bootstrap
    topic = kip848_topic_factory(1)
    group = f"g-kip848-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, [f"r{i}" for i in range(100)], partition=0)
    worker = WorkerProcess(
        [
            *("--bootstrap", bootstrap, "--topic", topic, "--group", group, "--parallel"),
            *("--store-url", store_url, "--min-offsets", "10", "--ledger", str(tmp_path / "ledger")),
            *("--commit", "none", "--commit-at", "70", "--block-at", "100"),
            *("--set", "group.protocol=consumer"),
        ],
        tmp_path / "worker.log",
    )
    try:
        worker.wait_event("committed", 60)
        worker.wait_event("blocked", 60)
    finally:
        worker.sigkill()  # the crash at offset 100
    assert _kafka_offsets(bootstrap, group, topic, 1) == [70]
    log_end = 40_000  # the lag
    produce(bootstrap, topic, [f"r{i}" for i in range(100, log_end)], partition=0)  # the lag
    wait_for(lambda: group_is_empty(bootstrap, group), 30, 0.2, "the killed member to be fenced")

    consumer = Consumer(_config(bootstrap, group, store_url))
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        _drain(consumer, got, lambda: consumer.recoveries, 60, "recovery on assignment")
        report = consumer.recoveries[0]
        assert (report.committed, report.log_end, report.primary_start) == (70, log_end, log_end)
        produce(bootstrap, topic, [f"r{i}" for i in range(log_end, log_end + 50)], partition=0)
        _drain(
            consumer,
            got,
            lambda: {m.offset() for m in got} >= set(range(70, log_end + 50)),
            90,
            "the lag and the fresh records",
        )

        # committed() catches up with Kafka's own offset once every range is done
        def caught_up() -> bool:
            got.extend(m for m in consumer.consume(100, 0.1) if m.error() is None)  # auto-commit runs on
            merged = consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
            return bool(merged == _kafka_offsets(bootstrap, group, topic, 1)[0] == log_end + 50)

        wait_for(caught_up, 30, 0.2, "committed() to equal Kafka's offset at the log end")

        # the member stalls past max.poll.interval.ms: librdkafka leaves the group for it
        produce(bootstrap, topic, [f"r{i}" for i in range(log_end + 50, log_end + 3000)], partition=0)
        wait_for(lambda: group_is_empty(bootstrap, group), MAX_POLL_MS / 1000 + 30, 0.2, "the stalled member to leave")
        after: list[Message] = []
        _drain(
            consumer,
            after,
            lambda: {m.offset() for m in after} >= set(range(log_end + 50, log_end + 3000)),
            90,
            "every record produced during the stall",
        )
    finally:
        consumer.close()


def test_several_members_share_the_lag_and_every_record_is_delivered(
    kip848_bootstrap: str, kip848_topic_factory: Any, tmp_path: Path
) -> None:
    """Three partitions with a lag each; two members, then a third joins mid-backfill."""
    bootstrap = kip848_bootstrap
    partitions, committed, log_end = 3, 100, 4000
    topic = kip848_topic_factory(partitions)
    group = f"g-kip848-members-{uuid.uuid4().hex[:8]}"
    store_url = f"sqlite:///{tmp_path / 'ranges.db'}"
    make_lag(bootstrap, topic, group, committed=committed, log_end=log_end, partitions=partitions)
    members = [Consumer(_config(bootstrap, group, store_url, **{"fastrecover.owner.id": f"m{i}"})) for i in range(2)]
    got: list[Message] = []
    fresh = 20  # live records after the restart: the primaries commit past the lag
    wanted = {(p, o) for p in range(partitions) for o in range(committed, log_end + fresh)}

    def step() -> bool:
        for member in members:
            got.extend(m for m in member.consume(200, 0.1) if m.error() is None)
        return wanted <= {(m.partition(), m.offset()) for m in got}

    try:
        for member in members:
            member.subscribe([topic])
        wait_for(lambda: step() or len(got) >= 1000, 60, 0.001, "the first thousand records")
        for p in range(partitions):
            produce(bootstrap, topic, [f"fresh{i}" for i in range(fresh)], partition=p)
        third = Consumer(_config(bootstrap, group, store_url, **{"fastrecover.owner.id": "m2"}))
        members.append(third)
        third.subscribe([topic])
        wait_for(step, 120, 0.001, "every record of the lag")
        missing = wanted - {(m.partition(), m.offset()) for m in got}
        assert not missing
        tps = [TopicPartition(topic, p) for p in range(partitions)]

        def caught_up() -> bool:
            step()
            merged = [tp.offset for tp in members[0].committed(tps, timeout=10)]
            return merged == _kafka_offsets(bootstrap, group, topic, partitions) == [log_end + fresh] * partitions

        wait_for(caught_up, 60, 0.2, "committed() and Kafka's offsets at the log end")
    finally:
        for member in members:
            member.close()
