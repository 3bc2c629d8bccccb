"""The streaming source's offset model and batch planning (fastrecover.spark.offsets, .planning): pure,
no Spark, no broker."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrecover.ranges import OffsetRange
from fastrecover.spark.offsets import (
    LogBounds,
    OffsetFormatError,
    PartitionState,
    Piece,
    SourceOffset,
    batch_pieces,
    delivered,
    lost_between,
    pending_total,
)
from fastrecover.spark.planning import (
    advance_live,
    apply_jumps,
    chunk_tasks,
    discover,
    has_fresh,
    initial_offset,
    plan_next,
    recovery_jumps,
    take_backfill,
)
from fastrecover.tokens import TopicPartitionKey as K

A0, A1, B0 = K("a", 0), K("a", 1), K("b", 0)


def offsets_of(pieces: list[Piece], key: K | None = None) -> list[int]:
    return sorted(o for p in pieces if key is None or p.key == key for o in range(p.start, p.end))


def delivered_offsets(offset: SourceOffset, key: K) -> set[int]:
    return {o for r in delivered(offset.get(key)) for o in range(r.start, r.end)}


# -- values and JSON ---------------------------------------------------------------------------


def test_partition_state_rejects_broken_invariants() -> None:
    with pytest.raises(ValueError):
        PartitionState(5, 4)
    with pytest.raises(ValueError):
        PartitionState(0, 10, (OffsetRange(5, 8), OffsetRange(6, 9)))  # overlap
    with pytest.raises(ValueError):
        PartitionState(0, 10, (OffsetRange(5, 11),))  # beyond live
    with pytest.raises(ValueError):
        PartitionState(3, 10, (OffsetRange(2, 4),))  # below base
    with pytest.raises(ValueError):
        PartitionState(0, 10, (OffsetRange(4, 4),))  # empty


def test_json_is_canonical_whatever_the_insertion_order() -> None:
    one = SourceOffset({B0: PartitionState(0, 5), A1: PartitionState(0, 7), A0: PartitionState(2, 9)})
    two = SourceOffset({A0: PartitionState(2, 9), B0: PartitionState(0, 5), A1: PartitionState(0, 7)})
    assert json.dumps(one.to_json()) == json.dumps(two.to_json())
    assert list(one.to_json()["topics"]) == ["a", "b"]


def test_json_round_trip_and_errors() -> None:
    offset = SourceOffset({A0: PartitionState(0, 100, (OffsetRange(10, 20), OffsetRange(30, 90)))})
    assert SourceOffset.from_json(offset.to_json()) == offset
    assert SourceOffset.from_json(offset.dumps()) == offset
    for bad in (
        "not json",
        "[]",
        '{"v": 99, "topics": {}}',
        '{"v": 1}',
        '{"v": 1, "topics": {"a": {"0": {"base": 5, "live": 1, "pending": []}}}}',
        # numbers int() would coerce: a float truncated, a bool taken for 1, a string parsed
        '{"v": 1, "topics": {"a": {"0": {"base": 0.9, "live": 10, "pending": []}}}}',
        '{"v": 1, "topics": {"a": {"0": {"base": 0, "live": "10", "pending": []}}}}',
        '{"v": 1, "topics": {"a": {"0": {"base": 0, "live": 10, "pending": [[true, 5]]}}}}',
        # one partition under two keys, the later silently winning
        '{"v": 1, "topics": {"a": {"0": {"base": 0, "live": 10, "pending": []}, '
        '"00": {"base": 0, "live": 99, "pending": []}}}}',
        '{"v": 1, "topics": {"a": {"0": {"base": 0, "live": 10, "pending": {}}}}}',
    ):
        with pytest.raises(OffsetFormatError):
            SourceOffset.from_json(bad)


# -- planning ----------------------------------------------------------------------------------


def test_initial_offset_latest_and_earliest() -> None:
    bounds = {A0: LogBounds(3, 50), A1: LogBounds(0, 0)}
    assert initial_offset(bounds, "latest") == SourceOffset({A0: PartitionState(50, 50), A1: PartitionState(0, 0)})
    assert initial_offset(bounds, "earliest") == SourceOffset({A0: PartitionState(3, 3), A1: PartitionState(0, 0)})
    with pytest.raises(ValueError):
        initial_offset(bounds, "middle")


def test_restart_after_downtime_delivers_fresh_first_then_the_lag_in_budgeted_batches() -> None:
    # The query had delivered [0, 100); while it was down the log grew to 1000.
    start = SourceOffset({A0: PartitionState(0, 100)})
    jumps = recovery_jumps(start, {A0: 1000}, min_lag=50)
    assert jumps == {A0: 1000}
    # When the batch is cut, 20 fresh records have arrived past the jump point.
    first = plan_next(start, {A0: 1020}, jumps=jumps, backfill_budget=300)
    assert first == SourceOffset({A0: PartitionState(0, 1020, (OffsetRange(100, 1000),))})
    pieces = batch_pieces(start, first)
    assert pieces == [Piece("a", 0, 1000, 1020, False)]  # fresh only, no backfill yet
    # Later batches: new live records plus at most 300 offsets of the lag, oldest first.
    second = plan_next(first, {A0: 1030}, jumps=None, backfill_budget=300)
    assert batch_pieces(first, second) == [Piece("a", 0, 100, 400, True), Piece("a", 0, 1020, 1030, False)]
    third = plan_next(second, {A0: 1030}, jumps=None, backfill_budget=300)
    fourth = plan_next(third, {A0: 1030}, jumps=None, backfill_budget=300)
    assert pending_total(fourth) == 0
    every = offsets_of(pieces + batch_pieces(first, second) + batch_pieces(second, third) + batch_pieces(third, fourth))
    assert every == list(range(100, 1030))
    # Nothing left: the next plan is the same offset (Spark then runs no batch).
    assert plan_next(fourth, {A0: 1030}, jumps=None, backfill_budget=300) == fourth


def test_a_small_lag_is_caught_up_live_without_a_jump() -> None:
    start = SourceOffset({A0: PartitionState(0, 100)})
    assert recovery_jumps(start, {A0: 140}, min_lag=50) == {}
    end = plan_next(start, {A0: 140}, jumps=None, backfill_budget=10)
    assert batch_pieces(start, end) == [Piece("a", 0, 100, 140, False)]


def test_a_second_downtime_adds_a_second_pending_range() -> None:
    start = SourceOffset({A0: PartitionState(0, 500, (OffsetRange(100, 300),))})
    end = apply_jumps(start, {A0: 900})
    assert end.partitions[A0] == PartitionState(0, 900, (OffsetRange(100, 300), OffsetRange(500, 900)))
    assert delivered(end.get(A0)) == delivered(start.get(A0))  # the jump delivers nothing


def test_budget_is_shared_fairly_and_exactly() -> None:
    start = SourceOffset(
        {
            A0: PartitionState(0, 1000, (OffsetRange(0, 900),)),
            A1: PartitionState(0, 100, (OffsetRange(0, 10),)),
            B0: PartitionState(0, 1000, (OffsetRange(0, 500),)),
        }
    )
    end = take_backfill(start, 301)
    got = {k: len(offsets_of(batch_pieces(start, end), k)) for k in (A0, A1, B0)}
    assert got[A1] == 10  # needed less than its share
    assert got[A0] + got[B0] == 291 and abs(got[A0] - got[B0]) <= 1
    assert take_backfill(start, None) == advance_live(
        SourceOffset({k: PartitionState(0, s.live) for k, s in start.partitions.items()}), {}
    )
    assert take_backfill(start, 0) == start


def test_new_partitions_start_at_their_log_start_and_are_live() -> None:
    start = SourceOffset({A0: PartitionState(0, 10)})
    seen = discover(start, {A0: LogBounds(0, 10), A1: LogBounds(4, 9)})
    assert seen.partitions[A1] == PartitionState(4, 4)
    end = plan_next(seen, {A0: 10, A1: 9}, jumps=None, backfill_budget=5)
    # partitions() is given the checkpointed start, which does not have A1 yet
    assert batch_pieces(start, end) == [Piece("a", 1, 4, 9, False)]


def test_has_fresh() -> None:
    offset = SourceOffset({A0: PartitionState(0, 10), A1: PartitionState(0, 5)})
    assert not has_fresh(offset, {A0: 10, A1: 5})
    assert has_fresh(offset, {A0: 10, A1: 6})
    assert not has_fresh(offset, {})


def test_lost_between_reports_offsets_taken_back() -> None:
    start = SourceOffset({A0: PartitionState(0, 100)})
    assert lost_between(start, apply_jumps(start, {A0: 200})) == {}
    assert lost_between(start, SourceOffset({A0: PartitionState(0, 50)})) == {A0: [OffsetRange(50, 100)]}


# -- tasks -------------------------------------------------------------------------------------


def test_chunk_tasks_splits_backfill_evenly_and_keeps_live_per_partition() -> None:
    pieces = [
        Piece("a", 0, 0, 1000, True),
        Piece("a", 1, 0, 10, True),
        Piece("a", 0, 2000, 2050, False),
        Piece("a", 1, 70, 80, False),
    ]
    tasks = chunk_tasks(pieces, backfill_tasks=4)
    live = [t for t in tasks if not t[0].backfill]
    back = [t for t in tasks if t[0].backfill]
    assert live == [[Piece("a", 0, 2000, 2050, False)], [Piece("a", 1, 70, 80, False)]]
    assert len(back) == 4
    assert [sum(len(p) for p in t) for t in back] == [253, 253, 253, 251]
    assert offsets_of([p for t in back for p in t], K("a", 0)) == list(range(1000))
    assert chunk_tasks([Piece("a", 0, 0, 10, False)], 2, max_live_per_task=4) == [
        [Piece("a", 0, 0, 4, False)],
        [Piece("a", 0, 4, 8, False)],
        [Piece("a", 0, 8, 10, False)],
    ]
    with pytest.raises(ValueError):
        chunk_tasks(pieces, 0)


# -- properties --------------------------------------------------------------------------------

KEYS = [A0, A1, B0]

step = st.one_of(
    st.tuples(st.just("grow"), st.sampled_from(KEYS), st.integers(0, 400)),
    st.tuples(st.just("restart"), st.integers(1, 300)),
    st.tuples(st.just("batch"), st.one_of(st.none(), st.integers(0, 500))),
    st.tuples(st.just("retention"), st.sampled_from(KEYS), st.integers(0, 50)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=40), st.integers(1, 6), st.sampled_from(["latest", "earliest"]))
def test_batches_partition_the_log_exactly(steps: list[tuple[Any, ...]], tasks: int, starting: str) -> None:
    """Whatever the sequence of growth, restarts and batches: each offset is delivered by
    exactly one batch, batches only add, and pieces/tasks reproduce the set difference."""
    ends = {A0: 50}
    lows = {A0: 0}
    offset = initial_offset({A0: LogBounds(0, 50)}, starting)
    first_delivered: dict[K, set[int]] = {k: set() for k in KEYS}
    first_delivered[A0] = delivered_offsets(offset, A0)
    pending_jumps = False
    for s in steps:
        if s[0] == "grow":
            _, key, n = s
            ends[key] = ends.get(key, 0) + n
            lows.setdefault(key, 0)
        elif s[0] == "retention":
            _, key, n = s
            if key in ends:
                lows[key] = min(ends[key], lows[key] + n)
        elif s[0] == "restart":
            pending_jumps = True
            min_lag = s[1]
        else:
            budget = s[1]
            seen = discover(offset, {k: LogBounds(lows[k], ends[k]) for k in ends})
            jumps = recovery_jumps(seen, ends, min_lag) if pending_jumps else None
            pending_jumps = False
            end = plan_next(seen, ends, jumps=jumps, backfill_budget=budget)
            assert lost_between(offset, end) == {}
            pieces = batch_pieces(offset, end)
            chunked = [p for t in chunk_tasks(pieces, tasks) for p in t]
            assert offsets_of(chunked) == offsets_of(pieces)
            for key in end.keys_sorted():
                new = offsets_of(pieces, key)
                assert len(new) == len(set(new))
                before = delivered_offsets(offset, key)
                after = delivered_offsets(end, key)
                assert set(new) == after - before
                assert before <= after
                old = offset.get(key)
                for p in pieces:
                    if p.key == key:
                        assert p.backfill == (old is not None and p.end <= old.live)
                if jumps:
                    assert all(not p.backfill for p in pieces)
                if budget is not None and not jumps:
                    assert sum(len(p) for p in pieces if p.backfill) <= budget
            assert SourceOffset.from_json(json.loads(json.dumps(end.to_json()))) == end
            offset = end
    # Draining: with no budget, one more batch delivers everything up to the log ends.
    final = plan_next(
        discover(offset, {k: LogBounds(lows[k], ends[k]) for k in ends}),
        ends,
        jumps=None,
        backfill_budget=None,
    )
    for key in final.keys_sorted():
        state = final.partitions[key]
        assert state.pending == ()
        assert state.live == ends[key]
