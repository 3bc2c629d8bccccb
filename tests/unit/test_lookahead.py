"""The lookahead's rules: what it asks during the join, and when its log ends may be used.

A stand-in client answers the two calls the thread makes (``list_topics``, ``offsets_for_times``):
the rules under test are the lookahead's own (which topics it asks for, a single use, the age and
completeness a recovery needs), not the client's.
"""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fastrecover import lookahead as lookahead_module
from fastrecover.lookahead import Lookahead


class _Topic:
    def __init__(self, partitions: int) -> None:
        self.partitions = dict.fromkeys(range(partitions))
        self.error = None


class _Metadata:
    def __init__(self, topic: str, partitions: int) -> None:
        self.cluster_id = "cluster-A"
        self.topics = {topic: _Topic(partitions)}


class FakeHandle:
    """Answers for topics named ``t<N>`` with N partitions, each at log end 100 + partition."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.asked: list[str] = []
        self.threads: set[str] = set()

    def list_topics(self, topic: str, timeout: float) -> _Metadata:
        self.threads.add(threading.current_thread().name)
        self.asked.append(topic)
        if self.fail:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return _Metadata(topic, int(topic[1:]))

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 100 + tp.partition) for tp in partitions]


def _settled(handle: FakeHandle, topics: list[str]) -> Lookahead:
    ahead = Lookahead(handle, topics)
    ahead.settle()
    return ahead


def test_it_reads_the_cluster_and_every_log_end_on_a_thread_of_its_own() -> None:
    handle = FakeHandle()
    ahead = _settled(handle, ["t2", "t1"])
    assert ahead.cluster_id == "cluster-A"
    assert handle.threads == {"fastrecover-lookahead"}
    assert ahead.log_ends([("t2", 0), ("t2", 1), ("t1", 0)]) == {("t2", 0): 100, ("t2", 1): 101, ("t1", 0): 100}


def test_the_log_ends_are_given_out_once() -> None:
    ahead = _settled(FakeHandle(), ["t1"])
    assert ahead.log_ends([("t1", 0)]) == {("t1", 0): 100}
    assert ahead.log_ends([("t1", 0)]) is None
    assert ahead.cluster_id == "cluster-A", "the cluster id stays"


def test_a_partition_it_did_not_read_leaves_the_recovery_to_ask() -> None:
    ahead = _settled(FakeHandle(), ["t1"])
    assert ahead.log_ends([("t1", 0), ("t1", 1)]) is None


def test_log_ends_older_than_the_limit_are_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    ahead = _settled(FakeHandle(), ["t1"])
    monkeypatch.setattr(lookahead_module, "MAX_AGE_S", 0.0)
    assert ahead.log_ends([("t1", 0)]) is None


@pytest.mark.parametrize("topics", [["^t.*"], [f"t{i}" for i in range(1, 10)], []])
def test_patterns_and_many_topics_are_left_to_the_recovery(topics: list[str]) -> None:
    handle = FakeHandle()
    ahead = _settled(handle, topics)
    assert handle.asked == [] and ahead.cluster_id is None and ahead.log_ends([("t1", 0)]) is None


def test_a_broker_that_does_not_answer_stops_it_at_the_first_topic() -> None:
    handle = FakeHandle(fail=True)
    ahead = _settled(handle, ["t1", "t2", "t3"])
    assert handle.asked == ["t1"]
    assert ahead.cluster_id is None and ahead.log_ends([("t1", 0)]) is None


def test_settle_waits_for_the_thread() -> None:
    release = threading.Event()

    class Slow(FakeHandle):
        def offsets_for_times(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
            release.wait(10)
            return super().offsets_for_times(partitions, timeout)

    ahead = Lookahead(Slow(), ["t1"])
    waiter = threading.Thread(target=ahead.settle)
    waiter.start()
    waiter.join(0.05)
    assert waiter.is_alive(), "settle() returned while the thread still held the handle"
    release.set()
    waiter.join(10)
    assert not waiter.is_alive() and ahead.log_ends([("t1", 0)]) == {("t1", 0): 100}
