"""The commit patterns of the benchmark matrix, and the read loops that apply them.

One module serves the restart worker (a subprocess) and the steady-state runs
(in the bench process), so both measure the same application code.  Only the
public API that ``confluent_kafka.Consumer`` and ``fastrecover.Consumer`` share
is called: whatever the lead changes inside fastrecover, the bench measures it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException


@dataclass(frozen=True)
class Pattern:
    """How an application commits.

    ``kind`` groups patterns for the goals: ``async`` (async commits, auto-commit,
    store_offsets + auto-commit), ``sync-message`` (a sync commit per record,
    a broker or store round trip each) and ``sync-batch`` (a sync commit per
    ``consume(500)``).
    """

    name: str
    label: str
    kind: str
    config: dict[str, Any] = field(default_factory=dict)


PATTERNS: dict[str, Pattern] = {
    p.name: p
    for p in (
        Pattern("auto", "auto-commit (defaults)", "async"),
        Pattern(
            "msg-async",
            "commit(message=m, asynchronous=True) per record",
            "async",
            {"enable.auto.commit": False},
        ),
        Pattern(
            "msg-sync",
            "commit(message=m, asynchronous=False) per record",
            "sync-message",
            {"enable.auto.commit": False},
        ),
        Pattern("batch-async", "commit() async per consume(500)", "async", {"enable.auto.commit": False}),
        Pattern(
            "batch-sync", "commit(asynchronous=False) per consume(500)", "sync-batch", {"enable.auto.commit": False}
        ),
        Pattern(
            "store",
            "store_offsets(message=m) + auto-commit",
            "async",
            {"enable.auto.offset.store": False},
        ),
    )
}

#: (api, pattern) cells of the steady-state table.  poll() only with the two patterns
#: its users typically pair it with; every pattern with consume(500).
STEADY_CELLS: tuple[tuple[str, str], ...] = (
    ("poll", "auto"),
    ("poll", "msg-async"),
    *(("consume", name) for name in PATTERNS),
)

BATCH = 500

OnMessage = Callable[[Any], None] | None
OnBatch = Callable[[], None] | None


def commit_ignoring_nothing(commit: Callable[..., Any], **kwargs: Any) -> None:
    """An offset-less commit with nothing new to commit raises _NO_OFFSET: for this loop that is no error."""
    try:
        commit(**kwargs)
    except KafkaException as exc:
        if exc.args and isinstance(exc.args[0], KafkaError) and exc.args[0].code() == KafkaError._NO_OFFSET:
            return
        raise


def hooks(consumer: Any, pattern: str) -> tuple[OnMessage, OnBatch]:
    """What the loop calls after each record and after each non-empty batch, for ``pattern``.

    Bound methods are looked up once, as a tuned application would.
    """
    commit = consumer.commit
    if pattern == "auto":
        return None, None
    if pattern == "msg-async":
        return (lambda m: commit(message=m, asynchronous=True)), None
    if pattern == "msg-sync":
        return (lambda m: commit(message=m, asynchronous=False)), None
    if pattern == "batch-async":
        return None, (lambda: commit_ignoring_nothing(commit, asynchronous=True))
    if pattern == "batch-sync":
        return None, (lambda: commit_ignoring_nothing(commit, asynchronous=False))
    if pattern == "store":
        store = consumer.store_offsets
        return (lambda m: store(message=m)), None
    raise ValueError(f"unknown commit pattern {pattern!r}; choose from {', '.join(PATTERNS)}")


def consumer_config(pattern: str) -> dict[str, Any]:
    """The configuration keys ``pattern`` needs on top of the bench's own."""
    try:
        return dict(PATTERNS[pattern].config)
    except KeyError:
        raise ValueError(f"unknown commit pattern {pattern!r}; choose from {', '.join(PATTERNS)}") from None


def busy(work_s: float) -> None:
    """Burn ``work_s`` seconds of CPU on this thread (the application's work on one record)."""
    end = time.perf_counter() + work_s
    while time.perf_counter() < end:
        pass
