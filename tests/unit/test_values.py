"""fastrecover.values behaves as the dataclasses it replaces on the mode's import path.

Each behaviour is checked against a real ``dataclasses.dataclass`` twin of the same class, so a
difference in construction, equality, hashing, repr, copying or pickling shows up here rather than in
a store row or a commit.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastrecover.errors import FrozenInstanceError
from fastrecover.ranges import OffsetRange, RangeProgress
from fastrecover.values import field, record, replace, value


@value
class Pair:
    start: int
    end: int
    label: str = "x"
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"end {self.end} before start {self.start}")


@dataclasses.dataclass(frozen=True)
class PairTwin:
    start: int
    end: int
    label: str = "x"
    tags: tuple[str, ...] = ()


@record
class Box:
    items: list[int] = field(default_factory=list)
    count: int = 0


@value
class Single:
    only: int


pairs = st.builds(
    lambda s, n, label, tags: (s, s + n, label, tuple(tags)),
    st.integers(0, 100),
    st.integers(0, 100),
    st.text(max_size=3),
    st.lists(st.text(max_size=2), max_size=2),
)


@given(a=pairs, b=pairs)
def test_equality_and_hash_follow_the_fields_as_a_dataclass_does(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    ours_a, ours_b = Pair(*a), Pair(*b)
    twin_a, twin_b = PairTwin(*a), PairTwin(*b)
    assert (ours_a == ours_b) == (twin_a == twin_b)
    assert (ours_a != ours_b) == (twin_a != twin_b)
    if ours_a == ours_b:
        assert hash(ours_a) == hash(ours_b)
    assert repr(ours_a) == repr(twin_a).replace("PairTwin", "Pair")


def test_construction_by_position_by_name_and_with_defaults() -> None:
    assert Pair(1, 2) == Pair(start=1, end=2) == Pair(1, end=2, label="x", tags=())
    assert Pair(1, 2, "y").label == "y"
    assert Pair(1, 2).tags == ()


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((1,), {}, "missing the field 'end'"),
        ((1, 2, "a", (), 5), {}, "takes 4 field"),
        ((1, 2), {"colour": 3}, "unexpected or repeated field.*colour"),
        ((1, 2), {"start": 3}, "unexpected or repeated field.*start"),
    ],
)
def test_a_wrong_call_names_the_field(args: tuple[Any, ...], kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        Pair(*args, **kwargs)


def test_post_init_checks_every_construction_and_copy() -> None:
    with pytest.raises(ValueError, match="end 1 before start 2"):
        Pair(2, 1)
    with pytest.raises(ValueError, match="end 0 before start 1"):
        replace(Pair(1, 2), end=0)


def test_a_value_refuses_assignment_and_deletion() -> None:
    pair = Pair(1, 2)
    with pytest.raises(FrozenInstanceError, match="'start' of Pair"):
        pair.start = 5  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError, match="'end' of Pair"):
        del pair.end  # type: ignore[misc]
    assert isinstance(FrozenInstanceError(), AttributeError)
    assert pair == Pair(1, 2)


def test_a_record_is_mutable_unhashable_and_makes_each_default_anew() -> None:
    first, second = Box(), Box()
    first.items.append(1)
    first.count = 2
    assert second.items == [] and first == Box([1], 2) and first != second
    with pytest.raises(TypeError, match="unhashable"):
        hash(first)


def test_copies_and_pickles_are_equal_and_checked() -> None:
    for obj in (Pair(1, 2, "y", ("a",)), Box([1, 2], 3), Single(7), RangeProgress(5, 10, 6, frozenset({8}))):
        assert pickle.loads(pickle.dumps(obj)) == obj
        assert copy.copy(obj) == obj and copy.deepcopy(obj) == obj
    assert replace(Single(7), only=8) == Single(8)
    assert replace(OffsetRange(1, 5), end=9) == OffsetRange(1, 9)


def test_values_of_different_classes_never_compare_equal() -> None:
    assert Single(1) != (1,) and Pair(1, 2) != PairTwin(1, 2)  # type: ignore[comparison-overlap]
    assert Single(1).__eq__((1,)) is NotImplemented


def test_a_mutable_default_is_refused_at_class_creation() -> None:
    with pytest.raises(TypeError, match=r"Bad\.items: a mutable default would be shared"):

        @value
        class Bad:
            items: list[int] = []


def test_a_field_without_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Late\.b: a field without a default follows one with a default"):

        @value
        class Late:
            a: int = 0
            b: int  # type: ignore[misc]


def test_the_class_keeps_its_own_methods_and_match_args() -> None:
    assert Pair.__match_args__ == ("start", "end", "label", "tags")
    assert len(OffsetRange(3, 10)) == 7, "OffsetRange's own __len__"
    match Pair(1, 2):
        case Pair(start, end):
            assert (start, end) == (1, 2)
