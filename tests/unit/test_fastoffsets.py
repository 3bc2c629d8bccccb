"""The C one-record path of ``Consumer.commit`` / ``Consumer.store_offsets`` against the Python methods.

``FastOffsets`` (fastrecover/_fastpoll.c) claims to hand a call to confluent_kafka's own method only
where the Python method would make that very call, and to give every other call to the Python
method.  The record-loss stake: a commit or store that bypassed the mode on a partition with a range
would carry no lineage marker, and a later recovery would retire the range as superseded.  So every
call shape and mode state is driven through both, and wherever the C path called confluent_kafka,
the Python method must have made the same call with the same arguments.
"""

from __future__ import annotations

import inspect
from typing import Any
from unittest import mock

import pytest
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrecover import _accel
from fastrecover import consumer as consumer_module
from fastrecover.consumer import Consumer

KINDS = ("commit", "store_offsets")
SLOW = object()  # what the stand-in for the Python method answers: the C path gave the call away


def _reference(kind: str) -> Any:
    method = getattr(Consumer, kind)
    return getattr(method, "slow", method)


class Kafka:
    """confluent_kafka's commit/store_offsets, recording what they were asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def method(self, kind: str) -> Any:
        signature = inspect.signature(_reference(kind))

        def call(consumer: Any, *args: Any, **kwargs: Any) -> str:
            bound = signature.bind(consumer, *args, **kwargs)
            bound.apply_defaults()
            arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
            self.calls.append((kind, arguments))
            return "kafka"

        return call


class Partitions:
    def __init__(self, owned: set[tuple[str, int]]) -> None:
        self.owned = owned
        self.routes: set[tuple[str, int]] = set()

    def owns(self, key: tuple[str, int]) -> bool:
        return key in self.owned


class Mode:
    """What the first tests of Consumer.commit/store_offsets read of ParallelMode."""

    def __init__(self, owned: set[tuple[str, int]], auto_store: bool) -> None:
        self.partitions = Partitions(owned)
        self.auto_store = auto_store


class App:
    _pending = None  # as Consumer's once built: nothing waits to be built

    def __init__(self, fr: Mode | None) -> None:
        self._fr = fr


#: a record of the partition that "a partition owned" owns: there the Python method routes it
MESSAGE = Message(topic="t", partition=0, offset=5, value=b"v")
CALLS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "positional message": ((MESSAGE,), {}),
    "message=": ((), {"message": MESSAGE}),
    "message=, asynchronous=False": ((), {"message": MESSAGE, "asynchronous": False}),
    "asynchronous=True, message=": ((), {"asynchronous": True, "message": MESSAGE}),
    "message=None": ((), {"message": None}),
    "offsets=": ((), {"offsets": [object()]}),
    "message= and offsets=": ((), {"message": MESSAGE, "offsets": [object()]}),
    "nothing": ((), {}),
    "asynchronous= alone": ((), {"asynchronous": False}),
    "two positionals": ((MESSAGE, None), {}),
}


def _c_path(kind: str, kafka: Kafka) -> Any:
    return _accel._fastpoll.FastOffsets(kafka.method(kind), lambda *a, **k: SLOW, kind)


@pytest.fixture(autouse=True)
def _the_extension_is_built() -> None:
    if not _accel.ENABLED:
        pytest.fail("the C extension is not built: the suite must test the path it ships")


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    call=st.sampled_from(sorted(CALLS)),
    mode=st.sampled_from(["none", "nothing owned", "a partition owned"]),
    auto_store=st.booleans(),
)
def test_confluent_kafka_is_called_only_as_the_python_method_calls_it(
    kind: str, call: str, mode: str, auto_store: bool
) -> None:
    args, kwargs = CALLS[call]
    owned = {("t", 0)} if mode == "a partition owned" else set()
    app = App(None if mode == "none" else Mode(owned, auto_store))
    c_kafka = Kafka()
    answer = _c_path(kind, c_kafka)(app, *args, **kwargs)
    if answer is SLOW:
        assert c_kafka.calls == []
        return
    assert answer == "kafka"
    py_kafka = Kafka()
    fake = mock.Mock(**{kind: py_kafka.method(kind)})
    with mock.patch.object(consumer_module, "_K", fake):
        _reference(kind)(app, *args, **kwargs)
    assert py_kafka.calls == c_kafka.calls


@pytest.mark.parametrize("kind", KINDS)
def test_the_steady_state_takes_the_c_path(kind: str) -> None:
    """Not vacuous: with nothing owned, a one-record call goes to confluent_kafka without the Python method."""
    kafka = Kafka()
    fast = _c_path(kind, kafka)
    assert fast(App(Mode(set(), auto_store=False)), message=MESSAGE) == "kafka"
    assert fast(App(Mode(set(), auto_store=False)), MESSAGE) == "kafka"
    assert len(kafka.calls) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_a_partition_with_a_range_mirror_or_floor_goes_to_the_python_method(kind: str) -> None:
    kafka = Kafka()
    assert _c_path(kind, kafka)(App(Mode({("t", 3)}, auto_store=False)), message=MESSAGE) is SLOW
    assert kafka.calls == []


def test_store_offsets_with_the_librdkafka_store_on_goes_to_the_python_method() -> None:
    """The primary runs with enable.auto.offset.store off; the Python method refuses as plain would."""
    kafka = Kafka()
    assert _c_path("store_offsets", kafka)(App(Mode(set(), auto_store=True)), message=MESSAGE) is SLOW
    assert kafka.calls == []


def test_an_unreadable_mode_goes_to_the_python_method() -> None:
    class Broken:
        @property
        def partitions(self) -> Any:
            raise RuntimeError("mid-build")

    kafka = Kafka()
    for kind in KINDS:
        assert _c_path(kind, kafka)(App(Broken()), message=MESSAGE) is SLOW  # type: ignore[arg-type]
        assert _c_path(kind, kafka)(object(), message=MESSAGE) is SLOW  # no _fr at all
    assert kafka.calls == []


def test_consumer_carries_the_c_path_and_it_binds_like_a_method() -> None:
    for kind in KINDS:
        method = getattr(Consumer, kind)
        assert type(method).__name__ == "FastOffsets"
        assert method.__doc__ == _reference(kind).__doc__
        assert method.__name__ == kind


def test_bad_construction_is_refused() -> None:
    with pytest.raises(TypeError):
        _accel._fastpoll.FastOffsets(None, print, "commit")
    with pytest.raises(ValueError, match="kind must be"):
        _accel._fastpoll.FastOffsets(print, print, "seek")
