"""Where a recovery learns its Kafka cluster: from the primary's client during the join, else a request.

A lineage names the cluster its ranges came from, so a recovery that cannot say which cluster it
talks to does not run.  The primary's client holds the id once its join asked for metadata; reading
it costs no request, and it is read between the waits of the join, never by the recovery itself
(inside a callback).  A metadata request through the child's handle is the fallback: for clients
older than confluent-kafka 2.16 and for a client that has no metadata yet.  The client here points
at a port where nothing listens, so it never has metadata.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover import recovery_reads
from fastrecover.codec import cluster_label
from fastrecover.config import split_config
from fastrecover.recovery_reads import RecoveryReads

NOWHERE = "127.0.0.1:9"


@pytest.fixture
def client() -> Iterator[_KafkaConsumer]:
    consumer = _KafkaConsumer({"bootstrap.servers": NOWHERE, "group.id": "g", "log_level": 0})
    try:
        yield consumer
    finally:
        consumer.close()


def _reads(client: _KafkaConsumer, asked: list[str], answer: str | None) -> RecoveryReads:
    def cluster_of(topic: str) -> str | None:
        asked.append(topic)
        return answer

    _, settings = split_config({"bootstrap.servers": NOWHERE, "group.id": "g"})
    return RecoveryReads(client, settings, "g", cluster_of)


def test_the_id_learned_from_the_primarys_client_is_used_with_no_request(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[Any, float]] = []

    def cached(consumer: Any, timeout: float) -> str:
        seen.append((consumer, timeout))
        return "cluster-A"

    monkeypatch.setattr(recovery_reads, "_CACHED_CLUSTER_ID", cached)
    asked: list[str] = []
    reads = _reads(client, asked, "cluster-B")
    assert not reads.cluster_known
    reads.learn_cluster(0.25)
    reads.learn_cluster(0.25)
    assert seen == [(client, 0.25)], "asked once, waiting at most what the join's wait allows"
    assert reads.cluster_known and reads.cluster_label("t") == cluster_label("cluster-A")
    assert asked == [], "no metadata request through the child's handle"


def test_a_recovery_never_reads_the_cache_itself(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recoveries run inside librdkafka's callbacks, where a cluster_id() that raises breaks the client."""

    def refuse(consumer: Any, timeout: float) -> str:
        raise AssertionError("cluster_id() asked during a recovery")

    monkeypatch.setattr(recovery_reads, "_CACHED_CLUSTER_ID", refuse)
    asked: list[str] = []
    assert _reads(client, asked, "cluster-B").cluster_label("t") == cluster_label("cluster-B")
    assert asked == ["t"]


def test_a_client_with_no_metadata_yet_teaches_nothing(client: Any) -> None:
    if recovery_reads._CACHED_CLUSTER_ID is None:
        pytest.fail("this confluent-kafka has no Consumer.cluster_id(): the test needs 2.16 or later")
    asked: list[str] = []
    reads = _reads(client, asked, "cluster-B")
    reads.learn_cluster(0.0)
    assert not reads.cluster_known
    assert reads.cluster_label("t") == cluster_label("cluster-B") and asked == ["t"], "asked through the child"


def test_an_older_client_teaches_nothing(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery_reads, "_CACHED_CLUSTER_ID", None)
    reads = _reads(client, [], "cluster-B")
    reads.learn_cluster(0.0)
    assert not reads.cluster_known


@pytest.mark.parametrize("cached", ["", None])
def test_an_empty_answer_from_the_cache_is_not_an_id(client: Any, monkeypatch: pytest.MonkeyPatch, cached: Any) -> None:
    monkeypatch.setattr(recovery_reads, "_CACHED_CLUSTER_ID", lambda consumer, timeout: cached)
    reads = _reads(client, [], "cluster-B")
    reads.learn_cluster(0.0)
    assert not reads.cluster_known


def test_no_answer_anywhere_means_no_recovery_and_is_asked_again_after_a_pause(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not cached: the next recovery asks again.  Not at once: a recovery may need the id twice (its
    markers, then its plans), and a second ask would wait out the same timeout again."""
    asked: list[str] = []
    reads = _reads(client, asked, None)
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    reads.learn_cluster(0.0)
    assert reads.cluster_label("t") is None and reads.cluster_label("t") is None
    assert asked == ["t"], "asked once within the pause"
    now[0] += recovery_reads._CLUSTER_ASK_PAUSE_S
    assert reads.cluster_label("t") is None and asked == ["t", "t"], "asked again after it"
