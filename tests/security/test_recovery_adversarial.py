"""plan_partition against hostile commit-metadata mirrors (issue 11), property-tested.

The mirror is written by anyone who may commit offsets for the group, so it is
drawn here from the whole offset space, overlapping, duplicated, past the log
end and claiming arbitrary progress.  The property that must survive all of it:
every offset in ``[committed, log_end)`` is read by the primary (at or above
``primary_start``), lies in a new, restored or resumed range, or lies in a
range the *store* says is done.  Coverage is checked with interval arithmetic,
so offsets near 2^63 cost nothing.
"""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from fastrecover.codec import OFFSET_LIMIT
from fastrecover.ranges import OffsetRange, RangeProgress, subtract
from fastrecover.recovery import LEGACY, plan_partition
from fastrecover.tokens import Token, TokenState

BIG = OFFSET_LIMIT - 1


@st.composite
def hostile_progress(draw: st.DrawFn, hi: int) -> RangeProgress:
    start = draw(st.one_of(st.integers(0, 600), st.integers(0, hi)))
    end = draw(st.one_of(st.integers(start, min(hi, start + 700)), st.integers(start, hi)))
    committed = draw(st.one_of(st.just(start), st.just(end), st.just(max(start, end - 1)), st.integers(start, end)))
    above = range(committed + 1, end)
    completed: frozenset[int] = frozenset()
    if len(above) > 0:
        completed = draw(st.frozensets(st.integers(above.start, above.stop - 1), max_size=8))
    return RangeProgress(start, end, committed, completed)


@st.composite
def store_tokens(draw: st.DrawFn) -> list[Token]:
    """Disjoint store tokens (the store never holds overlapping ranges of one partition)."""
    out: list[Token] = []
    cursor = draw(st.integers(0, 200))
    for i in range(draw(st.integers(0, 4))):
        cursor += draw(st.integers(0, 150))
        end = cursor + draw(st.integers(1, 200))
        done = draw(st.booleans())
        committed = end if done else draw(st.integers(cursor, end - 1))
        progress = RangeProgress(cursor, end, committed)
        out.append(Token(i + 1, "g", "t", 0, progress, state=TokenState.DONE if done else TokenState.OPEN))
        cursor = end
    return out


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int | None, int, int, list[Token], list[RangeProgress]]:
    log_end = draw(st.one_of(st.integers(0, 1_200), st.just(BIG)))
    committed = draw(st.one_of(st.none(), st.integers(0, log_end), st.integers(-1, 1_200)))
    min_offsets = draw(st.integers(1, 300))
    wide: bool = draw(st.booleans())
    mirrored = draw(st.lists(hostile_progress(BIG if wide else 1_500), max_size=12))
    duplicate: bool = draw(st.booleans())
    if mirrored and duplicate:
        mirrored = mirrored + [mirrored[0]] * draw(st.integers(1, 50))  # duplicates
    return committed, log_end, min_offsets, draw(store_tokens()), mirrored


@settings(max_examples=1_000, deadline=None)
@given(scenarios())
def test_a_hostile_mirror_never_makes_recovery_skip(
    scenario: tuple[int | None, int, int, list[Token], list[RangeProgress]],
) -> None:
    committed, log_end, min_offsets, tokens, mirrored = scenario
    plan = plan_partition(
        trust=LEGACY,
        committed=committed,
        log_end=log_end,
        min_offsets=min_offsets,
        store_tokens=tokens,
        mirrored=mirrored,
    )
    # restored ranges: fresh, non-empty, disjoint, inside the log, outside every store range
    for r in plan.restored:
        assert r.committed == r.start < r.end <= log_end
        assert r.completed == frozenset()
        assert not any(r.span.overlaps(t.span) for t in tokens)
    for a, b in pairwise(plan.restored):
        assert a.end < b.start  # merged: not even touching
    assert len(plan.restored) <= len(mirrored) + len(tokens) + 1
    # the property of issue 11
    if plan.primary_start is None or committed is None or committed < 0:
        return  # the primary reads everything from its committed offset on, as a plain consumer
    read_elsewhere = (
        list(plan.new_ranges)
        + [r.span for r in plan.restored]
        + [t.span for t in plan.backfill]
        + [t.span for t in tokens if not t.is_open]
    )
    end = min(plan.primary_start, log_end)
    if committed < end:
        assert subtract(OffsetRange(committed, end), read_elsewhere) == []
    assert plan.primary_start <= log_end


def test_exhaustive_small_universe() -> None:
    """Every single mirrored row over offsets 0..7 with every progress, committed and log end."""
    universe = 8
    for log_end in range(universe + 1):
        for committed in range(log_end + 1):
            for s in range(universe):
                for e in range(s, universe + 1):
                    for c in range(s, e + 1):
                        row = RangeProgress(s, e, c)
                        plan = plan_partition(
                            trust=LEGACY, committed=committed, log_end=log_end, min_offsets=1, mirrored=[row]
                        )
                        if plan.primary_start is None:
                            continue
                        spans = list(plan.new_ranges) + [r.span for r in plan.restored]
                        assert subtract(OffsetRange(committed, plan.primary_start), spans) == []
                        assert all(r.committed == r.start and r.end <= log_end for r in plan.restored)
