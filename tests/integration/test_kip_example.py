"""The KIP-333 worked example, on a real broker, against both stores.

First crash: commits at 70, the process is SIGKILLed at 100, the log grows to
120, a parallel-mode consumer restarts: the primary's first record is 120, the
child delivers 70..119, committed() answers from the child's log until the
range is done, and each commit lands in the right log.  Second crash (the
KIP's stalled foreground thread, in-process so the child can be reused):
commits at 140, stall at 170, log at 190: new range [140, 190), primary from
190, the same standby child.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Message, TopicPartition

from fastrecover import Consumer
from fastrecover.ranges import OffsetRange
from fastrecover.store import open_store
from fastrecover_tools.testing.broker import group_is_empty, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import offset_of
from tests.integration.procs import WorkerProcess

SESSION_MS = 3000


def _group_offset(bootstrap: str, group: str, topic: str) -> int:
    probe = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return probe.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        probe.close()


def _config(bootstrap: str, group: str, store_url: str, group_protocol: str = "classic") -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "max.poll.interval.ms": 4000,
        "enable.parallel.rebalance": True,
        "fastrecover.store.url": store_url,
        "fastrecover.backfill.min.offsets": 10,
        "fastrecover.recovery.replay.max.offsets": 0,  # ranges at the first recovery, open store or not
        # the story commits 75 before 70..74: records finished out of order, each committed alone
        "fastrecover.commit.out.of.order": True,
    }
    if group_protocol == "classic":
        config.update({"session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500})
    else:  # KIP-848: the broker owns session and heartbeat (kip848_bootstrap sets them short)
        config["group.protocol"] = group_protocol
    return config


def _poll_until(consumer: Consumer, sink: list[Message], done: Any, timeout: float, what: str) -> None:
    def step() -> bool:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            sink.append(msg)
        return bool(done())

    wait_for(step, timeout, interval=0.001, what=what)


@pytest.mark.broker  # asked for at run time, per protocol (tests/conftest.py: tiers)
@pytest.mark.parametrize("group_protocol", ["classic", "consumer"])
def test_kip_worked_example(
    group_protocol: str, unique_group: str, store_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if group_protocol == "classic":
        bootstrap: str = request.getfixturevalue("bootstrap")
        topic_factory = request.getfixturevalue("topic_factory")
    else:
        bootstrap = request.getfixturevalue("kip848_bootstrap")
        topic_factory = request.getfixturevalue("kip848_topic_factory")
    topic = topic_factory(partitions=1)
    group = unique_group
    produce(bootstrap, topic, [f"r{i}" for i in range(100)], partition=0)

    worker = WorkerProcess(
        [
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--parallel",
            "--store-url",
            store_url,
            "--min-offsets",
            "10",
            "--ledger",
            str(tmp_path / "ledger"),
            "--commit",
            "none",
            "--commit-at",
            "70",
            "--block-at",
            "100",
            "--session-ms",
            str(SESSION_MS),
            *(("--set", f"group.protocol={group_protocol}") if group_protocol != "classic" else ()),
        ],
        tmp_path / "worker.log",
    )
    worker.wait_event("committed", 60)
    worker.wait_event("blocked", 60)
    worker.sigkill()  # the crash at offset 100
    assert _group_offset(bootstrap, group, topic) == 70

    produce(bootstrap, topic, [f"r{i}" for i in range(100, 120)], partition=0)  # the log grows to 120
    wait_for(lambda: group_is_empty(bootstrap, group), 30, 0.2, "the killed member to leave the group")

    consumer = Consumer(_config(bootstrap, group, store_url, group_protocol))
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        _poll_until(consumer, got, lambda: consumer.recoveries, 60, "recovery on assignment")
        report = consumer.recoveries[0]
        assert (report.committed, report.log_end, report.primary_start) == (70, 120, 120)
        assert report.new_ranges == (OffsetRange(70, 120),)
        assert consumer.child_consumer_is_alive()
        assert consumer.children_started == 1

        produce(bootstrap, topic, [f"r{i}" for i in range(120, 130)], partition=0)  # fresh data after the restart
        _poll_until(consumer, got, lambda: len(got) >= 60, 60, "70..129 delivered")
        offsets = [offset_of(m) for m in got]
        backfill = [o for o in offsets if o < 120]
        live = [o for o in offsets if o >= 120]
        assert backfill == list(range(70, 120)), "the child delivers exactly the lag, in order"
        assert live == list(range(120, 130)), "the primary's first record is 120"

        # committed(): the child's committed offset while the range is open
        assert consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 70

        by_offset = {m.offset(): m for m in got}
        # out of order inside the range: 75 finishes first; committed stays 70 but 75 is remembered
        consumer.commit(message=by_offset[75], asynchronous=False)
        assert consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 70
        store = open_store(store_url)
        try:
            (token,) = store.open_ranges(group, topic, 0)
            assert token.progress.committed == 70 and token.progress.completed == frozenset({75})
            for o in range(70, 75):
                consumer.commit(message=by_offset[o], asynchronous=False)
            assert store.get(token.id).progress.committed == 76  # 70..74 plus the earlier 75
            assert consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 76

            # a primary record commits to Kafka's group offsets, not the store
            consumer.commit(message=by_offset[129], asynchronous=False)
            assert _group_offset(bootstrap, group, topic) == 130
            assert store.get(token.id).progress.committed == 76
            assert consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 76

            # finish the range: committed() now answers with the primary's offset
            consumer.commit(offsets=[TopicPartition(topic, 0, 120)], asynchronous=False)
            assert store.get(token.id).is_open is False
            assert consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 130
        finally:
            store.close()

        # ---- second crash: commits at 140, the foreground thread stalls at 170, the log grows to 190
        produce(bootstrap, topic, [f"r{i}" for i in range(130, 170)], partition=0)
        seen: list[Message] = []
        _poll_until(consumer, seen, lambda: seen and seen[-1].offset() == 169, 60, "primary reaches 169")
        consumer.commit(offsets=[TopicPartition(topic, 0, 140)], asynchronous=False)
        produce(bootstrap, topic, [f"r{i}" for i in range(170, 190)], partition=0)
        # stall: no poll() until the group has dropped us (max.poll.interval.ms exceeded)
        wait_for(lambda: group_is_empty(bootstrap, group), 60, 0.2, "the stalled member to leave the group")
        after: list[Message] = []
        _poll_until(consumer, after, lambda: len(consumer.recoveries) >= 2, 60, "second recovery")
        second = consumer.recoveries[-1]
        assert (second.committed, second.log_end, second.primary_start) == (140, 190, 190)
        assert second.new_ranges == (OffsetRange(140, 190),)
        produce(bootstrap, topic, [f"r{i}" for i in range(190, 195)], partition=0)
        _poll_until(
            consumer, after, lambda: {m.offset() for m in after} >= set(range(140, 195)), 60, "140..194 delivered"
        )
        live2 = [offset_of(m) for m in after if offset_of(m) >= 190]
        assert live2 == list(range(190, 195))
        assert consumer.children_started == 1, "the standby child is reused, not recreated"
        assert consumer.children_started == 1, "the standby child is reused, not replaced"
        assert consumer.child_consumer_is_alive()
    finally:
        consumer.close()
    assert not consumer.child_consumer_is_alive()
