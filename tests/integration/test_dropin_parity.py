"""Issue 10: fastrecover.Consumer is confluent_kafka.Consumer in every call, mode off and on.

Each test runs the same calls against ``confluent_kafka.Consumer`` (the reference) and
``fastrecover.Consumer`` with the mode off and on, and compares return values and exceptions
(exact type and message).  The plain consumer's behaviour is never written down here: it is
observed in the same run, so a confluent-kafka upgrade moves the reference with it.

Differences the KIP itself makes (two commit logs, backfill interleaved with live records,
merged ``committed()``) are tested in test_kip_example.py and test_merged_semantics.py, not here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import TopicPartition

import fastrecover
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.dropin import (
    OURS,
    Outcome,
    base_config,
    commit_offsets,
    consumer_class,
    flavour_config,
    make,
    make_lag,
    outcome,
)

# ---------------------------------------------------------------------------------------------
# argument checks: the exact exception (or value) plain gives, before anything is taken

Call = Callable[[Any, str], Any]

ARG_CASES: dict[str, Call] = {
    "consume(1, None)": lambda c, t: c.consume(1, None),
    "consume(0)": lambda c, t: c.consume(0),
    "consume(0, 0)": lambda c, t: c.consume(0, 0),
    "consume(-1)": lambda c, t: c.consume(-1),
    "consume(1000001, 0)": lambda c, t: c.consume(1000001, 0),
    "consume('1')": lambda c, t: c.consume("1"),
    "consume(1, '1')": lambda c, t: c.consume(1, "1"),
    "consume(1, 0, 3)": lambda c, t: c.consume(1, 0, 3),
    "poll('1')": lambda c, t: c.poll("1"),
    "poll(0, 1)": lambda c, t: c.poll(0, 1),
    "commit(message='x')": lambda c, t: c.commit(message="x"),
    "commit(1)": lambda c, t: c.commit(1),
    "commit(offsets='x')": lambda c, t: c.commit(offsets="x"),
    "commit(offsets=['x'])": lambda c, t: c.commit(offsets=["x"]),
    "commit(offsets=[])": lambda c, t: c.commit(offsets=[], asynchronous=False),
    "subscribe(on_assign='x')": lambda c, t: c.subscribe([t], on_assign="x"),
    "subscribe(on_revoke='x')": lambda c, t: c.subscribe([t], on_revoke="x"),
    "subscribe(on_lost='x')": lambda c, t: c.subscribe([t], on_lost="x"),
    "subscribe('t')": lambda c, t: c.subscribe(t),
    "subscribe([])": lambda c, t: c.subscribe([]),
    "subscribe(foo=1)": lambda c, t: c.subscribe([t], foo=1),
    "assign('x')": lambda c, t: c.assign("x"),
    "assign(['x'])": lambda c, t: c.assign(["x"]),
    "assign()": lambda c, t: c.assign(),
    "unassign(1)": lambda c, t: c.unassign(1),
    "incremental_assign('x')": lambda c, t: c.incremental_assign("x"),
    "incremental_unassign('x')": lambda c, t: c.incremental_unassign("x"),
    "store_offsets()": lambda c, t: c.store_offsets(),
    "store_offsets(message='x')": lambda c, t: c.store_offsets(message="x"),
    "store_offsets(offsets='x')": lambda c, t: c.store_offsets(offsets="x"),
    # enable.auto.offset.store is on (the default): plain refuses any store with _INVALID_ARG
    "store_offsets(offsets=[tp]) with auto store": lambda c, t: c.store_offsets(offsets=[TopicPartition(t, 0, 5)]),
    "committed('x')": lambda c, t: c.committed("x"),
    "committed(timeout='x')": lambda c, t: c.committed([TopicPartition(t, 0)], timeout="x"),
    "pause('x')": lambda c, t: c.pause("x"),
    "resume('x')": lambda c, t: c.resume("x"),
    "seek('x')": lambda c, t: c.seek("x"),
    "position('x')": lambda c, t: c.position("x"),
}


#: Calls with the wrong number of arguments: plain's C methods and a Python method word the
#: TypeError differently ("takes at most 2 arguments (3 given)" vs "takes from 1 to 3 positional
#: arguments but 4 were given").  The type must match; the wording is CPython's, not ours.
ARITY_CASES = frozenset({"consume(1, 0, 3)", "poll(0, 1)", "subscribe(foo=1)", "assign()", "unassign(1)"})


def _compare(name: str, plain: Outcome, ours: Outcome, flavour: str) -> None:
    if name in ARITY_CASES:
        assert (ours.kind, ours.exc_type) == (plain.kind, plain.exc_type) == ("raise", TypeError), (
            f"{name} with mode {flavour}: plain {plain}, fastrecover {ours}"
        )
        return
    assert (ours.kind, ours.exc_type, ours.message, ours.value) == (
        plain.kind,
        plain.exc_type,
        plain.message,
        plain.value,
    ), f"{name} with mode {flavour}: plain {plain}, fastrecover {ours}"


def _arg_params() -> list[Any]:
    out = []
    for name in ARG_CASES:
        for flavour in OURS:
            out.append(pytest.param(name, flavour, id=f"{name}-{flavour}"))
    return out


@pytest.mark.parametrize(("name", "flavour"), _arg_params())
def test_argument_check_matches_plain(
    name: str, flavour: str, bootstrap: str, unique_group: str, tmp_path: Path
) -> None:
    """A fresh consumer (nothing assigned): the same call gives the same value or exception."""
    topic = f"never-created-{unique_group}"
    results = {}
    for which in ("plain", flavour):
        consumer = make(which, base_config(bootstrap, f"{unique_group}-{which}"), tmp_path)
        try:
            results[which] = outcome(partial(ARG_CASES[name], consumer, topic), deadline_s=5.0)
        finally:
            consumer.close()
    _compare(name, results["plain"], results[flavour], flavour)


def _first_record(consumer: Any, timeout: float) -> None:
    def got() -> bool:
        msg = consumer.poll(0.2)
        return msg is not None and msg.error() is None

    wait_for(got, timeout, 0.001, "a first record")


#: The checks whose mode-on code path differs while a backfill runs (the child has records queued).
BACKFILL_CASES = (
    "consume(1, None)",
    "consume(0)",
    "consume(0, 0)",
    "consume(-1)",
    "consume(1000001, 0)",
    "consume('1')",
    "consume(1, '1')",
    "poll('1')",
    "commit(message='x')",
    "commit(offsets=['x'])",
    "store_offsets(message='x')",
    "pause('x')",
    "seek('x')",
)


def test_argument_checks_during_backfill_match_plain(
    bootstrap: str, topic_factory: Any, unique_group: str, tmp_path: Path
) -> None:
    """The same checks while mode on has a backfill running; plain is assigned at the same offsets."""
    topic = topic_factory(partitions=1)
    results: dict[str, dict[str, Outcome]] = {}
    make_lag(bootstrap, topic, f"{unique_group}-plain", committed=100, log_end=3000)
    commit_offsets(bootstrap, f"{unique_group}-on", [TopicPartition(topic, 0, 100)])
    for which in ("plain", "on"):
        group = f"{unique_group}-{which}"
        consumer = make(which, base_config(bootstrap, group), tmp_path)
        try:
            consumer.assign([TopicPartition(topic, 0)])
            _first_record(consumer, 30)
            results[which] = {name: outcome(partial(ARG_CASES[name], consumer, topic), 5.0) for name in BACKFILL_CASES}
        finally:
            consumer.close()
    bad = [
        f"{name}: plain {results['plain'][name]}, fastrecover {results['on'][name]}"
        for name in BACKFILL_CASES
        if (results["plain"][name].kind, results["plain"][name].exc_type, results["plain"][name].message)
        != (results["on"][name].kind, results["on"][name].exc_type, results["on"][name].message)
    ]
    assert not bad, "mode on differs from plain during a backfill:\n" + "\n".join(bad)


# ---------------------------------------------------------------------------------------------
# construction and subclassing


@pytest.mark.parametrize(
    "args",
    [
        pytest.param((), id="no-config"),
        pytest.param((None,), id="None"),
        pytest.param(("x",), id="str"),
        pytest.param(({},), id="empty-dict"),
    ],
)
def test_construction_errors_match_plain(args: tuple[Any, ...]) -> None:
    plain = outcome(lambda: confluent_kafka.Consumer(*args))
    ours = outcome(lambda: fastrecover.Consumer(*args))
    assert plain.kind == "raise"
    if args == ({},):
        # plain: ValueError('Failed to create consumer: group.id must be set'); ours may name the key in
        # its own ConfigError, which is a ValueError: callers catching ValueError see no difference.
        assert ours.kind == "raise" and ours.exc_type is not None and issubclass(ours.exc_type, ValueError), ours
        assert "group.id" in ours.message, ours
        return
    _compare(repr(args), plain, ours, "off")


@pytest.mark.parametrize(
    "flavour",
    [
        pytest.param(
            f,
        )
        for f in OURS
    ],
)
def test_is_a_confluent_kafka_consumer(flavour: str, bootstrap: str, unique_group: str, tmp_path: Path) -> None:
    consumer = make(flavour, base_config(bootstrap, unique_group), tmp_path)
    try:
        assert isinstance(consumer, confluent_kafka.Consumer)
    finally:
        consumer.close()


def _recording_subclass(base: type[Any]) -> type[Any]:
    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(self, conf: dict[str, Any]) -> None:
            super().__init__(conf)
            self.calls: list[str] = []

        def poll(self, timeout: float = -1) -> Any:
            self.calls.append("poll")
            return super().poll(timeout)

        def assign(self, partitions: list[TopicPartition]) -> None:
            self.calls.append("assign")
            super().assign(partitions)

        def unassign(self) -> None:
            self.calls.append("unassign")
            super().unassign()

    return Recording


@pytest.mark.parametrize(
    "flavour",
    [
        pytest.param(
            "off",
        ),
        "on",
    ],
)
def test_subclass_overrides_run(
    flavour: str, bootstrap: str, topic_factory: Any, unique_group: str, tmp_path: Path
) -> None:
    """A subclass that overrides poll/assign/unassign has its override run, as with plain."""
    topic = topic_factory(partitions=1)
    seen: dict[str, Any] = {}
    for which in ("plain", flavour):
        cls = _recording_subclass(consumer_class(which))
        consumer = cls(flavour_config(which, base_config(bootstrap, f"{unique_group}-{which}"), tmp_path))
        try:
            results = [
                outcome(partial(consumer.assign, [TopicPartition(topic, 0)])),
                outcome(partial(consumer.poll, 0.1)),
                outcome(consumer.unassign),
            ]
            seen[which] = (list(consumer.calls), [(o.kind, o.exc_type, o.message) for o in results])
        finally:
            consumer.close()
    assert seen[flavour] == seen["plain"]
    assert seen["plain"][0] == ["assign", "poll", "unassign"]


_METHODS: dict[str, Call] = {
    "poll": lambda c, t: c.poll(0),
    "consume": lambda c, t: c.consume(1, 0),
    "assignment": lambda c, t: c.assignment(),
    "commit": lambda c, t: c.commit(offsets=[TopicPartition(t, 0, 1)]),
    "committed": lambda c, t: c.committed([TopicPartition(t, 0)]),
    "subscribe": lambda c, t: c.subscribe([t]),
    "assign": lambda c, t: c.assign([TopicPartition(t, 0)]),
    "unassign": lambda c, t: c.unassign(),
    "pause": lambda c, t: c.pause([TopicPartition(t, 0)]),
    "position": lambda c, t: c.position([TopicPartition(t, 0)]),
    "store_offsets": lambda c, t: c.store_offsets(offsets=[TopicPartition(t, 0, 1)]),
    "close": lambda c, t: c.close(),
}


def test_subclass_without_super_init_is_a_closed_consumer() -> None:
    """Never calling super().__init__: every method raises RuntimeError('Consumer closed') like plain."""

    def no_init(base: type[Any]) -> Any:
        class NoInit(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                pass

        return NoInit()

    plain, ours = no_init(confluent_kafka.Consumer), no_init(fastrecover.Consumer)
    bad = []
    for name, call in _METHODS.items():
        p, o = outcome(partial(call, plain, "t")), outcome(partial(call, ours, "t"))
        if (p.kind, p.exc_type, p.message) != (o.kind, o.exc_type, o.message):
            bad.append(f"{name}: plain {p}, fastrecover {o}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "flavour",
    [
        "off",
        pytest.param(
            "on",
        ),
    ],
)
def test_methods_after_close_match_plain(flavour: str, bootstrap: str, unique_group: str, tmp_path: Path) -> None:
    """After close(): RuntimeError('Consumer closed') from every method, close() itself idempotent."""
    topic = f"never-created-{unique_group}"
    got: dict[str, list[str]] = {}
    for which in ("plain", flavour):
        consumer = make(which, base_config(bootstrap, f"{unique_group}-{which}"), tmp_path)
        consumer.close()
        got[which] = [f"{n}: {outcome(partial(f, consumer, topic))}" for n, f in _METHODS.items()]
        late = outcome(partial(consumer.commit, offsets=[TopicPartition(topic, 0, 1)], asynchronous=True))
        got[which].append(f"async commit: {late}")
    assert got[flavour] == got["plain"]


# ---------------------------------------------------------------------------------------------
# callbacks receive the application's object


@pytest.mark.parametrize(
    "flavour",
    [
        "plain",
        pytest.param(
            "off",
        ),
        "on",
    ],
)
def test_on_assign_receives_the_application_object(
    flavour: str, bootstrap: str, topic_factory: Any, unique_group: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=1)
    consumer = make(flavour, base_config(bootstrap, unique_group), tmp_path)
    got: list[Any] = []
    try:
        consumer.subscribe([topic], on_assign=lambda c, parts: got.append(c))
        wait_for(lambda: consumer.poll(0.2) is None and bool(got), 30, 0.001, "on_assign")
        assert got[0] is consumer
    finally:
        consumer.close()


def test_the_mode_on_without_a_group_says_what_plain_says() -> None:
    """Applications (and confluent's own tests) match on "group.id must be set"."""
    plain = outcome(lambda: confluent_kafka.Consumer({"bootstrap.servers": "127.0.0.1:1"}))
    ours = outcome(
        lambda: fastrecover.Consumer({"bootstrap.servers": "127.0.0.1:1", "enable.parallel.rebalance": True})
    )
    assert plain.kind == ours.kind == "raise"
    assert plain.exc_type is not None and ours.exc_type is not None and issubclass(ours.exc_type, plain.exc_type)
    assert "group.id must be set" in plain.message and "group.id must be set" in ours.message, (plain, ours)


def test_a_subclass_with_the_mode_off_polls_without_a_timeout_as_plain() -> None:
    """poll() with no argument: plain waits for ever, or raises RuntimeError once closed; never a TypeError."""

    class Theirs(confluent_kafka.Consumer):
        pass

    class Mine(fastrecover.Consumer):
        pass

    seen = []
    for cls in (Theirs, Mine):
        consumer = cls({"bootstrap.servers": "127.0.0.1:1", "group.id": "g-subclass-poll"})
        consumer.close()
        result = outcome(consumer.poll)
        seen.append((result.kind, result.exc_type, result.message))
    assert seen[1] == seen[0], seen
