"""The partition registry: one state per assigned partition, removed in one call, and owns()."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fastrecover.book import RangeBook
from fastrecover.partitions import Partitions
from fastrecover.ranges import RangeProgress
from fastrecover.tokens import Token, TopicPartitionKey

A0, A1, B0 = TopicPartitionKey("a", 0), TopicPartitionKey("a", 1), TopicPartitionKey("b", 0)


def _token(token_id: int, key: TopicPartitionKey) -> Token:
    return Token(token_id, "g", key.topic, key.partition, RangeProgress.fresh(10, 20), owner="me", epoch=1)


def test_a_partition_is_ours_with_a_range_a_parked_mirror_or_a_floor() -> None:
    book = RangeBook()
    parts = Partitions(book)
    parts.assign([A0, A1, B0])
    book.add(_token(1, A0))
    book.park(A1, "g", RangeProgress.fresh(5, 9))
    parts.set_floors({B0: 7})
    parts.refresh()
    assert [parts.owns(k) for k in (A0, A1, B0)] == [True, True, True]
    assert parts.owns(("a", 0)), "a plain tuple, as the per-record paths build it, is the same key"
    assert parts.routes == {A0}, "only claimed ranges route commits; a parked mirror does not"
    parts.drop_floors([B0])
    assert not parts.owns(B0) and parts.floor(B0) is None
    book.remove_partitions([A0, A1])
    parts.refresh()
    assert parts.owned == set() and parts.routes == set()


def test_floors_and_eofs_of_partitions_not_assigned_are_not_kept() -> None:
    parts = Partitions(RangeBook())
    parts.set_floors({A0: 3})
    assert parts.floor(A0) is None
    assert not parts.hold_eof(A0, object())  # type: ignore[arg-type]
    assert not parts.holds_eof


def test_removal_is_one_call_whatever_the_partition_held() -> None:
    parts = Partitions(RangeBook())
    parts.assign([A0, A1])
    parts.set_floors({A0: 3, A1: 4})
    parts.keep_meta(A0, "app's")
    eof: Any = object()
    assert parts.hold_eof(A1, eof)
    parts.refresh()
    parts.remove([A0, A1])
    assert len(parts) == 0 and parts.owned == set()
    assert parts.meta(A0) is None and parts.floor(A1) is None and parts.release_eof(A1) is None
    assert not parts.holds_eof
    parts.assign([A0])
    assert parts.meta(A0) is None and parts.floor(A0) is None, "an assignment starts from nothing"


def test_removal_empties_every_unit_in_the_order_given_and_returns_the_books_ranges() -> None:
    """The hand-over's let_go calls remove() once; the child (first), the primary's offsets and the
    recoverer forget the partitions through it, also partitions the registry never held."""
    book = RangeBook()
    calls: list[tuple[str, list[Any]]] = []
    parts = Partitions(
        book,
        holders=(
            lambda keys: calls.append(("child", keys)),
            lambda keys: calls.append(("offsets", keys)),
            lambda keys: calls.append(("recoverer", keys)),
        ),
    )
    parts.assign([A0])
    book.add(_token(1, A0))
    book.park(A1, "g", RangeProgress.fresh(5, 9))
    parts.refresh()
    released = parts.remove([A0, A1, A0])
    assert [name for name, _ in calls] == ["child", "offsets", "recoverer"]
    assert all(keys == [A0, A1] for _, keys in calls), "each unit hears of each partition once"
    assert sorted(h.token.key.partition for h in released) == [0, 1]
    assert not book.by_key and parts.owned == set() and len(parts) == 0
    calls.clear()
    assert parts.remove([]) == [] and calls == [], "nothing leaves: no unit is called"


KEYS = st.sampled_from([A0, A1, B0])
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("assign"), st.lists(KEYS, max_size=3)),
        st.tuples(st.just("remove"), st.lists(KEYS, max_size=3)),
        st.tuples(st.just("floor"), KEYS, st.integers(0, 9)),
        st.tuples(st.just("drop"), st.lists(KEYS, max_size=3)),
        st.tuples(st.just("eof"), KEYS),
        st.tuples(st.just("release"), KEYS),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(STEPS)
def test_the_counters_agree_with_the_states(steps: list[Any]) -> None:
    """holds_eof and owned (which count and collect floors) say what the states hold, after any steps."""
    parts = Partitions(RangeBook())
    for step in steps:
        kind = step[0]
        if kind == "assign":
            parts.assign(step[1])
        elif kind == "remove":
            parts.remove(step[1])
        elif kind == "floor":
            parts.set_floors({step[1]: step[2]})
            parts.refresh()
        elif kind == "drop":
            parts.drop_floors(step[1])
        elif kind == "eof":
            parts.hold_eof(step[1], object())  # type: ignore[arg-type]
        else:
            parts.release_eof(step[1])
        floors = {k for k in parts.assigned if parts.floor(k) is not None}
        assert parts.owned == floors
        held = [k for k in (A0, A1, B0) if k in parts and parts.release_eof(k) is not None]
        for key in held:
            parts.hold_eof(key, object())  # type: ignore[arg-type]  # put back what was looked at
        assert parts.holds_eof == bool(held)
