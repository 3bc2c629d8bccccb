"""Small helpers shared by the integration suites."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import Message, TopicPartition

from fastrecover import Consumer
from fastrecover.parallel import ParallelMode
from fastrecover.recovery_writes import RecoveryReport
from fastrecover_tools.bench.patterns import commit_ignoring_nothing
from fastrecover_tools.testing.broker import group_is_empty, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.procs import WorkerProcess

SESSION_MS = 3000


def parallel_config(bootstrap: str, group: str, store_url: str, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": 500,
        "enable.parallel.rebalance": True,
        "fastrecover.store.url": store_url,
        "fastrecover.backfill.min.offsets": 10,
        "fastrecover.recovery.replay.max.offsets": 0,  # ranges at the first recovery, open store or not
    }
    config.update(extra)
    return config


def mode_of(consumer: Consumer) -> ParallelMode:
    """The mode of a mode-on consumer, built now if no call has needed it yet (fastrecover/startup.py)."""
    return consumer._fr or consumer._build_mode()


def close_as_crashed(consumer: Consumer) -> None:
    """Close without handing ranges back: what a SIGKILL leaves in Kafka and the store."""
    mode_of(consumer).handover.let_go = lambda keys, lost: None  # type: ignore[method-assign]
    consumer.close()


def offset_of(msg: Message) -> int:
    """The record's offset, typed ``int``.

    confluent_kafka types ``Message.offset()`` as Optional (None for an error event); the tests
    compare and sort the offsets of delivered records, which always have one.
    """
    offset = msg.offset()
    assert offset is not None, f"a record without an offset: {msg.error()}"
    return offset


def group_offsets(bootstrap: str, group: str, topic: str, partitions: int = 1) -> list[TopicPartition]:
    probe = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return list(probe.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10))
    finally:
        probe.close()


def poll_until(consumer: Consumer, sink: list[Message], done: Any, timeout: float, what: str) -> None:
    """poll() into ``sink`` until ``done()`` holds, failing after ``timeout`` seconds."""

    def step() -> bool:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            sink.append(msg)
        return bool(done())

    wait_for(step, timeout, interval=0.001, what=what)


def lag_after_crash(
    bootstrap: str,
    topic: str,
    group: str,
    store_url: str,
    tmp_path: Path,
    *,
    produced: int,
    commit_at: int,
    block_at: int,
    log_end: int,
) -> None:
    """The KIP's set-up on partition 0: ``produced`` records, a worker that commits ``commit_at``
    and is SIGKILLed at ``block_at``, then the log grows to ``log_end`` while nobody consumes."""
    produce(bootstrap, topic, [f"r{i}" for i in range(produced)], partition=0)
    crash_after_commit(bootstrap, topic, group, store_url, tmp_path, commit_at=commit_at, block_at=block_at)
    produce(bootstrap, topic, [f"r{i}" for i in range(produced, log_end)], partition=0)


def crash_after_commit(
    bootstrap: str, topic: str, group: str, store_url: str, tmp_path: Path, commit_at: int, block_at: int
) -> None:
    """Run a parallel-mode worker process that commits ``commit_at`` and is SIGKILLed at ``block_at``."""
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
            str(commit_at),
            "--block-at",
            str(block_at),
            "--session-ms",
            str(SESSION_MS),
        ],
        tmp_path / "worker.log",
    )
    try:
        worker.wait_event("committed", 60)
        worker.wait_event("blocked", 60)
    finally:
        worker.sigkill()
    wait_for(lambda: group_is_empty(bootstrap, group), 30, 0.2, "the killed member to leave the group")


def consume_until(consumer: Consumer, sink: list[Message], done: Any, timeout: float, what: str) -> None:
    """Like :func:`poll_until` but in consume() batches, for draining many records quickly."""

    def step() -> bool:
        sink.extend(m for m in consumer.consume(500, 0.2) if m.error() is None)
        return bool(done())

    wait_for(step, timeout, interval=0.001, what=what)


def drain_and_commit(consumer: Consumer, sink: list[Message], partition: TopicPartition, wanted: set[int]) -> None:
    """Consume (committing as it goes) until every offset of ``wanted`` of ``partition`` was delivered and
    the merged committed offset is past them: the ranges under them finished."""

    def done() -> bool:
        commit_ignoring_nothing(consumer.commit, asynchronous=False)  # nothing returned yet is no failure
        (merged,) = consumer.committed([partition], timeout=30)
        return {offset_of(m) for m in sink} >= wanted and merged.offset > max(wanted)

    consume_until(consumer, sink, done, 90, f"{len(wanted)} records, and the committed offset past them")


def delivered_from(bootstrap: str, topic: str, group: str, store_url: str, wanted: set[int]) -> set[int]:
    """Offsets a new fastrecover consumer of ``group`` delivers until it has every one of ``wanted``."""
    return read_all(Consumer(parallel_config(bootstrap, group, store_url)), topic, wanted)[0]


def read_all(consumer: Consumer, topic: str, wanted: set[int]) -> tuple[set[int], list[RecoveryReport]]:
    """Subscribe ``consumer`` to ``topic`` and consume until it delivered every offset of ``wanted``, then close it;
    the offsets delivered and its recoveries.  Fails naming how many of ``wanted`` never came, and the first.
    """
    got: list[Message] = []
    try:
        consumer.subscribe([topic])

        def complete() -> bool:
            return {offset_of(m) for m in got} >= wanted

        try:
            consume_until(consumer, got, complete, 90, f"{len(wanted)} records from offset {min(wanted)}")
        except Exception as exc:
            missing = sorted(wanted - {offset_of(m) for m in got})
            raise AssertionError(f"{len(missing)} records never delivered, from {missing[:5]}...") from exc
        return {offset_of(m) for m in got}, list(consumer.recoveries)
    finally:
        consumer.close()


def plain_reads(bootstrap: str, group: str, topic: str, wanted: set[int], reset: str) -> None:
    """A plain consumer of ``group`` (``auto.offset.reset=reset``) reads ``topic`` until it has every offset of
    ``wanted``; fails naming how many never came, and the first."""
    reader = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": reset})
    got: set[int] = set()
    try:
        reader.subscribe([topic])

        def read() -> bool:
            got.update(offset_of(m) for m in reader.consume(500, 0.2) if m.error() is None)
            return got >= wanted

        try:
            wait_for(read, 60, 0.001, f"a plain consumer to read {len(wanted)} records from offset {min(wanted)}")
        except TimeoutError as exc:
            missing = sorted(wanted - got)
            raise AssertionError(f"{len(missing)} records never delivered, from {missing[:5]}") from exc
    finally:
        reader.close()
