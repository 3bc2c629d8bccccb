"""Unit and property tests of the recovery decision (fastrecover.recovery.plan_partition)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrecover.codec import Marker
from fastrecover.ranges import OffsetRange, RangeProgress
from fastrecover.recovery import (
    LATE_OPEN_S,
    LEGACY,
    UNTRUSTED,
    PartitionPlan,
    Trust,
    late_jump,
    plan_partition,
    replay_outlasts_open,
    synced_from_elsewhere,
    this_cluster,
    trust_of,
)
from fastrecover.tokens import Token, TokenState

# ---- helpers ---------------------------------------------------------------------------------------


def token(
    token_id: int,
    start: int,
    end: int,
    committed: int | None = None,
    *,
    done: bool = False,
    completed: frozenset[int] = frozenset(),
) -> Token:
    if done:
        progress = RangeProgress(start, end, end)
    else:
        progress = RangeProgress(start, end, start if committed is None else committed, completed)
    return Token(token_id, "g", "t", 0, progress, state=TokenState.DONE if done else TokenState.OPEN)


def offsets(spans: Sequence[OffsetRange]) -> set[int]:
    return {o for s in spans for o in range(s.start, s.end)}


def unfinished(p: RangeProgress) -> set[int]:
    return {o for o in range(p.committed, p.end) if o not in p.completed}


# ---- examples --------------------------------------------------------------------------------------


class TestKipExample:
    def test_first_crash(self) -> None:
        plan = plan_partition(trust=LEGACY, committed=70, log_end=120, min_offsets=10)
        assert plan.primary_start == 120
        assert plan.new_ranges == (OffsetRange(70, 120),)
        assert plan.restored == ()
        assert plan.backfill == ()
        assert plan.fallback_start == 70
        assert plan.lag == 50

    def test_second_crash_with_the_old_range_done(self) -> None:
        old = token(1, 70, 120, done=True)
        plan = plan_partition(trust=LEGACY, committed=140, log_end=190, min_offsets=10, store_tokens=[old])
        assert plan.primary_start == 190
        assert plan.new_ranges == (OffsetRange(140, 190),)
        assert plan.backfill == ()
        assert plan.fallback_start == 140

    def test_second_crash_with_the_old_range_still_open(self) -> None:
        old = token(1, 70, 120, committed=95)
        plan = plan_partition(trust=LEGACY, committed=140, log_end=190, min_offsets=10, store_tokens=[old])
        assert plan.primary_start == 190
        assert plan.new_ranges == (OffsetRange(140, 190),)
        assert plan.backfill == (old,)

    def test_crash_before_the_primary_ever_committed(self) -> None:
        # the primary jumped to 120 but crashed before committing: committed is still 70
        old = token(1, 70, 120, committed=80)
        plan = plan_partition(trust=LEGACY, committed=70, log_end=190, min_offsets=10, store_tokens=[old])
        assert plan.primary_start == 190
        assert plan.new_ranges == (OffsetRange(120, 190),)
        assert plan.backfill == (old,)


class TestNoSplit:
    def test_lag_below_min(self) -> None:
        plan = plan_partition(trust=LEGACY, committed=70, log_end=79, min_offsets=10)
        assert plan == PartitionPlan(primary_start=None)
        assert plan.lag == 0

    def test_lag_exactly_min_is_split(self) -> None:
        plan = plan_partition(trust=LEGACY, committed=70, log_end=80, min_offsets=10)
        assert plan.primary_start == 80
        assert plan.new_ranges == (OffsetRange(70, 80),)

    @pytest.mark.parametrize("committed", [None, -1, -1001])
    def test_no_committed_offset(self, committed: int | None) -> None:
        plan = plan_partition(trust=LEGACY, committed=committed, log_end=10_000, min_offsets=1)
        assert plan.primary_start is None
        assert plan.new_ranges == ()
        assert plan.fallback_start is None

    def test_log_end_below_committed(self) -> None:
        plan = plan_partition(trust=LEGACY, committed=500, log_end=100, min_offsets=1)
        assert plan.primary_start is None
        assert plan.new_ranges == ()

    def test_open_tokens_are_backfilled_even_without_split(self) -> None:
        old = token(3, 10, 50)
        done = token(4, 50, 60, done=True)
        plan = plan_partition(trust=LEGACY, committed=None, log_end=100, min_offsets=10, store_tokens=[old, done])
        assert plan.primary_start is None
        assert plan.backfill == (old,)

    def test_mirror_is_restored_even_without_split(self) -> None:
        mirrored = [RangeProgress(10, 50, 20)]
        plan = plan_partition(trust=LEGACY, committed=100, log_end=101, min_offsets=10, mirrored=mirrored)
        assert plan.primary_start is None
        assert plan.restored == (RangeProgress(10, 50, 10),)


class TestOverlaps:
    def test_new_range_skips_open_tokens_inside_the_lag(self) -> None:
        a = token(1, 80, 90)
        b = token(2, 100, 130)
        plan = plan_partition(trust=LEGACY, committed=70, log_end=200, min_offsets=10, store_tokens=[b, a])
        assert plan.new_ranges == (OffsetRange(70, 80), OffsetRange(90, 100), OffsetRange(130, 200))
        assert set(plan.backfill) == {a, b}
        assert plan.lag == 10 + 10 + 70

    def test_lag_covered_entirely_by_open_tokens(self) -> None:
        a = token(1, 60, 130)
        plan = plan_partition(trust=LEGACY, committed=70, log_end=130, min_offsets=10, store_tokens=[a])
        assert plan.primary_start == 130
        assert plan.new_ranges == ()
        assert plan.backfill == (a,)

    def test_done_tokens_do_not_hide_the_lag(self) -> None:
        # re-reading a done range only re-delivers; it never loses anything
        done = token(1, 80, 90, done=True)
        plan = plan_partition(trust=LEGACY, committed=70, log_end=100, min_offsets=10, store_tokens=[done])
        assert offsets(plan.new_ranges) >= set(range(70, 80)) | set(range(90, 100))


class TestMirrorRestore:
    """The mirror is untrusted: its spans are re-read from their start, its progress never counts."""

    def test_store_wiped_restores_mirror_fresh(self) -> None:
        mirrored = [RangeProgress(70, 120, 95, frozenset({100, 101}))]
        plan = plan_partition(trust=LEGACY, committed=140, log_end=190, min_offsets=10, mirrored=mirrored)
        assert plan.restored == (RangeProgress(70, 120, 70),)
        assert plan.new_ranges == (OffsetRange(140, 190),)

    def test_known_open_or_done_entries_are_not_restored(self) -> None:
        mirrored = [RangeProgress(70, 120, 95), RangeProgress(140, 190, 150), RangeProgress(200, 250, 210)]
        store = [token(1, 70, 120, committed=100), token(2, 140, 190, done=True)]
        plan = plan_partition(
            trust=LEGACY, committed=300, log_end=400, min_offsets=10, store_tokens=store, mirrored=mirrored
        )
        assert plan.restored == (RangeProgress(200, 250, 200),)
        assert plan.backfill == (store[0],)

    def test_done_mirror_entries_are_ignored(self) -> None:
        plan = plan_partition(
            trust=LEGACY, committed=300, log_end=301, min_offsets=10, mirrored=[RangeProgress(0, 10, 10)]
        )
        assert plan.restored == ()

    def test_partly_known_entry_is_clipped_and_fresh(self) -> None:
        # the mirror merged two ranges; the store still knows the first one
        mirrored = [RangeProgress(70, 200, 90, frozenset({95, 150, 151, 199}))]
        store = [token(1, 70, 120, committed=100)]
        plan = plan_partition(
            trust=LEGACY, committed=200, log_end=201, min_offsets=10, store_tokens=store, mirrored=mirrored
        )
        assert plan.restored == (RangeProgress(120, 200, 120),)

    def test_a_forged_almost_done_range_skips_nothing(self) -> None:
        """Issue 11: committed = end - 1 with an empty store delivered 1 of 2,000 records."""
        mirrored = [RangeProgress(0, 2_000, 1_999)]
        plan = plan_partition(trust=LEGACY, committed=0, log_end=2_000, min_offsets=100, mirrored=mirrored)
        assert plan.primary_start == 2_000
        assert plan.restored == (RangeProgress(0, 2_000, 0),)
        assert plan.new_ranges == ()

    def test_ranges_past_the_log_end_are_clipped(self) -> None:
        """Issue 11: a range past the log end swallowed every primary commit."""
        mirrored = [RangeProgress(0, 2**62, 0), RangeProgress(5_000, 9_000, 5_000)]
        plan = plan_partition(trust=LEGACY, committed=0, log_end=2_500, min_offsets=100, mirrored=mirrored)
        assert plan.restored == (RangeProgress(0, 2_500, 0),)
        assert all(r.end <= 2_500 for r in plan.restored)

    def test_overlapping_and_duplicate_entries_are_merged(self) -> None:
        mirrored = [RangeProgress(10, 50, 10)] * 5_000 + [RangeProgress(40, 80, 60), RangeProgress(80, 90, 85)]
        plan = plan_partition(trust=LEGACY, committed=100, log_end=101, min_offsets=10, mirrored=mirrored)
        assert plan.restored == (RangeProgress(10, 90, 10),)

    def test_new_ranges_do_not_overlap_restored(self) -> None:
        mirrored = [RangeProgress(100, 150, 120)]
        plan = plan_partition(trust=LEGACY, committed=70, log_end=200, min_offsets=10, mirrored=mirrored)
        assert plan.restored == (RangeProgress(100, 150, 100),)
        assert plan.new_ranges == (OffsetRange(70, 100), OffsetRange(150, 200))


# ---- properties ------------------------------------------------------------------------------------


@st.composite
def progress_in(draw: st.DrawFn, lo: int, hi: int) -> RangeProgress:
    start = draw(st.integers(lo, hi))
    end = draw(st.integers(start, min(hi, start + 80)))
    committed = draw(st.integers(start, end))
    above = list(range(committed + 1, end))
    completed = draw(st.frozensets(st.sampled_from(above), max_size=10)) if above else frozenset()
    return RangeProgress(start, end, committed, completed)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, object]:
    committed = draw(st.one_of(st.none(), st.integers(-1, 300)))
    log_end = draw(st.integers(0, 400))
    min_offsets = draw(st.integers(1, 60))
    tokens: list[Token] = []
    for i, p in enumerate(draw(st.lists(progress_in(0, 400), max_size=5))):
        done = draw(st.booleans())
        tokens.append(
            Token(
                i + 1,
                "g",
                "t",
                0,
                RangeProgress(p.start, p.end, p.end) if done else p,
                state=TokenState.DONE if done else TokenState.OPEN,
            )
        )
    mirrored = draw(st.lists(progress_in(0, 400), max_size=5))
    return {
        "committed": committed,
        "log_end": log_end,
        "min_offsets": min_offsets,
        "store_tokens": tokens,
        "mirrored": mirrored,
    }


@settings(max_examples=400)
@given(
    committed=st.one_of(st.none(), st.integers(-1, 300)),
    log_end=st.integers(0, 400),
    min_offsets=st.integers(1, 60),
    mirrored=st.lists(progress_in(0, 400), max_size=3),
    trust=st.sampled_from([UNTRUSTED, LEGACY, Trust(lineage="c/00")]),
)
def test_a_partition_without_ranges_is_planned_as_the_general_path_plans_it(
    committed: int | None, log_end: int, min_offsets: int, mirrored: list[RangeProgress], trust: Trust
) -> None:
    """The shortcut for a partition with no range that counts gives the general path's plan.

    A superseded token in the store counts for nothing and sends the call down the general path.
    """
    if trust.any:
        mirrored = []  # a mirror the offset vouches for is a range that counts: not the shortcut's case
    superseded = Token(9, "g", "t", 0, RangeProgress(0, 5, 0), state=TokenState.SUPERSEDED)
    given = {"committed": committed, "log_end": log_end, "min_offsets": min_offsets, "mirrored": mirrored}
    short = plan_partition(trust=trust, **given)  # type: ignore[arg-type]
    general = plan_partition(trust=trust, store_tokens=[superseded], **given)  # type: ignore[arg-type]
    assert short == general


@settings(max_examples=400)
@given(scenarios(), st.integers(-1, 420), st.sampled_from([LEGACY, UNTRUSTED]))
def test_a_late_jump_skips_nothing_the_replay_has_not_handed_out(
    scenario: dict[str, object], position: int, trust: Trust
) -> None:
    """From the replay's position to the log end every offset is the primary's, a range's, or a done range's."""
    min_offsets = scenario["min_offsets"]
    store_tokens: list[Token] = scenario["store_tokens"]  # type: ignore[assignment]
    assert isinstance(min_offsets, int)
    jump = plan_partition(trust=trust, **scenario)  # type: ignore[arg-type]
    late = late_jump(jump, position, min_offsets)
    left = offsets(jump.new_ranges) - set(range(-1, position))  # what the replay has not handed out
    if late is None:
        assert jump.primary_start is None or jump.retired or len(left) < min_offsets
        return
    assert late.primary_start == jump.primary_start is not None
    assert (late.restored, late.backfill, late.kept, late.retired) == (jump.restored, jump.backfill, jump.kept, ())
    assert late.lag >= min_offsets
    for r in late.new_ranges:
        assert len(r) > 0 and r.start >= position
    for a, b in pairwise(late.new_ranges):
        assert a.end <= b.start
    taken = [t.span for t in store_tokens if not t.is_superseded] + [r.span for r in late.restored]
    covered = offsets(late.new_ranges) | offsets(taken)
    committed = scenario["committed"]
    assert isinstance(committed, int) and late.primary_start is not None  # a plan with a jump has both
    assert set(range(max(position, committed), late.primary_start)) <= covered
    assert offsets(late.new_ranges) == left, "only what the replay handed out is left out"


def test_a_replay_that_catches_up_before_an_open_would_end_runs_on_and_a_slow_one_waits_for_the_open() -> None:
    # 100k records behind: 60k read in 0.05 s, the other 40k take about 0.03 s more: sooner than an open
    assert not replay_outlasts_open(0, 100_000, 60_000, 0.05, 100)
    # 1M behind, 60k read in 0.05 s: about 0.8 s more
    assert replay_outlasts_open(0, 1_000_000, 60_000, 0.05, 100)
    # records that cost 10 ms each to process: 5 read in 0.05 s
    assert replay_outlasts_open(0, 300, 5, 0.05, 10)
    assert replay_outlasts_open(0, 300, None, 0.05, 10), "nothing returned yet: no pace, it waits"
    assert not replay_outlasts_open(0, 300, 295, 0.05, 10), "within backfill.min.offsets of the end"


@settings(max_examples=300)
@given(st.integers(0, 1_000), st.integers(0, 10_000), st.integers(0, 10_000), st.floats(0.001, 10), st.integers(1, 500))
def test_a_replay_outlasts_the_open_exactly_when_its_pace_says_so(
    committed: int, lag: int, read: int, elapsed: float, min_offsets: int
) -> None:
    position = committed + min(read, lag)
    left = committed + lag - position
    # the time the rest takes at the pace so far (left / read * elapsed), compared without a division
    expected = left >= min_offsets and (position == committed or left * elapsed > LATE_OPEN_S * (position - committed))
    assert replay_outlasts_open(committed, committed + lag, position, elapsed, min_offsets) == expected


def test_a_late_jump_starts_its_range_at_the_replays_position() -> None:
    jump = plan_partition(committed=100, log_end=1_000, min_offsets=50, trust=UNTRUSTED)
    assert late_jump(jump, 130, 50) == PartitionPlan(
        primary_start=1_000, new_ranges=(OffsetRange(130, 1_000),), fallback_start=100
    )
    assert late_jump(jump, 960, 50) is None, "the replay reads the last 40 records itself"
    assert late_jump(plan_partition(committed=100, log_end=1_000, min_offsets=2_000, trust=UNTRUSTED), 130, 50) is None


@settings(max_examples=400)
@given(scenarios())
def test_plan_properties(scenario: dict[str, object]) -> None:
    plan = plan_partition(trust=LEGACY, **scenario)  # type: ignore[arg-type]
    committed = scenario["committed"]
    log_end = scenario["log_end"]
    min_offsets = scenario["min_offsets"]
    store_tokens: list[Token] = scenario["store_tokens"]  # type: ignore[assignment]
    mirrored: list[RangeProgress] = scenario["mirrored"]  # type: ignore[assignment]
    assert isinstance(committed, int | None)
    assert isinstance(log_end, int)
    assert isinstance(min_offsets, int)

    open_tokens = [t for t in store_tokens if t.is_open]
    assert plan.backfill == tuple(open_tokens)
    assert plan.lag == sum(len(r) for r in plan.new_ranges)

    # the split decision
    splits = committed is not None and committed >= 0 and log_end - committed >= min_offsets
    if splits:
        assert committed is not None
        assert plan.primary_start == log_end
        assert plan.fallback_start == committed
    else:
        assert plan.primary_start is None
        assert plan.new_ranges == ()
        assert plan.fallback_start is None

    # new ranges: sorted, non-empty, disjoint, inside the lag, clear of open and restored ranges
    for r in plan.new_ranges:
        assert len(r) > 0
        assert committed is not None
        assert committed <= r.start and r.end <= log_end
    for a, b in pairwise(plan.new_ranges):
        assert a.end <= b.start
    # done ranges are finished records (by the child or a Spark job): never handed out again
    taken = [t.span for t in store_tokens] + [r.span for r in plan.restored]
    for r in plan.new_ranges:
        assert not any(r.overlaps(s) for s in taken)

    # nothing is lost: [committed, log_end) is covered by new, open, done and restored ranges
    # (the primary reads from primary_start on, or from committed when it does not jump)
    if plan.primary_start is not None:
        assert committed is not None
        covered = offsets(plan.new_ranges) | offsets(taken)
        assert set(range(committed, plan.primary_start)) <= covered

    # restored ranges: fresh, disjoint, below the log end, only where the store has never heard of
    known = offsets([t.span for t in store_tokens])
    for rp in plan.restored:
        assert not rp.done
        assert rp.committed == rp.start and rp.completed == frozenset()
        assert rp.end <= max(log_end, 0)
        assert not offsets([rp.span]) & known
        assert offsets([rp.span]) <= offsets([m.span for m in mirrored if not m.done])
    for left, right in pairwise(plan.restored):
        assert left.end <= right.start
    for m in mirrored:
        # every offset of an open mirror row below the log end is the store's business or restored
        if not m.done and m.start < min(m.end, log_end):
            assert offsets([OffsetRange(m.start, min(m.end, log_end))]) - known <= offsets(
                [r.span for r in plan.restored]
            )


def test_a_done_range_is_not_handed_out_again_and_does_not_hide_what_follows_it() -> None:
    """A Spark job finished [100, 2100) but the group's Kafka offset is still 100; the log is at 2101."""
    from fastrecover.ranges import OffsetRange as _Span
    from fastrecover.ranges import RangeProgress as _Progress
    from fastrecover.tokens import Token as _Token
    from fastrecover.tokens import TokenState as _State

    done = _Token(1, "g", "t", 0, _Progress(100, 2100, 2100), state=_State.DONE)
    plan = plan_partition(trust=LEGACY, committed=100, log_end=2101, min_offsets=1, store_tokens=[done])
    assert plan.new_ranges == (_Span(2100, 2101),)
    assert plan.primary_start == 2101
    assert plan.backfill == ()


# ---- which ranges the committed offset vouches for ---------------------------------------------------

A = "clusterA/aaaaaaaaaaaaaaaa"
B = "clusterA/bbbbbbbbbbbbbbbb"
ELSEWHERE = "clusterB/aaaaaaaaaaaaaaaa"


def lineage_token(token_id: int, start: int, end: int, lineage: str | None, *, done: bool = True) -> Token:
    progress = RangeProgress(start, end, end if done else start)
    return Token(token_id, "g", "t", 0, progress, state=TokenState.DONE if done else TokenState.OPEN, lineage=lineage)


class TestTrust:
    def test_a_marker_vouches_for_its_lineage_at_its_own_offset_on_its_own_cluster(self) -> None:
        assert trust_of(100, Marker(A, 100, ()), "clusterA") == Trust(lineage=A)
        assert trust_of(0, Marker(A, 100, ()), "clusterA") is UNTRUSTED, "the offset moved without the marker"
        assert trust_of(100, Marker(A, 100, ()), "clusterB") is UNTRUSTED, "another cluster's marker"
        assert trust_of(None, Marker(A, 100, ()), "clusterA") is UNTRUSTED
        assert trust_of(100, None, "clusterA") is UNTRUSTED, "a plain commit, an admin reset"
        assert trust_of(100, Marker(None, None, ()), "clusterA") is LEGACY, "an older version's fr1 mirror"

    def test_only_another_clusters_marker_with_unfinished_ranges_says_the_offset_was_synced_from_elsewhere(
        self,
    ) -> None:
        owing = (RangeProgress.fresh(10, 50),)
        assert synced_from_elsewhere(Marker(ELSEWHERE, 100, owing), "clusterA"), "MirrorMaker 2 copied it here"
        assert synced_from_elsewhere(Marker(ELSEWHERE, 80, owing), "clusterA"), "translated or not"
        assert not synced_from_elsewhere(Marker(ELSEWHERE, 100, ()), "clusterA"), "nothing was owed there"
        assert not synced_from_elsewhere(Marker(A, 100, owing), "clusterA"), "this cluster's own marker"
        assert not synced_from_elsewhere(Marker(None, None, owing), "clusterA"), "fr1 names no cluster"
        assert not synced_from_elsewhere(None, "clusterA")

    def test_vouching(self) -> None:
        assert Trust(lineage=A).vouches(lineage_token(1, 0, 5, A))
        assert not Trust(lineage=A).vouches(lineage_token(1, 0, 5, B))
        assert not Trust(lineage=A).vouches(lineage_token(1, 0, 5, None))
        assert LEGACY.vouches(lineage_token(1, 0, 5, None)) and not LEGACY.vouches(lineage_token(1, 0, 5, A))
        assert not UNTRUSTED.vouches(lineage_token(1, 0, 5, None))

    def test_tokens_of_another_cluster_are_not_this_partitions(self) -> None:
        mine, old, theirs = lineage_token(1, 0, 5, A), lineage_token(2, 5, 9, None), lineage_token(3, 9, 12, ELSEWHERE)
        assert this_cluster([mine, old, theirs], "clusterA") == [mine, old]

    def test_an_offset_reset_below_a_done_range_reads_it_again(self) -> None:
        done = lineage_token(1, 100, 1100, A)
        plan = plan_partition(trust=UNTRUSTED, committed=0, log_end=1100, min_offsets=10, store_tokens=[done])
        assert plan.retired == (done,)
        assert plan.new_ranges == (OffsetRange(0, 1100),)
        assert plan.kept == () and plan.backfill == ()

    def test_no_committed_offset_retires_every_range(self) -> None:
        done, open_ = lineage_token(1, 100, 1100, A), lineage_token(2, 0, 50, A, done=False)
        plan = plan_partition(trust=UNTRUSTED, committed=None, log_end=3000, min_offsets=10, store_tokens=[done, open_])
        assert set(plan.retired) == {done, open_}
        assert plan.primary_start is None and plan.backfill == ()

    def test_an_open_range_owed_below_a_plain_members_offset_is_still_read(self) -> None:
        owed = lineage_token(1, 100, 200, A, done=False)
        plan = plan_partition(trust=UNTRUSTED, committed=500, log_end=520, min_offsets=100, store_tokens=[owed])
        assert plan.retired == () and plan.backfill == (owed,) and plan.kept == (owed,)

    def test_the_mirror_counts_only_when_the_offset_vouches_for_something(self) -> None:
        mirrored = [RangeProgress(10, 60, 10)]
        assert (
            plan_partition(trust=UNTRUSTED, committed=100, log_end=100, min_offsets=10, mirrored=mirrored).restored
            == ()
        )
        vouched = plan_partition(trust=Trust(lineage=A), committed=100, log_end=100, min_offsets=10, mirrored=mirrored)
        assert vouched.restored == (RangeProgress(10, 60, 10),)


LINEAGES = (None, A, B)
TRUSTS = (UNTRUSTED, LEGACY, Trust(lineage=A), Trust(lineage=B))


@st.composite
def lineage_scenarios(draw: st.DrawFn) -> dict[str, object]:
    scenario = draw(scenarios())
    tokens: list[Token] = scenario["store_tokens"]  # type: ignore[assignment]
    states = st.sampled_from([TokenState.OPEN, TokenState.DONE, TokenState.SUPERSEDED])
    relabelled = []
    for t in tokens:
        state = draw(states)
        progress = t.progress if state is TokenState.OPEN else RangeProgress(t.span.start, t.span.end, t.span.end)
        relabelled.append(Token(t.id, "g", "t", 0, progress, state=state, lineage=draw(st.sampled_from(LINEAGES))))
    scenario["store_tokens"] = relabelled
    scenario["trust"] = draw(st.sampled_from(TRUSTS))
    return scenario


@settings(max_examples=500)
@given(lineage_scenarios())
def test_a_range_counts_only_while_the_committed_offset_vouches_for_it(scenario: dict[str, object]) -> None:
    plan = plan_partition(**scenario)  # type: ignore[arg-type]
    committed: int | None = scenario["committed"]  # type: ignore[assignment]
    trust: Trust = scenario["trust"]  # type: ignore[assignment]
    tokens: list[Token] = scenario["store_tokens"]  # type: ignore[assignment]
    valid = committed is not None and committed >= 0
    live = [t for t in tokens if not t.is_superseded]

    # every live range is either retired or kept; a superseded one is neither, nor read
    assert sorted(t.id for t in plan.retired + plan.kept) == sorted(t.id for t in live)
    assert plan.backfill == tuple(t for t in plan.kept if t.is_open)
    for t in plan.retired:
        assert not trust.vouches(t)
        assert not valid or t.span.end > committed or t.span.start >= committed  # type: ignore[operator]
    if not valid:
        assert {t.id for t in plan.retired} == {t.id for t in live if not trust.vouches(t)}
    if not trust.any:
        assert plan.restored == ()

    # above the committed offset, only what the offset vouches for may stand in for a read
    if plan.primary_start is not None:
        assert committed is not None
        vouched = [t.span for t in plan.kept if trust.vouches(t)]
        covered = offsets(plan.new_ranges) | offsets([r.span for r in plan.restored]) | offsets(vouched)
        assert set(range(committed, plan.primary_start)) <= covered
        for t in plan.kept:
            if not trust.vouches(t):
                assert t.span.end <= committed and t.span.start < committed, "an unvouched range kept above"

    # what a vouched mirror names is read again, unless a range the offset vouches for covers it
    if trust.any:
        vouched_or_restored = offsets([t.span for t in plan.kept if trust.vouches(t)]) | offsets(
            [r.span for r in plan.restored]
        )
        log_end: int = scenario["log_end"]  # type: ignore[assignment]
        mirrored: list[RangeProgress] = scenario["mirrored"]  # type: ignore[assignment]
        for row in mirrored:
            if not row.done:
                owed = set(range(row.start, min(row.end, max(log_end, 0))))
                assert owed <= vouched_or_restored, f"mirrored {row} not read: {sorted(owed - vouched_or_restored)[:5]}"

    # below the committed offset, what a retired open range still owed is read by a new range
    if committed is not None and committed >= 0:
        # a range kept only for lying below the offset excuses nothing: whoever moved the offset asked again
        believed = offsets([t.span for t in plan.kept if trust.vouches(t)])
        read = offsets(plan.new_ranges) | believed | offsets([r.span for r in plan.restored])
        for t in plan.retired:
            if t.is_open:
                owed = set(range(t.progress.committed, min(t.span.end, committed)))
                assert owed <= read, f"range #{t.id} owed {sorted(owed - read)[:5]} below {committed}"
    else:
        assert plan.new_ranges == (), "nothing is carried without a committed offset"
