"""Unit and property tests of the offset-range arithmetic (fastrecover.ranges)."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fastrecover.ranges import (
    OffsetRange,
    RangeProgress,
    merged_committed,
    route_commit,
    route_record,
    route_records,
    split_commit,
    subtract,
)

# ---- helpers ---------------------------------------------------------------------------------------


def finished_set(p: RangeProgress) -> set[int]:
    """Offsets of the range that need no (re)delivery according to ``p``."""
    return set(range(p.start, p.committed)) | set(p.completed)


def check_invariants(p: RangeProgress) -> None:
    assert 0 <= p.start <= p.committed <= p.end
    assert all(p.committed < o < p.end for o in p.completed)
    assert p.committed not in p.completed
    assert p.remaining == (p.end - p.start) - len(finished_set(p))
    assert p.remaining >= 0
    assert p.done == (p.committed == p.end) == (p.remaining == 0)
    for o in range(p.start, p.end):
        assert p.is_finished(o) == (o in finished_set(p))


@st.composite
def ranges_(draw: st.DrawFn, max_start: int = 1_000, max_len: int = 60) -> OffsetRange:
    start = draw(st.integers(0, max_start))
    return OffsetRange(start, start + draw(st.integers(0, max_len)))


@st.composite
def progresses(draw: st.DrawFn, max_len: int = 60) -> RangeProgress:
    span = draw(ranges_(max_len=max_len))
    committed = draw(st.integers(span.start, span.end))
    above = list(range(committed + 1, span.end))
    completed = draw(st.frozensets(st.sampled_from(above))) if above else frozenset()
    return RangeProgress(span.start, span.end, committed, completed)


# ---- OffsetRange -----------------------------------------------------------------------------------


class TestOffsetRange:
    def test_len_and_contains(self) -> None:
        r = OffsetRange(10, 20)
        assert len(r) == 10
        assert 10 in r
        assert 19 in r
        assert 20 not in r
        assert 9 not in r
        assert "10" not in r
        assert 10.0 not in r  # only int offsets are members

    def test_empty_range_is_allowed_and_contains_nothing(self) -> None:
        r = OffsetRange(5, 5)
        assert len(r) == 0
        assert 5 not in r

    @pytest.mark.parametrize(("start", "end"), [(-1, 5), (5, 4), (-3, -1)])
    def test_invalid_ranges_are_rejected(self, start: int, end: int) -> None:
        with pytest.raises(ValueError, match=r"invalid offset range"):
            OffsetRange(start, end)

    def test_frozen_and_hashable(self) -> None:
        r = OffsetRange(1, 2)
        assert {r: 1}[OffsetRange(1, 2)] == 1
        with pytest.raises(AttributeError):
            r.start = 3  # type: ignore[misc]

    @pytest.mark.parametrize(
        ("a", "b", "expected"),
        [
            ((0, 10), (10, 20), False),  # touching is not overlapping
            ((0, 10), (9, 20), True),
            ((5, 6), (0, 100), True),
            ((0, 0), (0, 10), False),  # empty never overlaps
            ((3, 3), (0, 10), False),
        ],
    )
    def test_overlaps(self, a: tuple[int, int], b: tuple[int, int], expected: bool) -> None:
        ra, rb = OffsetRange(*a), OffsetRange(*b)
        assert ra.overlaps(rb) is expected
        assert rb.overlaps(ra) is expected

    @given(ranges_(), ranges_())
    def test_overlaps_iff_common_offset(self, a: OffsetRange, b: OffsetRange) -> None:
        common = set(range(a.start, a.end)) & set(range(b.start, b.end))
        assert a.overlaps(b) == bool(common)


# ---- subtract --------------------------------------------------------------------------------------


class TestSubtract:
    def test_no_holes(self) -> None:
        assert subtract(OffsetRange(0, 10), []) == [OffsetRange(0, 10)]

    def test_empty_whole(self) -> None:
        assert subtract(OffsetRange(5, 5), [OffsetRange(0, 3)]) == []

    def test_hole_in_the_middle(self) -> None:
        assert subtract(OffsetRange(0, 10), [OffsetRange(3, 5)]) == [OffsetRange(0, 3), OffsetRange(5, 10)]

    def test_holes_at_edges_and_outside(self) -> None:
        holes = [OffsetRange(8, 30), OffsetRange(0, 2), OffsetRange(50, 60)]
        assert subtract(OffsetRange(0, 10), holes) == [OffsetRange(2, 8)]

    def test_hole_covering_everything(self) -> None:
        assert subtract(OffsetRange(10, 20), [OffsetRange(0, 100)]) == []

    def test_touching_holes_leave_nothing_between(self) -> None:
        holes = [OffsetRange(10, 15), OffsetRange(15, 20)]
        assert subtract(OffsetRange(10, 20), holes) == []

    def test_overlapping_and_unsorted_holes(self) -> None:
        holes = [OffsetRange(12, 14), OffsetRange(11, 13), OffsetRange(16, 17), OffsetRange(0, 11)]
        assert subtract(OffsetRange(10, 20), holes) == [OffsetRange(14, 16), OffsetRange(17, 20)]

    def test_empty_holes_do_not_split(self) -> None:
        assert subtract(OffsetRange(0, 10), [OffsetRange(5, 5)]) == [OffsetRange(0, 10)]

    def test_accepts_any_iterable(self) -> None:
        holes = (OffsetRange(a, a + 1) for a in (1, 3))
        assert subtract(OffsetRange(0, 5), holes) == [OffsetRange(0, 1), OffsetRange(2, 3), OffsetRange(4, 5)]

    @settings(max_examples=300)
    @given(ranges_(max_start=50, max_len=80), st.lists(ranges_(max_start=120, max_len=40), max_size=8))
    def test_properties(self, whole: OffsetRange, holes: list[OffsetRange]) -> None:
        pieces = subtract(whole, holes)
        whole_set = set(range(whole.start, whole.end))
        hole_set = {o for h in holes for o in range(h.start, h.end)}
        piece_sets = [set(range(p.start, p.end)) for p in pieces]
        # non-empty, sorted, pairwise disjoint and not even touching (maximal pieces)
        assert all(len(p) > 0 for p in pieces)
        for a, b in pairwise(pieces):
            assert a.end < b.start
        union: set[int] = set().union(*piece_sets)
        assert sum(map(len, piece_sets)) == len(union)
        # inside whole, outside every hole, and together with the holes covering whole
        assert union <= whole_set
        assert not union & hole_set
        assert union | (whole_set & hole_set) == whole_set
        assert union == whole_set - hole_set


# ---- RangeProgress ---------------------------------------------------------------------------------


class TestRangeProgressBasics:
    def test_fresh(self) -> None:
        p = RangeProgress.fresh(70, 120)
        assert (p.start, p.end, p.committed, p.completed) == (70, 120, 70, frozenset())
        assert p.span == OffsetRange(70, 120)
        assert p.remaining == 50
        assert not p.done
        check_invariants(p)

    def test_empty_range_is_done(self) -> None:
        p = RangeProgress.fresh(5, 5)
        assert p.done
        assert p.remaining == 0

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ((-1, 5, 0), "invalid range"),
            ((5, 4, 5), "invalid range"),
            ((10, 20, 9), "committed offset 9 outside"),
            ((10, 20, 21), "committed offset 21 outside"),
            ((10, 20, 12, frozenset({12})), "completed offset 12"),
            ((10, 20, 12, frozenset({11})), "completed offset 11"),
            ((10, 20, 12, frozenset({20})), "completed offset 20"),
            ((10, 20, 20, frozenset({25})), "completed offset 25"),
        ],
    )
    def test_invariants_enforced(self, args: tuple, message: str) -> None:  # type: ignore[type-arg]
        with pytest.raises(ValueError, match=message):
            RangeProgress(*args)

    def test_is_finished(self) -> None:
        p = RangeProgress(10, 20, 13, frozenset({15, 18}))
        assert [o for o in range(10, 20) if p.is_finished(o)] == [10, 11, 12, 15, 18]
        assert p.remaining == 5

    def test_mark_done_in_order_and_out_of_order(self) -> None:
        p = RangeProgress.fresh(10, 15)
        p = p.mark_done([12, 14])
        assert (p.committed, p.completed) == (10, frozenset({12, 14}))
        p = p.mark_done([10])
        assert (p.committed, p.completed) == (11, frozenset({12, 14}))
        p = p.mark_done([11])
        assert (p.committed, p.completed) == (13, frozenset({14}))
        p = p.mark_done([13])
        assert (p.committed, p.completed) == (15, frozenset())
        assert p.done

    def test_mark_done_ignores_outside_and_duplicates(self) -> None:
        p = RangeProgress(10, 20, 12, frozenset({15}))
        assert p.mark_done([]) is p
        assert p.mark_done([5, 11, 15, 20, 99]) is p
        q = p.mark_done(iter([16, 16, 16]))
        assert q.completed == frozenset({15, 16})

    def test_commit_upto(self) -> None:
        p = RangeProgress(10, 20, 12, frozenset({14, 15, 18}))
        q = p.commit_upto(14)
        assert (q.committed, q.completed) == (16, frozenset({18}))
        assert q.commit_upto(11) is q  # never backwards
        assert q.commit_upto(16) is q
        r = q.commit_upto(1_000)
        assert r.committed == 20
        assert r.done
        assert r.completed == frozenset()

    def test_commit_upto_exactly_end(self) -> None:
        assert RangeProgress.fresh(0, 10).commit_upto(10).done

    def test_skip_to(self) -> None:
        p = RangeProgress(10, 20, 12, frozenset({13, 16}))
        q, lost = p.skip_to(15)
        assert lost == 2  # 12 and 14; 13 was completed
        assert (q.committed, q.completed) == (15, frozenset({16}))
        r, lost2 = q.skip_to(15)
        assert r is q
        assert lost2 == 0
        s, lost3 = q.skip_to(10)
        assert s is q
        assert lost3 == 0

    def test_skip_to_beyond_end(self) -> None:
        p = RangeProgress(10, 20, 12, frozenset({19}))
        q, lost = p.skip_to(500)
        assert q.done
        assert lost == 7  # 12..18


@settings(max_examples=200)
@given(
    span=ranges_(max_len=40),
    data=st.data(),
)
def test_any_marking_order_commits_the_smallest_unfinished(span: OffsetRange, data: st.DataObject) -> None:
    _check_marking(span, data)


@pytest.mark.parametrize(
    "batch",
    [[0, -3, -3, -3, -3, 5], [0, 0, 2], [0, 2, 2], [0, 7, 2]],
    ids=["out-of-range-fillers", "duplicate-hides-a-gap", "duplicate-at-the-end", "unsorted"],
)
def test_a_batch_that_only_looks_like_a_run_finishes_only_what_it_names(batch: list[int]) -> None:
    """Regression: first == committed and last - first + 1 == len(batch) once passed for a run (loss)."""
    p = RangeProgress.fresh(0, 6).mark_done(batch)
    assert finished_set(p) == {o for o in batch if 0 <= o < 6}
    assert p.committed == min(set(range(6)) - set(batch), default=6)


def _check_marking(span: OffsetRange, data: st.DataObject) -> None:
    offsets = list(range(span.start - 3, span.end + 3))
    marked_batches = data.draw(
        st.lists(st.lists(st.sampled_from(offsets), max_size=6), max_size=15) if offsets else st.just([])
    )
    p = RangeProgress.fresh(span.start, span.end)
    marked: set[int] = set()
    for batch in marked_batches:
        p = p.mark_done(batch)
        marked |= {o for o in batch if o in span}
        check_invariants(p)
        unfinished = [o for o in range(span.start, span.end) if o not in marked]
        assert p.committed == (unfinished[0] if unfinished else span.end)
        # at-least-once: exactly the marked offsets are finished, never one that was not marked
        assert finished_set(p) == marked


@settings(max_examples=100)
@given(data=st.data(), span=ranges_(max_len=30))
def test_permutations_of_all_offsets_finish_the_range(data: st.DataObject, span: OffsetRange) -> None:
    order = data.draw(st.permutations(list(range(span.start, span.end))))
    p = RangeProgress.fresh(span.start, span.end)
    for o in order:
        assert not p.done
        p = p.mark_done([o])
    assert p.done
    assert p.completed == frozenset()
    assert p.remaining == 0


@given(progresses(), st.integers(0, 1_200))
def test_commit_upto_properties(p: RangeProgress, target: int) -> None:
    q = p.commit_upto(target)
    check_invariants(q)
    assert q.committed >= p.committed  # never backwards
    assert finished_set(q) >= finished_set(p)  # a finished offset stays finished
    # Kafka semantics: records below the target are done; nothing above it gets finished by it
    assert set(range(p.start, min(target, p.end))) <= finished_set(q)
    assert finished_set(q) == finished_set(p) | set(range(p.start, min(max(target, p.start), p.end)))


@given(progresses(), st.integers(0, 1_200))
def test_skip_to_counts_exactly_the_unfinished_below_low(p: RangeProgress, low: int) -> None:
    q, lost = p.skip_to(low)
    check_invariants(q)
    below = range(p.start, min(max(low, p.start), p.end))
    assert lost == sum(1 for o in below if not p.is_finished(o))
    assert q.committed >= min(max(low, p.committed), p.end)
    assert finished_set(q) == finished_set(p) | set(below)
    assert q.remaining == p.remaining - lost


@given(progresses(), st.lists(st.integers(0, 1_200), max_size=10))
def test_mark_done_is_idempotent_and_order_free(p: RangeProgress, offsets: list[int]) -> None:
    once = p.mark_done(offsets)
    assert once.mark_done(offsets) == once
    assert p.mark_done(reversed(offsets)) == once
    stepwise = p
    for o in offsets:
        stepwise = stepwise.mark_done([o])
    assert stepwise == once


class ProgressMachine(RuleBasedStateMachine):
    """Random interleavings of mark_done / commit_upto / skip_to against a set model."""

    def __init__(self) -> None:
        super().__init__()
        self.progress: RangeProgress | None = None
        self.finished: set[int] = set()
        self.lost = 0
        self.skipped: set[int] = set()

    @precondition(lambda self: self.progress is None)
    @rule(start=st.integers(0, 50), length=st.integers(0, 40))
    def begin(self, start: int, length: int) -> None:
        self.progress = RangeProgress.fresh(start, start + length)

    def _offsets(self) -> st.SearchStrategy[int]:
        assert self.progress is not None
        return st.integers(max(0, self.progress.start - 2), self.progress.end + 2)

    @precondition(lambda self: self.progress is not None)
    @rule(data=st.data())
    def mark(self, data: st.DataObject) -> None:
        assert self.progress is not None
        offsets = data.draw(st.lists(self._offsets(), max_size=5))
        self.progress = self.progress.mark_done(offsets)
        self.finished |= {o for o in offsets if o in self.progress.span}

    @precondition(lambda self: self.progress is not None)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        assert self.progress is not None
        before = self.progress.committed
        target = data.draw(self._offsets())
        self.progress = self.progress.commit_upto(target)
        assert self.progress.committed >= before
        self.finished |= set(range(self.progress.start, min(target, self.progress.end)))

    @precondition(lambda self: self.progress is not None)
    @rule(data=st.data())
    def skip(self, data: st.DataObject) -> None:
        assert self.progress is not None
        low = data.draw(self._offsets())
        below = set(range(self.progress.start, min(max(low, self.progress.start), self.progress.end)))
        expected_lost = below - self.finished
        self.progress, lost = self.progress.skip_to(low)
        assert lost == len(expected_lost)
        self.lost += lost
        self.skipped |= expected_lost
        self.finished |= below

    @invariant()
    def matches_model(self) -> None:
        p = self.progress
        if p is None:
            return
        check_invariants(p)
        assert finished_set(p) == self.finished
        unfinished = sorted(set(range(p.start, p.end)) - self.finished)
        assert p.committed == (unfinished[0] if unfinished else p.end)
        assert self.lost == len(self.skipped)


TestProgressMachine = ProgressMachine.TestCase
TestProgressMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


# ---- routing ---------------------------------------------------------------------------------------

RANGES = [("a", OffsetRange(70, 120)), ("b", OffsetRange(140, 190))]


class TestRouting:
    @pytest.mark.parametrize(
        ("offset", "expected"),
        [(0, None), (69, None), (70, "a"), (119, "a"), (120, None), (139, None), (140, "b"), (189, "b"), (190, None)],
    )
    def test_route_record(self, offset: int, expected: str | None) -> None:
        assert route_record(offset, RANGES) == expected

    @pytest.mark.parametrize(
        ("next_offset", "expected"),
        [
            (70, None),  # o == start: records below start belong to the primary
            (71, "a"),
            (120, "a"),  # o == end: the range's last record
            (121, None),
            (140, None),
            (141, "b"),
            (190, "b"),
            (191, None),
            (0, None),
        ],
    )
    def test_route_commit(self, next_offset: int, expected: str | None) -> None:
        assert route_commit(next_offset, RANGES) == expected

    def test_empty_range_never_routes(self) -> None:
        ranges = [(1, OffsetRange(10, 10))]
        assert route_record(10, ranges) is None
        assert route_commit(10, ranges) is None
        assert route_commit(11, ranges) is None

    def test_no_ranges(self) -> None:
        assert route_record(5, []) is None
        assert route_commit(5, []) is None

    @given(st.lists(st.integers(0, 30), min_size=0, max_size=10, unique=True), st.integers(0, 400))
    def test_commit_routes_like_the_record_below_it(self, cuts: list[int], offset: int) -> None:
        # disjoint ranges built from sorted cut points
        bounds = sorted({c * 13 for c in cuts})
        pairs = zip(bounds[::2], bounds[1::2], strict=False)
        ranges = [(i, OffsetRange(a, b)) for i, (a, b) in enumerate(pairs)]
        owner = route_record(offset, ranges)
        assert owner == next((k for k, r in ranges if offset in r), None)
        if offset > 0:
            assert route_commit(offset, ranges) == route_record(offset - 1, ranges)
        else:
            assert route_commit(0, ranges) is None


class TestSplitCommit:
    def test_kip_example(self) -> None:
        spans = {"p0": [(7, OffsetRange(70, 120))], "p1": []}
        primary, routed = split_commit([("p0", 121), ("p0", 95), ("p1", 5), ("p2", 3)], spans)
        assert primary == [("p0", 121), ("p1", 5), ("p2", 3)]
        assert routed == {7: 95}

    def test_boundaries(self) -> None:
        spans = {"p": [(1, OffsetRange(70, 120)), (2, OffsetRange(140, 190))]}
        primary, routed = split_commit([("p", 70), ("p", 120), ("p", 140), ("p", 190)], spans)
        assert primary == [("p", 70), ("p", 140)]
        assert routed == {1: 120, 2: 190}

    def test_highest_offset_per_range_wins(self) -> None:
        spans = {"p": [(1, OffsetRange(0, 100))]}
        _, routed = split_commit([("p", 50), ("p", 90), ("p", 10)], spans)
        assert routed == {1: 90}

    def test_nothing(self) -> None:
        assert split_commit([], {}) == ([], {})

    @given(
        st.lists(st.tuples(st.sampled_from(["x", "y"]), st.integers(0, 300)), max_size=20),
    )
    def test_every_offset_goes_to_exactly_one_log(self, pairs: list[tuple[str, int]]) -> None:
        spans = {"x": [(1, OffsetRange(50, 100)), (2, OffsetRange(150, 160))], "y": [(3, OffsetRange(0, 10))]}
        primary, routed = split_commit(pairs, spans)
        expected_primary = [(k, o) for k, o in pairs if route_commit(o, spans[k]) is None]
        assert primary == expected_primary
        for range_id in routed:
            mine = [o for k, o in pairs if route_commit(o, spans[k]) == range_id]
            assert routed[range_id] == max(mine)
        assert len(primary) + sum(1 for k, o in pairs if route_commit(o, spans[k]) is not None) == len(pairs)


# ---- merged committed() ----------------------------------------------------------------------------


class TestMergedCommitted:
    def test_no_ranges_gives_primary(self) -> None:
        assert merged_committed(190, []) == 190
        assert merged_committed(None, []) is None

    def test_open_range_holds_it_back(self) -> None:
        assert merged_committed(190, [RangeProgress(70, 120, 95)]) == 95

    def test_done_ranges_are_ignored(self) -> None:
        ranges = [RangeProgress(70, 120, 120), RangeProgress(140, 190, 150)]
        assert merged_committed(200, ranges) == 150
        assert merged_committed(200, [RangeProgress(70, 120, 120)]) == 200

    def test_lowest_of_several(self) -> None:
        ranges = [RangeProgress(140, 190, 150), RangeProgress(70, 120, 80)]
        assert merged_committed(250, iter(ranges)) == 80

    def test_primary_below_ranges_is_not_overstated(self) -> None:
        # The primary has not checkpointed [60, 80): claiming 80 would say they are.
        assert merged_committed(60, [RangeProgress(70, 120, 80)]) == 60

    def test_no_primary_commit_with_open_range(self) -> None:
        # without a primary commit nothing below the range is checkpointed
        assert merged_committed(None, [RangeProgress(70, 120, 80)]) is None

    def test_primary_at_the_range_start_defers_to_the_range(self) -> None:
        # the KIP: commits at 70, range [70, 120) committed up to 76 -> committed() is 76
        assert merged_committed(70, [RangeProgress(70, 120, 76)]) == 76

    def test_primary_in_a_gap_between_ranges_counts(self) -> None:
        ranges = [RangeProgress(70, 120, 120), RangeProgress(140, 190, 150)]
        assert merged_committed(130, ranges) == 130

    @given(st.one_of(st.none(), st.integers(0, 500)), st.lists(progresses(), max_size=5))
    def test_everything_below_is_checkpointed(self, primary: int | None, ranges: Iterable[RangeProgress]) -> None:
        ranges = list(ranges)
        result = merged_committed(primary, ranges)
        open_ranges = [r for r in ranges if not r.done]
        if primary is None:
            assert result is None
            return
        assert result is not None
        unfinished = {o for r in open_ranges for o in range(r.start, r.end) if not r.is_finished(o)}
        in_ranges = {o for r in open_ranges for o in range(r.start, r.end)}
        for o in range(result):
            by_range = o in in_ranges and o not in unfinished
            by_primary = primary is not None and o < primary and o not in unfinished
            assert by_range or by_primary, f"offset {o} below {result} is not checkpointed"


class TestRouteRecords:
    """The batch router agrees with the per-record one on every offset."""

    @given(
        offsets=st.lists(st.integers(-3, 300), max_size=60),  # negatives: junk offsets are the primary's
        cuts=st.lists(st.integers(0, 300), max_size=8, unique=True),
    )
    def test_matches_route_record(self, offsets: list[int], cuts: list[int]) -> None:
        bounds = sorted(cuts)
        spans = [(i, OffsetRange(a, b)) for i, (a, b) in enumerate(zip(bounds[::2], bounds[1::2], strict=False))]
        by_range, primary = route_records(offsets, spans)
        expected: dict[int, list[int]] = {}
        expected_primary = []
        for o in sorted(offsets):
            key = route_record(o, spans)
            if key is None:
                expected_primary.append(o)
            else:
                expected.setdefault(key, []).append(o)
        assert by_range == expected
        assert primary == expected_primary

    @given(committed=st.integers(0, 50), run=st.integers(1, 30), extra=st.integers(0, 20))
    def test_in_order_run_fast_path_equals_the_general_rule(self, committed: int, run: int, extra: int) -> None:
        progress = RangeProgress(0, committed + run + extra, committed)
        offsets = list(range(committed, committed + run))
        fast = progress.mark_done(offsets)
        general = progress.mark_done(iter(offsets))  # an iterator takes the general path
        assert fast == general
