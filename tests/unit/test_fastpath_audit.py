"""Fast paths against slow, obviously correct models (record-loss audit).

Every shortcut that was added for speed (in-order runs, bisects, C-level
``map``/``zip`` reductions, last-item-per-partition tricks) is compared with a
set-based reference on the inputs callers can actually produce: duplicates,
unsorted offsets, out-of-range and negative offsets, error events mixed into a
batch (also as the last item), several topics sharing partition numbers, empty
lists.  The safety property everywhere is the at-least-once one: an offset must
never count as finished unless someone finished it.

``FR_AUDIT_EXAMPLES`` raises the example count while hunting (default 300).
"""

from __future__ import annotations

import os
from itertools import groupby
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fastrecover.batches import batch_offsets, cut_batch, partition_runs, runs
from fastrecover.book import RangeBook
from fastrecover.commits import Deferred, route_deferred
from fastrecover.completion_map import decode_completed, encode_completed
from fastrecover.errors import CodecError
from fastrecover.primary import PrimaryOffsets, last_offsets
from fastrecover.ranges import (
    OffsetRange,
    RangeProgress,
    merged_committed,
    route_commit,
    route_record,
    split_commit,
)
from fastrecover.tokens import Token, TopicPartitionKey

N = int(os.environ.get("FR_AUDIT_EXAMPLES", "300"))
AUDIT = settings(max_examples=N, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def finished(p: RangeProgress) -> set[int]:
    return set(range(p.start, p.committed)) | set(p.completed)


def canonical(start: int, end: int, done: set[int]) -> RangeProgress:
    """The one RangeProgress whose finished set is ``done`` (restricted to the range)."""
    done = {o for o in done if start <= o < end}
    committed = start
    while committed in done:
        committed += 1
    return RangeProgress(start, end, committed, frozenset(o for o in done if o > committed))


# ---- strategies ------------------------------------------------------------------------------------


@st.composite
def progresses(draw: st.DrawFn, max_len: int = 40) -> RangeProgress:
    start = draw(st.integers(0, 50))
    end = start + draw(st.integers(0, max_len))
    committed = draw(st.integers(start, end))
    above = list(range(committed + 1, end))
    completed = draw(st.frozensets(st.sampled_from(above))) if above else frozenset()
    return RangeProgress(start, end, committed, completed)


@st.composite
def offset_batches(draw: st.DrawFn, p: RangeProgress) -> list[int]:
    """Offsets a caller may hand mark_done: runs from committed (the shortcut), with dups, holes, junk."""
    lo, hi = p.start - 5, p.end + 5
    kind = draw(st.sampled_from(["run", "run+dup", "run+hole", "run+junk", "any", "empty"]))
    if kind == "empty":
        return []
    if kind == "any":
        return draw(st.lists(st.integers(min(lo, -3), hi), max_size=30))
    first = p.committed + draw(st.integers(-2, 2))
    length = draw(st.integers(1, max(1, p.end - p.committed + 3)))
    run = list(range(first, first + length))
    if kind == "run+dup":
        i = draw(st.integers(0, len(run) - 1))
        run.insert(i, run[draw(st.integers(0, len(run) - 1))])
        if len(run) > 2 and draw(st.booleans()):
            run.pop(draw(st.integers(1, len(run) - 2)))  # keep length, lose an offset: [0, 0, 2]
    elif kind == "run+hole" and len(run) > 2:
        run.pop(draw(st.integers(1, len(run) - 2)))
    elif kind == "run+junk":
        run.insert(draw(st.integers(0, len(run))), draw(st.integers(-10, hi + 10)))
    if draw(st.booleans()):
        run = draw(st.permutations(run))
    return run


@st.composite
def progress_and_offsets(draw: st.DrawFn) -> tuple[RangeProgress, list[int]]:
    p = draw(progresses())
    return p, draw(offset_batches(p))


@st.composite
def disjoint_spans(draw: st.DrawFn, max_ranges: int = 4) -> list[tuple[int, OffsetRange]]:
    cuts = sorted(draw(st.lists(st.integers(0, 80), min_size=0, max_size=2 * max_ranges, unique=True)))
    spans = [OffsetRange(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False)]
    ids = draw(st.permutations(list(range(100, 100 + len(spans)))))
    out = list(zip(ids, spans, strict=True))
    return draw(st.permutations(out))


# ---- RangeProgress ---------------------------------------------------------------------------------


class TestRangeProgressAgainstSets:
    @AUDIT
    @given(progress_and_offsets(), st.sampled_from(["list", "tuple", "gen", "set"]))
    def test_mark_done_is_set_union(self, case: tuple[RangeProgress, list[int]], form: str) -> None:
        p, offsets = case
        arg: Any = {
            "list": list(offsets),
            "tuple": tuple(offsets),
            "gen": (o for o in offsets),
            "set": set(offsets),
        }[form]
        got = p.mark_done(arg)
        assert got == canonical(p.start, p.end, finished(p) | set(offsets))

    @AUDIT
    @given(progresses(), st.integers(-5, 100))
    def test_commit_upto(self, p: RangeProgress, nxt: int) -> None:
        assert p.commit_upto(nxt) == canonical(p.start, p.end, finished(p) | set(range(p.start, nxt)))

    @AUDIT
    @given(progresses(), st.integers(-5, 100))
    def test_skip_to(self, p: RangeProgress, low: int) -> None:
        got, lost = p.skip_to(low)
        gone = set(range(p.start, min(low, p.end)))
        assert got == canonical(p.start, p.end, finished(p) | gone)
        assert lost == len(gone - finished(p))

    @AUDIT
    @given(progresses(), st.data())
    def test_sequence_of_marks(self, p: RangeProgress, data: st.DataObject) -> None:
        """Several batches one after the other (the shortcut sees the result of the previous ones)."""
        model = finished(p)
        for _ in range(data.draw(st.integers(1, 6))):
            offsets = data.draw(offset_batches(p))
            p = p.mark_done(offsets)
            model |= set(offsets)
            assert p == canonical(p.start, p.end, model)


# ---- routing ---------------------------------------------------------------------------------------


class TestRouting:
    # route_records against route_record: tests/unit/test_ranges.py (test_matches_route_record)

    @AUDIT
    @given(
        disjoint_spans(),
        st.lists(st.tuples(st.sampled_from([("a", 0), ("b", 0), ("a", 1)]), st.integers(-1003, 90)), max_size=20),
    )
    def test_split_commit(self, spans: list[tuple[int, OffsetRange]], raw: list[tuple[tuple[str, int], int]]) -> None:
        ranges = {TopicPartitionKey("a", 0): spans}
        pairs = [(TopicPartitionKey(*k), o) for k, o in raw]
        primary, routed = split_commit(pairs, ranges)
        span_of = dict(spans)
        for rid, nxt in routed.items():
            mine = [o for k, o in pairs if k == ("a", 0) and span_of[rid].start < o <= span_of[rid].end]
            assert nxt == max(mine)
        assert primary == [(k, o) for k, o in pairs if route_commit(o, ranges.get(k, ())) is None]
        # nothing of another topic with the same partition number is routed into a's ranges
        assert all(k == ("a", 0) for k, o in pairs if route_commit(o, ranges.get(k, ())) is not None)

    @AUDIT
    @given(st.lists(st.sampled_from([0, 1, 2, ("a", 0), ("b", 0)]), max_size=30))
    def test_runs_is_groupby(self, keys: list[Any]) -> None:
        want = []
        i = 0
        for _k, g in groupby(keys):
            n = len(list(g))
            want.append((i, i + n))
            i += n
        assert runs(keys) == want

    @AUDIT
    @given(st.lists(st.sampled_from([("a", 0), ("a", 1), ("a", 300), ("b", 0), ("b", 300)]), min_size=1, max_size=30))
    def test_partition_runs_is_groupby_of_topic_and_partition(self, keys: list[tuple[str, int]]) -> None:
        # partition numbers above 256 are distinct int objects: the one-partition shortcut compares by value
        msgs = [Message(topic=t, partition=int(str(p)), offset=i) for i, (t, p) in enumerate(keys)]
        want = []
        i = 0
        for k, g in groupby(keys):
            n = len(list(g))
            want.append((TopicPartitionKey(*k), i, i + n))
            i += n
        assert partition_runs(msgs) == want


# ---- merged committed() ----------------------------------------------------------------------------


class TestMergedCommitted:
    @AUDIT
    @given(st.data())
    def test_everything_below_the_answer_is_finished(self, data: st.DataObject) -> None:
        spans = [s for _i, s in data.draw(disjoint_spans())]
        progs = []
        for s in spans:
            committed = data.draw(st.integers(s.start, s.end))
            above = list(range(committed + 1, s.end))
            completed = data.draw(st.frozensets(st.sampled_from(above))) if above else frozenset()
            progs.append(RangeProgress(s.start, s.end, committed, completed))
        primary = data.draw(st.none() | st.integers(0, 90))
        got = merged_committed(primary, progs)
        if primary is None:
            assert got is None
            return
        assert got is not None

        def is_done(o: int) -> bool:
            for r in progs:
                if r.start <= o < r.end:
                    return o in finished(r)
            return o < primary

        assert all(is_done(o) for o in range(got))


# ---- cut_batch -------------------------------------------------------------------------------------


@st.composite
def fetched(draw: st.DrawFn, dups: bool) -> tuple[list[int], int, int]:
    offsets = sorted(draw(st.lists(st.integers(0, 60), max_size=25, unique=not dups)))
    fetch_next = draw(st.integers(0, 60))
    end = fetch_next + draw(st.integers(0, 40))
    return offsets, fetch_next, end


class TestCutBatch:
    @AUDIT
    @given(st.booleans().flatmap(fetched))
    def test_no_gap_covers_a_record_and_no_record_is_dropped(self, case: tuple[list[int], int, int]) -> None:
        offsets, fetch_next, end = case
        cut = cut_batch(offsets, fetch_next, end)
        present = set(offsets)
        gap_offsets = [o for a, b in cut.gaps for o in range(a, b)]
        assert not present & set(gap_offsets), "a gap (counted done) holds a fetched record"
        assert all(fetch_next <= o < end for o in gap_offsets)
        assert offsets[cut.lo : cut.hi] == [o for o in offsets if fetch_next <= o < end]
        assert cut.fetched_all == any(o >= end for o in offsets)

    @AUDIT
    @given(fetched(dups=False))
    def test_kept_and_gaps_tile_the_read_span(self, case: tuple[list[int], int, int]) -> None:
        """Liveness with real fetches (unique offsets): every offset up to the new cursor is kept or a gap."""
        offsets, fetch_next, end = case
        cut = cut_batch(offsets, fetch_next, end)
        covered = sorted([*offsets[cut.lo : cut.hi], *(o for a, b in cut.gaps for o in range(a, b))])
        assert covered == list(range(fetch_next, max(fetch_next, cut.fetch_next)))

    @AUDIT
    @given(fetched(dups=False))
    def test_batch_offsets_cut_as_the_list_of_offsets(self, case: tuple[list[int], int, int]) -> None:
        """The ``range`` shortcut for consecutive offsets is the list of them, and cuts identically."""
        offsets, fetch_next, end = case
        assume(offsets)
        seen = batch_offsets([Message(topic="t", partition=0, offset=o) for o in offsets])
        assert list(seen) == offsets
        assert cut_batch(seen, fetch_next, end) == cut_batch(offsets, fetch_next, end)
        if offsets[-1] - offsets[0] + 1 == len(offsets):
            assert isinstance(seen, range)

    def test_consecutive_offsets_are_a_range_and_holes_a_list(self) -> None:
        consecutive = batch_offsets([Message(topic="t", partition=0, offset=o) for o in range(300, 800)])
        assert consecutive == range(300, 800)
        holed = batch_offsets([Message(topic="t", partition=0, offset=o) for o in (3, 4, 6)])
        assert holed == [3, 4, 6]
        assert cut_batch(consecutive, 400, 500) == cut_batch(list(range(300, 800)), 400, 500)


# ---- primary offsets (C-level reductions over Message objects) -------------------------------------


def _msg(spec: tuple[str, str | None, int | None, int]) -> Message:
    kind, topic, partition, offset = spec
    if kind == "rec":
        return Message(topic=topic, partition=partition, offset=offset)
    if kind == "eof":
        return Message(topic=topic, partition=partition, offset=offset, error=KafkaError(KafkaError._PARTITION_EOF))
    kw: dict[str, Any] = {k: v for k, v in (("topic", topic), ("partition", partition)) if v is not None}
    return Message(**kw, error=KafkaError(KafkaError._TRANSPORT))


def batches(topics: list[str]) -> st.SearchStrategy[list[tuple[str, str | None, int | None, int]]]:
    rec = st.tuples(st.just("rec"), st.sampled_from(topics), st.integers(0, 2), st.integers(0, 50))
    eof = st.tuples(st.just("eof"), st.sampled_from(["a", "b"]), st.integers(0, 2), st.integers(0, 60))
    gen = st.tuples(st.just("err"), st.none(), st.sampled_from([None, -1]), st.just(0))
    return st.lists(st.one_of(rec, rec, eof, gen), max_size=15)


def reference_last(specs: list[tuple[str, str | None, int | None, int]]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for kind, topic, partition, offset in specs:
        if kind == "rec":
            out[(topic, partition)] = offset  # type: ignore[index]
    return out


class TestPrimaryOffsets:
    @AUDIT
    @given(batches(["a", "b"]))
    def test_last_offsets_multi_topic(self, specs: list[Any]) -> None:
        assert last_offsets([_msg(s) for s in specs]) == reference_last(specs)

    @AUDIT
    @given(batches(["a"]))
    def test_last_offsets_single_topic(self, specs: list[Any]) -> None:
        """Records are all of the one assigned topic; events may name any topic or none."""
        assert last_offsets([_msg(s) for s in specs], "a") == reference_last(specs)

    @AUDIT
    @given(st.lists(batches(["a"]), max_size=4), st.booleans())
    def test_settle_gives_last_record_plus_one(self, calls: list[Any], single: bool) -> None:
        po = PrimaryOffsets()
        po.set_single_topic("a" if single else None)
        want: dict[tuple[str, int], int] = {}
        for specs in calls:
            po.settle()
            po.unsettled.extend(_msg(s) for s in specs)
        po.settle()
        for specs in calls:
            want.update({k: o + 1 for k, o in reference_last(specs).items()})
        assert po.take_dirty() == want

    @AUDIT
    @given(
        st.lists(
            st.one_of(
                st.tuples(st.just("sync"), st.dictionaries(st.sampled_from([0, 1]), st.integers(-1001, 50))),
                st.tuples(st.just("seek"), st.sampled_from([0, 1]), st.integers(-1001, 50)),
            ),
            max_size=12,
        )
    )
    def test_positions_act_like_a_store_of_the_last_record_returned(self, steps: list[Any]) -> None:
        """A model of librdkafka's auto store: a sync applies each valid position; a seek hides the
        position (-1001) until a record is returned, and what was returned before it still counts."""
        po = PrimaryOffsets()
        model: dict[tuple[str, int], int] = {}
        hidden: dict[tuple[str, int], int] = {}  # position before a seek, kept until a sync
        for step in steps:
            if step[0] == "seek":
                _, p, before = step
                po.seeking(("a", p), before)
                if before >= 0:  # a record came since any earlier seek: this position is the newest
                    hidden[("a", p)] = before
                continue
            positions = [(("a", p), pos) for p, pos in step[1].items()]
            po.sync(positions)
            changed = {}
            for key, pos in positions:
                earlier = hidden.pop(key, -1)
                pos = pos if pos >= 0 else earlier
                if pos >= 0 and model.get(key) != pos:
                    model[key] = changed[key] = pos
            assert po.done == model
            assert po.take_dirty() == changed  # only what moved is stored again

    def test_a_sync_marks_only_changed_partitions_dirty(self) -> None:
        po = PrimaryOffsets()
        po.sync([(("a", 0), 5), (("a", 1), -1001)])
        assert po.take_dirty() == {("a", 0): 5}
        po.sync([(("a", 0), 5), (("a", 1), 3)])
        assert po.take_dirty() == {("a", 1): 3}
        po.seeking(("a", 1), 3)
        po.sync([(("a", 1), -1001)])  # a seek, and no record since: what was returned before stays
        assert po.take_dirty() == {} and po.done[("a", 1)] == 3
        po.seeking(("a", 1), 7)
        po.drop([TopicPartitionKey("a", 1)])
        po.sync([(("a", 1), -1001)])  # a revoked partition forgets its hidden position too
        assert po.done == {("a", 0): 5}

    def test_an_advanced_partition_is_stored_again_until_a_returned_record_moves_it(self) -> None:
        """A finished partition's floor is the primary's next offset: stored like a returned record's, and
        kept by a sync that knows no position there (the primary returned nothing since its jump)."""
        po = PrimaryOffsets()
        po.advance(("a", 0), 4020)
        assert po.take_dirty() == {("a", 0): 4020}
        po.sync([(("a", 0), -1001)])
        assert po.take_dirty() == {} and po.done[("a", 0)] == 4020
        po.sync([(("a", 0), 4025)])
        assert po.take_dirty() == {("a", 0): 4025}

    def test_a_record_returned_before_the_steady_state_never_moves_its_position_back(self) -> None:
        """A record noted as the last returned, then the steady state (positions): the commit takes the position.

        Seen when a recovery's store work ended in the tick of a call that then read one record the tracked way.
        """
        po = PrimaryOffsets()
        po.set_single_topic("a")
        po.last = _msg(("rec", "a", 0, 1))
        po.untracked = True
        po.settle()  # commit(): the last record returned is done ...
        po.sync([(("a", 0), 57)])  # ... and so is everything up to the position
        assert po.take_dirty() == {("a", 0): 57}


# ---- per-message commit/store routing (commits.route_deferred) ---------------------------------


def tok(token_id: int, key: TopicPartitionKey, start: int, end: int) -> Token:
    return Token(token_id, "g", key.topic, key.partition, RangeProgress.fresh(start, end), owner="me", epoch=1)


@st.composite
def routed_setup(draw: st.DrawFn) -> tuple[RangeBook, list[tuple[str, int, int]]]:
    """A book with ranges on a/0 (and b/0 when two topics are assigned) and the records deferred, in call order."""
    two_topics = draw(st.booleans())
    book = RangeBook()
    book.add(tok(1, TopicPartitionKey("a", 0), 10, 20))
    book.add(tok(2, TopicPartitionKey("a", 0), 30, 40))
    if two_topics:
        book.add(tok(3, TopicPartitionKey("b", 0), 0, 25))
    book.add(tok(4, TopicPartitionKey("a", 1), 5, 15))
    routes = book.routes()
    topics = ["a", "b"] if two_topics else ["a"]
    # what a commit(message=...) or store_offsets(message=...) may be handed: records in any order, twice
    rec = st.tuples(st.sampled_from(topics), st.integers(0, 1), st.integers(0, 60))
    calls = draw(st.lists(rec, max_size=20))
    return book, [c for c in calls if (c[0], c[1]) in routes]  # only these are deferred (consumer.py)


def reference_routing(
    book: RangeBook, calls: list[tuple[str, int, int]]
) -> tuple[dict[int, list[int]], dict[Any, int]]:
    by_range: dict[int, list[int]] = {}
    primary: dict[Any, int] = {}
    for topic, partition, offset in calls:
        key = TopicPartitionKey(topic, partition)
        rid = route_record(offset, book.spans(key))
        if rid is None:
            primary[key] = max(primary.get(key, -1), offset + 1)
        else:
            by_range.setdefault(rid, []).append(offset)
    return {k: sorted(v) for k, v in by_range.items()}, primary


def deferred_of(calls: list[tuple[str, int, int]]) -> Deferred:
    """What CommitRouter.defer_commit / defer_store keep of these calls: offsets per partition."""
    deferred: Deferred = {}
    for topic, partition, offset in calls:
        deferred.setdefault((topic, partition), []).append(offset)
    return deferred


class TestRouteDeferred:
    @AUDIT
    @given(routed_setup())
    def test_records_are_routed_like_route_record(self, setup: Any) -> None:
        book, calls = setup
        by_range, primary = route_deferred(book, deferred_of(calls))
        assert ({k: sorted(v) for k, v in by_range.items()}, primary) == reference_routing(book, calls)

    def test_the_primary_is_given_the_highest_record_of_a_partition_not_the_last_call(self) -> None:
        book = RangeBook()
        book.add(tok(1, TopicPartitionKey("a", 0), 10, 20))
        by_range, primary = route_deferred(book, {("a", 0): [25, 12, 21, 15]})
        assert by_range == {1: [12, 15]}
        assert primary == {TopicPartitionKey("a", 0): 26}
        assert all(type(k) is TopicPartitionKey for k in primary), "the primary's commit reads key.topic"


# ---- the book: pending/stored views against sets -----------------------------------------------------


KEY = TopicPartitionKey("t", 0)
START, END = 10, 40
offs = st.lists(st.integers(START - 3, END + 3), max_size=12)


class BookMachine(RuleBasedStateMachine):
    """Pending may only hold what was committed; stored what was stored or committed."""

    def __init__(self) -> None:
        super().__init__()
        self.book = RangeBook()
        self.book.add(tok(1, KEY, START, END))
        self.pending: set[int] = set()
        self.stored: set[int] = set()
        self.gone = False

    @rule(o=offs, perm=st.randoms())
    def mark_done(self, o: list[int], perm: Any) -> None:
        perm.shuffle(o)
        self.book.mark_done(1, o)
        self.pending |= set(o)
        self.stored |= set(o)

    @rule(first=st.integers(START - 2, END), n=st.integers(1, 8), dup=st.booleans())
    def mark_done_run(self, first: int, n: int, dup: bool) -> None:
        o = list(range(first, first + n))
        if dup and n > 2:
            o[1] = o[0]  # [x, x, x+2, ...]: a run's first/last/length, with a hole
        self.book.mark_done(1, o)
        self.pending |= set(o)
        self.stored |= set(o)

    @rule(o=offs)
    def mark_stored(self, o: list[int]) -> None:
        self.book.mark_stored(1, iter(o))
        self.stored |= set(o)

    @rule(n=st.integers(START - 3, END + 3))
    def commit_upto(self, n: int) -> None:
        self.book.commit_upto(1, n)
        self.pending |= set(range(START, n))
        self.stored |= set(range(START, n))

    @rule(n=st.integers(START - 3, END + 3))
    def store_upto(self, n: int) -> None:
        self.book.store_upto(1, n)
        self.stored |= set(range(START, n))

    @rule()
    def promote(self) -> None:
        self.book.promote_stored([KEY, KEY])
        self.pending = set(self.stored)

    @rule(low=st.integers(START - 3, END + 3))
    def skip(self, low: int) -> None:
        self.book.skip_to(1, low)
        self.pending |= set(range(START, low))
        self.stored |= set(range(START, low))

    @rule()
    def settle(self) -> None:
        held = self.book.get(1)
        if held is None:
            return
        token = Token(1, "g", KEY.topic, KEY.partition, held.pending, skipped=held.skipped, owner="me", epoch=1)
        self.book.settle(token)

    @invariant()
    def views_match_sets(self) -> None:
        held = self.book.get(1)
        model_pending = canonical(START, END, self.pending)
        if held is None:  # settled done: removed
            assert model_pending.done
            return
        assert held.pending == model_pending
        assert held.stored == canonical(START, END, self.stored)
        assert finished(held.durable) <= finished(held.pending) <= finished(held.stored)
        for w in self.book.works():
            assert w.next_offset == held.stored.committed
            assert w.skip == held.stored.completed


TestBookMachine = BookMachine.TestCase
TestBookMachine.settings = settings(max_examples=max(50, N // 3), stateful_step_count=30, deadline=None)


# ---- completion maps ---------------------------------------------------------------------------------


class TestCompletionMap:
    @AUDIT
    @given(st.integers(0, 10_000), st.data())
    def test_roundtrip_exact_within_end(self, committed: int, data: st.DataObject) -> None:
        width = data.draw(st.integers(1, 3000))
        end = committed + 1 + width
        done = data.draw(
            st.frozensets(st.integers(committed + 1, end - 1), max_size=60)
            | st.builds(
                lambda a, n: frozenset(range(a, min(a + n, end))),
                st.integers(committed + 1, end - 1),
                st.integers(1, 2000),
            )
        )
        text = encode_completed(committed, done)
        assert decode_completed(committed, text, end) == done
        if done:
            # decoded against another committed offset it never yields offsets at or below it
            other = committed + data.draw(st.integers(1, 5))
            try:
                got = decode_completed(other, text, end + 8)
            except Exception:  # any refusal is safe
                return
            assert all(o > other for o in got)

    @AUDIT
    @given(st.integers(0, 100), st.integers(1, 60), st.data())
    def test_end_check_rejects_beyond_end(self, committed: int, width: int, data: st.DataObject) -> None:
        end = committed + 1 + width
        done = data.draw(st.frozensets(st.integers(committed + 1, end + 30), min_size=1, max_size=20))
        assume(max(done) >= end)
        text = encode_completed(committed, done)
        # the map is well formed (our own encoding): the end check is the only reason to refuse it, and its
        # three forms (bitset, offsets, runs) all name the range end; any other exception is a bug
        with pytest.raises(CodecError, match=rf"beyond the range end {end}$"):
            decode_completed(committed, text, end)
