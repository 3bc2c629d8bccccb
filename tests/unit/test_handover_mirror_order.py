"""After a recovery, the ranges are mirrored into Kafka before the child is given them, and given them whatever happens.

The order is about speed: once the child backfills, its thread takes the GIL between its records
and the mirrors of thousands of partitions took twice as long to build and commit.  The ``finally``
is about records: the primary has already skipped the ranges' offsets, so the child must read them
even when the mirror cannot be built.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from fastrecover import handover
from fastrecover.recoverer import Recovered
from fastrecover.tokens import TopicPartitionKey

KEYS = [TopicPartitionKey("t", p) for p in range(3)]


def _handover(events: list[tuple[str, Any]], *, mirror_fails: Exception | None = None) -> handover.Handover:
    def with_mirror(key: TopicPartitionKey, offset: int, _user: str | None) -> str:
        if mirror_fails is not None:
            raise mirror_fails
        events.append(("mirror", key.partition))
        return f"{key.partition}@{offset}"

    parts = SimpleNamespace(
        app=object(),
        book=SimpleNamespace(works=lambda ids: [f"work-{i}" for i in ids]),
        partitions=SimpleNamespace(set_floors=lambda floors: None, refresh=lambda: None),
        settings=SimpleNamespace(commit_mirror=True),
        with_mirror=with_mirror,
        child=SimpleNamespace(add=lambda works: events.append(("child", list(works)))),
    )
    gate = SimpleNamespace(leave=lambda: events.append(("gate", None)))
    return handover.Handover(parts, router=None, streams=None, gate=gate)  # type: ignore[arg-type]


def _recovered() -> Recovered:
    return Recovered([], [11, 12, 13], [(k, 100) for k in KEYS], {})


class _Commits:
    def __init__(self, events: list[tuple[str, Any]], error: Exception | None = None) -> None:
        self.events, self.error = events, error

    def commit(self, _app: object, *, offsets: list[str], asynchronous: bool) -> None:
        assert asynchronous is False, "a synchronous commit: an asynchronous one reaches the application's on_commit"
        self.events.append(("commit", offsets))
        if self.error is not None:
            raise self.error


def test_the_mirrors_are_committed_before_the_child_gets_the_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, Any]] = []
    monkeypatch.setattr(handover, "_K", _Commits(events))
    _handover(events).started(_recovered())
    assert events == [
        ("mirror", 0),
        ("mirror", 1),
        ("mirror", 2),
        ("commit", ["0@100", "1@100", "2@100"]),
        ("gate", None),
        ("child", ["work-11", "work-12", "work-13"]),
    ]


def test_a_refused_mirror_commit_is_logged_and_the_child_still_reads_the_ranges(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[tuple[str, Any]] = []
    monkeypatch.setattr(handover, "_K", _Commits(events, KafkaException(KafkaError(KafkaError._TIMED_OUT))))
    _handover(events).started(_recovered())
    assert events[-1] == ("child", ["work-11", "work-12", "work-13"])
    assert "could not mirror ranges into commit metadata" in caplog.text


def test_a_mirror_that_cannot_be_built_raises_after_the_child_was_given_the_ranges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[tuple[str, Any]] = []
    monkeypatch.setattr(handover, "_K", _Commits(events))
    with pytest.raises(ValueError, match="does not fit"):
        _handover(events, mirror_fails=ValueError("mirror of one range does not fit")).started(_recovered())
    assert events == [("gate", None), ("child", ["work-11", "work-12", "work-13"])], "no commit, and the child reads"
