"""Merged API semantics: default-off equivalence, consume(), pause/resume, auto-commit, bad commits."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import KafkaException, Message, TopicPartition

from fastrecover import Consumer
from fastrecover.steady import IDLE_SLICE_S
from fastrecover.store import open_store
from fastrecover_tools.testing.broker import produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import (
    consume_until,
    group_offsets,
    lag_after_crash,
    mode_of,
    offset_of,
    parallel_config,
    poll_until,
)


def _drain(consumer: Any, count: int, timeout: float = 60) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []

    def step() -> bool:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            out.append((msg.partition(), msg.offset(), msg.value()))
            consumer.commit(message=msg, asynchronous=False)
        return len(out) >= count

    wait_for(step, timeout, 0.001, f"{count} records")
    return out


def test_default_off_is_the_plain_consumer(
    bootstrap: str, topic_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    topic = topic_factory(partitions=3)
    produce(bootstrap, topic, [f"v{i}" for i in range(300)])
    base = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    ours = Consumer({**base, "group.id": "off-ours-" + topic})
    plain = confluent_kafka.Consumer({**base, "group.id": "off-plain-" + topic})
    try:
        # every public method is confluent_kafka's own: no extra layer, no extra broker calls
        assert isinstance(ours, confluent_kafka.Consumer)
        for name in ("poll", "consume", "commit", "committed", "position", "pause", "resume", "store_offsets"):
            assert getattr(type(ours), name) is getattr(confluent_kafka.Consumer, name)
            assert getattr(ours, name).__self__ is ours
        assert not ours.child_consumer_is_alive() and not ours.parallel_rebalance_enabled
        ours.subscribe([topic])
        plain.subscribe([topic])
        got_ours = sorted(_drain(ours, 300))
        got_plain = sorted(_drain(plain, 300))
        assert got_ours == got_plain
        tps = [TopicPartition(topic, p) for p in range(3)]
        assert [tp.offset for tp in ours.committed(tps, timeout=10)] == [
            tp.offset for tp in plain.committed(tps, timeout=10)
        ]
    finally:
        ours.close()
        plain.close()
    assert not (tmp_path / "fastrecover.db").exists(), "mode off never touches a store"


def test_consume_batches_merge_both_streams_and_commit_both_logs(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=1)
    lag_after_crash(
        bootstrap, topic, unique_group, store_url, tmp_path, produced=50, commit_at=20, block_at=50, log_end=500
    )
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        live_sent: list[bool] = []

        def step() -> bool:
            batch = consumer.consume(100, 0.2)
            assert len(batch) <= 100
            got.extend(m for m in batch if m.error() is None)
            if consumer.recoveries and not live_sent:
                produce(bootstrap, topic, ["live"] * 5, partition=0)  # fresh records after the restart
                live_sent.append(True)
            return {m.offset() for m in got} >= set(range(20, 505))

        wait_for(step, 60, 0.001, "backfill 20..499 and live 500..504 via consume()")
        consumer.commit(asynchronous=False)  # no args: everything returned so far, to both logs
        assert group_offsets(bootstrap, unique_group, topic)[0].offset == 505
        store = open_store(store_url)
        try:
            assert store.open_ranges(unique_group) == []
        finally:
            store.close()
        assert consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 505
    finally:
        consumer.close()


def test_pause_resume_stops_both_consumers(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=1)
    lag_after_crash(
        bootstrap, topic, unique_group, store_url, tmp_path, produced=50, commit_at=20, block_at=50, log_end=3000
    )
    consumer = Consumer(
        parallel_config(
            bootstrap,
            unique_group,
            store_url,
            **{"fastrecover.backfill.queue.max.messages": 100, "fastrecover.backfill.batch.size": 20},
        )
    )
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        poll_until(consumer, got, lambda: len(got) >= 10, 60, "some backfill")
        tp = [TopicPartition(topic, 0)]
        consumer.pause(tp)
        # paused means no record of the partition at all, backfill included
        quiet: list[Message] = []
        for _ in range(20):
            msg = consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                quiet.append(msg)
        assert quiet == [], "a paused partition delivers nothing, not even buffered backfill"
        consumer.resume(tp)
        consume_until(
            consumer,
            got,
            lambda: {m.offset() for m in got + quiet} >= set(range(20, 3000)),
            60,
            "everything after resume",
        )
    finally:
        consumer.close()


def test_auto_commit_commits_only_records_returned_by_an_earlier_poll(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=1)
    lag_after_crash(
        bootstrap, topic, unique_group, store_url, tmp_path, produced=50, commit_at=20, block_at=50, log_end=400
    )
    consumer = Consumer(
        parallel_config(
            bootstrap, unique_group, store_url, **{"enable.auto.commit": True, "auto.commit.interval.ms": 200}
        )
    )
    store = open_store(store_url)
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        poll_until(
            consumer,
            got,
            lambda: len({offset_of(m) for m in got if offset_of(m) < 400}) >= 100,
            60,
            "100 backfill records",
        )
        last = max(offset_of(m) for m in got if offset_of(m) < 400)
        # the store never claims a record the application has not come back from
        (token,) = store.open_ranges(unique_group)
        assert token.progress.committed <= last, "the last returned record is not yet auto-committed"
        poll_until(consumer, got, lambda: {m.offset() for m in got} >= set(range(20, 400)), 60, "all")

        def committed_everything() -> bool:
            consumer.poll(0.05)
            return store.open_ranges(unique_group) == []

        wait_for(committed_everything, 30, 0.001, "auto-commit to finish the range")
    finally:
        store.close()
        consumer.close()


def test_commit_of_an_unassigned_partition_fails_as_plain_does(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, ["a"], partition=0)
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        consumer.subscribe([topic])
        got: list[Message] = []
        poll_until(consumer, got, lambda: got, 60, "one record")
        # issue 10: a drop-in raises what confluent_kafka raises (the broker's answer), not an error of ours
        with pytest.raises(KafkaException, match="UNKNOWN_TOPIC_OR_PART"):
            consumer.commit(offsets=[TopicPartition("nope", 3, 10)], asynchronous=False)
    finally:
        consumer.close()
    assert os.path.exists(store_url.removeprefix("sqlite:///")) or store_url.startswith("postgresql")


class _PythonPoll(Consumer):
    poll = getattr(Consumer.poll, "slow", Consumer.poll)


@pytest.mark.parametrize(
    "call",
    [
        "poll(None)",
        "poll(-1)",
        "consume(-1)",
        "poll(3600)",
        "consume(3600)",
        "fast poll(None)",
        "fast poll(60)",
        "fast-computed poll(60)",
        "python:fast poll(None)",
        "python:fast poll(60)",
        "python:fast-computed poll(60)",
    ],
)
def test_a_call_that_waits_long_returns_the_backlog_of_an_idle_topic(
    call: str, bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, tmp_path: Path
) -> None:
    """The recovery runs inside the application's first blocking call (the group's assignment is
    served there), and the topic stays idle afterwards: the primary has nothing to return at the log
    end, and the backlog comes from the child alone.  A plain consumer returns the first records of
    the backlog as soon as they are fetched; so must this one, however long the call may wait
    (a wait that only ended at its timeout left an idle topic's backlog unread for good under
    ``poll()`` with no timeout)."""
    topic = topic_factory(partitions=1)
    lag_after_crash(
        bootstrap, topic, unique_group, store_url, tmp_path, produced=50, commit_at=20, block_at=50, log_end=300
    )
    impl, _, call = call.rpartition(":")
    # "python:": the Python method that is the C steady path's reference (and its fallback where the
    # extension is not built); the other cases run Consumer.poll as shipped, the C path in make test
    cls = _PythonPoll if impl == "python" else Consumer
    consumer = cls(parallel_config(bootstrap, unique_group, store_url))
    outcome: list[Any] = []
    fast, _, spelled = call.rpartition(" ")
    api, _, arg = spelled.partition("(")
    timeout = None if arg == "None)" else float(arg[:-1])
    if fast:
        # as if records had been flowing: the call starts on Consumer.poll's inlined steady path
        assert mode_of(consumer) is not None
        # "fast": the call passes the run's own timeout object; "fast-computed": another float (a timeout
        # the application computes per call), which the inlined path serves too
        run_timeout = timeout if fast == "fast" else -2.0
        gate = mode_of(consumer).gate
        gate.fast_calls, gate.fast_timeout, gate.fast_wait = 5, run_timeout, IDLE_SLICE_S

    def first_call() -> None:
        try:
            if api == "poll":
                outcome.append(consumer.poll(timeout))
            else:
                outcome.append(consumer.consume(100, timeout))  # type: ignore[arg-type]
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    consumer.subscribe([topic])
    caller = threading.Thread(target=first_call, name="first-call", daemon=True)
    caller.start()
    try:
        caller.join(30)
        if caller.is_alive():
            # The call is still blocked: wake it with one live record so the consumer can be closed, then fail.
            produce(bootstrap, topic, ["wake"], partition=0)
            caller.join(30)
            pytest.fail(
                f"{call} did not return the backlog of an idle topic within 30 s (recovered: "
                f"{[(r.committed, r.log_end) for r in consumer.recoveries]})"
            )
        (result,) = outcome
        assert not isinstance(result, BaseException), result
        records = [result] if api == "poll" else result
        assert records, f"{call} returned nothing"
        assert all(m.error() is None for m in records)
        assert {offset_of(m) for m in records} <= set(range(20, 300))  # the backlog: nothing live was produced
        assert consumer.child_consumer_is_alive()
    finally:
        if not caller.is_alive():
            consumer.close()
