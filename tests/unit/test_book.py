"""Unit and property tests of the range book (fastrecover.book.RangeBook)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import fastrecover.book as book_module
from fastrecover.book import RangeBook
from fastrecover.codec import decode_mirror, encode_mirror, encode_mirror_full
from fastrecover.ranges import OffsetRange, RangeProgress
from fastrecover.tokens import Token, TopicPartitionKey

P0 = TopicPartitionKey("t", 0)
P1 = TopicPartitionKey("t", 1)


def tok(
    token_id: int,
    start: int,
    end: int,
    committed: int | None = None,
    *,
    key: TopicPartitionKey = P0,
    completed: frozenset[int] = frozenset(),
    skipped: int = 0,
    epoch: int = 1,
) -> Token:
    progress = RangeProgress(start, end, start if committed is None else committed, completed)
    return Token(token_id, "g", key.topic, key.partition, progress, skipped=skipped, owner="me", epoch=epoch)


def finished(p: RangeProgress) -> set[int]:
    return set(range(p.start, p.committed)) | set(p.completed)


def unfinished(p: RangeProgress) -> set[int]:
    return set(range(p.start, p.end)) - finished(p)


class TestHolding:
    def test_add(self) -> None:
        book = RangeBook()
        assert len(book) == 0
        assert not book.has_work
        held = book.add(tok(1, 70, 120, skipped=3))
        assert len(book) == 1
        assert book.has_work
        assert book.get(1) is held
        assert book.get(2) is None
        assert held.pending == held.stored == held.durable == RangeProgress(70, 120, 70)
        assert held.skipped == 3
        assert not held.dirty
        assert not held.parked
        assert book.keys() == [P0]
        assert book.held(P0) == [held]
        assert book.held() == [held]
        assert book.held(P1) == []
        assert book.spans(P0) == [(1, OffsetRange(70, 120))]
        assert book.spans(P1) == []

    def test_several_ranges_and_partitions(self) -> None:
        book = RangeBook()
        a = book.add(tok(1, 70, 120))
        b = book.add(tok(2, 140, 190))
        c = book.add(tok(3, 0, 10, key=P1))
        assert book.held(P0) == [a, b]
        assert book.held(P1) == [c]
        assert sorted(book.keys(), key=str) == [P0, P1]
        assert book.spans(P0) == [(1, OffsetRange(70, 120)), (2, OffsetRange(140, 190))]

    def test_adding_the_same_id_again_replaces_it(self) -> None:
        book = RangeBook()
        book.add(tok(1, 70, 120))
        newer = book.add(tok(1, 70, 120, committed=80, epoch=2))
        assert len(book) == 1
        assert book.held(P0) == [newer]
        assert book.spans(P0) == [(1, OffsetRange(70, 120))]
        book.remove(1)
        assert book.held(P0) == []
        assert book.spans(P0) == []
        assert book.keys() == []

    def test_remove(self) -> None:
        book = RangeBook()
        a = book.add(tok(1, 70, 120))
        book.add(tok(2, 140, 190))
        assert book.remove(1) is a
        assert book.remove(1) is None
        assert [h.token.id for h in book.held(P0)] == [2]
        book.remove(2)
        assert book.keys() == []
        assert not book.has_work

    def test_remove_partitions(self) -> None:
        book = RangeBook()
        book.add(tok(1, 70, 120))
        book.add(tok(2, 140, 190))
        book.add(tok(3, 0, 10, key=P1))
        book.park(P0, "g", RangeProgress(300, 400, 300))
        removed = book.remove_partitions(iter([P0, P0]))
        assert sorted(h.token.id for h in removed) == [-1, 1, 2]
        assert book.keys() == [P1]
        assert book.remove_partitions([TopicPartitionKey("x", 9)]) == []

    def test_unknown_ids_are_ignored(self) -> None:
        book = RangeBook()
        book.mark_done(9, [1])
        book.mark_stored(9, [1])
        book.commit_upto(9, 5)
        book.store_upto(9, 5)
        assert book.skip_to(9, 5) == 0
        book.settle(tok(9, 0, 10))
        assert len(book) == 0


class TestEarlyRanges:
    """Parked ranges the child reads before the store opens: progress in memory, then a store token's."""

    def test_an_early_range_is_read_and_routed_but_never_written_nor_mirrored_ahead(self) -> None:
        book = RangeBook()
        held = book.park(P0, "g", RangeProgress(70, 120, 70))
        book.park(P1, "g", RangeProgress(5, 9, 5))
        assert book.spans(P0) == []
        assert book.read_early(P0) == [held.token.id]
        assert held.early and held.readable and book.has_work and book.has_early
        assert book.spans(P0) == [(held.token.id, OffsetRange(70, 120))]
        assert book.routes() == {P0}
        assert [(w.token_id, w.next_offset, w.end) for w in book.works()] == [(held.token.id, 70, 120)]
        book.commit_upto(held.token.id, 90)
        assert held.pending.committed == 90
        assert book.dirty() == [], "the store has no token for it"
        assert book.early_dirty() == [held] and book.early_dirty([P1]) == []
        assert decode_mirror(book.mirror(P0)) == [RangeProgress(70, 120, 70)], "the mirror never claims more"

    def test_a_store_token_of_the_same_span_takes_over_progress_and_id(self) -> None:
        book = RangeBook()
        early = book.park(P0, "g", RangeProgress(70, 120, 70))
        book.read_early(P0)
        book.commit_upto(early.token.id, 90)
        book.mark_stored(early.token.id, [95])
        book.remove_partitions([P0])
        assert not book.has_early
        token = book.add(tok(7, 70, 120, 80))  # the store's own progress behind the early one
        assert book.take_over(early, 7)
        assert token.pending == RangeProgress(70, 120, 90)
        assert token.stored == RangeProgress(70, 120, 90, frozenset({95}))
        assert book.dirty() == [token]
        book.commit_upto(early.token.id, 100)  # a record handed out under the old id, settled now
        assert token.pending.committed == 100
        assert book.get(early.token.id) is token
        assert book.works()[0].token_id == 7

    def test_only_a_token_of_the_same_partition_and_span_takes_over(self) -> None:
        book = RangeBook()
        early = book.park(P0, "g", RangeProgress(70, 120, 70))
        book.read_early(P0)
        book.commit_upto(early.token.id, 90)
        book.remove_partitions([P0])
        smaller = book.add(tok(7, 70, 100))
        other = book.add(tok(8, 70, 120, key=P1))
        assert not book.take_over(early, 7)
        assert not book.take_over(early, 8)
        assert not book.take_over(early, 99)
        assert (smaller.pending.committed, other.pending.committed) == (70, 70), "nothing carried"
        book.commit_upto(early.token.id, 110)
        assert (smaller.pending.committed, other.pending.committed) == (70, 70), "no alias either"

    def test_an_alias_ends_with_its_token(self) -> None:
        book = RangeBook()
        early = book.park(P0, "g", RangeProgress(70, 120, 70))
        book.read_early(P0)
        book.remove_partitions([P0])
        book.add(tok(7, 70, 120))
        assert book.take_over(early, 7)
        book.remove_partitions([P0])
        later = book.add(tok(7, 70, 120))  # the same id claimed again later: no old alias reaches it
        book.commit_upto(early.token.id, 100)
        assert later.pending.committed == 70

    def test_reinstated_early_ranges_keep_id_progress_and_reading(self) -> None:
        book = RangeBook()
        early = book.park(P0, "g", RangeProgress(70, 120, 70))
        book.read_early(P0)
        book.commit_upto(early.token.id, 90)
        (removed,) = book.remove_partitions([P0])
        assert not book.has_early and book.spans(P0) == []
        book.reinstate([removed])
        assert book.get(early.token.id) is early and early.pending.committed == 90
        assert book.has_early and book.spans(P0) == [(early.token.id, OffsetRange(70, 120))]


class TestParking:
    def test_parked_ranges_only_keep_the_mirror_alive(self) -> None:
        book = RangeBook()
        progress = RangeProgress(70, 120, 90)
        held = book.park(P0, "g", progress)
        second = book.park(P0, "g", RangeProgress(140, 190, 140))
        assert held.parked
        assert held.token.id < 0
        assert second.token.id < 0
        assert second.token.id != held.token.id
        assert held.token.group == "g"
        assert held.token.key == P0
        assert not book.has_work
        assert book.spans(P0) == []
        assert book.works() == []
        held.pending = held.pending.mark_done([90])
        assert held.dirty
        assert book.dirty() == []  # never committed to the store
        assert book.open_durable(P0) == [progress, RangeProgress(140, 190, 140)]
        assert decode_mirror(book.mirror(P0)) == [progress, RangeProgress(140, 190, 140)]


class TestProgressViews:
    def test_mark_done_moves_pending_and_stored_not_durable(self) -> None:
        book = RangeBook()
        held = book.add(tok(1, 70, 120))
        book.mark_done(1, iter([71, 70]))
        assert held.pending.committed == 72
        assert held.stored.committed == 72
        assert held.durable.committed == 70
        assert held.dirty
        assert book.dirty() == [held]

    def test_stored_offsets_wait_for_an_offsetless_commit(self) -> None:
        book = RangeBook()
        held = book.add(tok(1, 70, 120))
        book.mark_stored(1, [70, 71])
        book.store_upto(1, 80)
        assert held.stored.committed == 80
        assert held.pending.committed == 70
        assert not held.dirty
        book.promote_stored([P0, P0])
        assert held.pending == held.stored
        assert held.dirty

    def test_promote_stored_all(self) -> None:
        book = RangeBook()
        a = book.add(tok(1, 70, 120))
        b = book.add(tok(2, 0, 10, key=P1))
        book.store_upto(1, 75)
        book.store_upto(2, 5)
        book.promote_stored()
        assert (a.pending.committed, b.pending.committed) == (75, 5)

    def test_commit_upto_moves_both(self) -> None:
        book = RangeBook()
        held = book.add(tok(1, 70, 120))
        book.commit_upto(1, 95)
        assert held.pending.committed == held.stored.committed == 95
        book.commit_upto(1, 80)  # never backwards
        assert held.pending.committed == 95

    def test_skip_to_counts_records_never_delivered(self) -> None:
        book = RangeBook()
        held = book.add(tok(1, 70, 120, skipped=2))
        book.mark_done(1, [75])
        assert book.skip_to(1, 80) == 9  # 70..79 but 75
        assert held.skipped == 11
        assert held.pending.committed == held.stored.committed == 80
        assert held.dirty
        assert book.skip_to(1, 50) == 0

    def test_skip_to_does_not_count_stored_records_as_lost(self) -> None:
        # stored records were delivered to and processed by the application: not lost
        book = RangeBook()
        held = book.add(tok(1, 70, 120))
        book.mark_stored(1, range(70, 78))
        assert book.skip_to(1, 80) == 2
        assert held.skipped == 2
        assert held.pending.committed == 80

    def test_dirty_by_keys_lists_each_range_once(self) -> None:
        book = RangeBook()
        a = book.add(tok(1, 70, 120))
        b = book.add(tok(2, 140, 190))
        c = book.add(tok(3, 0, 10, key=P1))
        for token_id in (1, 2, 3):
            book.commit_upto(token_id, 1_000)
        assert book.dirty([P0, P0]) == [a, b]
        assert book.dirty([P1]) == [c]
        assert book.dirty([]) == []
        assert book.dirty() == [a, b, c]

    def test_skipped_alone_makes_dirty(self) -> None:
        book = RangeBook()
        held = book.add(tok(1, 70, 120))
        held.skipped += 1
        assert held.dirty


class TestSettle:
    def test_settle_makes_pending_durable(self) -> None:
        book = RangeBook()
        held = book.add(tok(1, 70, 120))
        book.mark_done(1, [70, 71, 80])
        book.mark_stored(1, [72])
        accepted = held.token.with_progress(held.pending, held.skipped)
        book.settle(accepted)
        assert held.durable == held.pending == RangeProgress(70, 120, 72, frozenset({80}))
        assert not held.dirty
        assert book.dirty() == []
        assert finished(held.stored) == set(range(70, 73)) | {80}

    def test_settle_of_a_done_token_drops_it(self) -> None:
        book = RangeBook()
        held = book.add(tok(1, 70, 120))
        book.commit_upto(1, 120)
        book.settle(held.token.with_progress(held.pending))
        assert book.get(1) is None
        assert book.keys() == []
        assert book.works() == []
        assert book.mirror(P0) == ""

    def test_settle_adopts_a_store_merged_token(self) -> None:
        book = RangeBook()
        held = book.add(tok(1, 70, 120))
        book.mark_done(1, [70])
        # the store merged a stale commit of another view and knows more
        book.settle(held.token.with_progress(RangeProgress(70, 120, 90, frozenset({95})), skipped=4))
        assert held.pending == RangeProgress(70, 120, 90, frozenset({95}))
        assert held.stored.committed == 90
        assert held.skipped == 4
        assert not held.dirty


class TestMirrorAndWorks:
    def test_mirror_is_built_from_durable_progress_and_cached(self, monkeypatch: pytest.MonkeyPatch) -> None:
        calls: list[int] = []
        real = encode_mirror_full

        def counting(ranges: list[RangeProgress], **kwargs: Any) -> tuple[str, bool]:
            calls.append(len(ranges))
            return real(ranges, **kwargs)

        monkeypatch.setattr(book_module, "encode_mirror_full", counting)
        book = RangeBook()
        held = book.add(tok(1, 70, 120))
        first = book.mirror(P0)
        assert decode_mirror(first) == [RangeProgress(70, 120, 70)]
        book.mark_done(1, range(70, 100))  # pending only: the mirror must not claim it
        assert book.mirror(P0) == first
        assert len(calls) == 1  # cached
        book.settle(held.token.with_progress(held.pending))
        assert decode_mirror(book.mirror(P0)) == [RangeProgress(70, 120, 100)]
        assert len(calls) == 2
        book.add(tok(2, 140, 190))
        assert len(decode_mirror(book.mirror(P0))) == 2
        book.remove(2)
        assert decode_mirror(book.mirror(P0)) == [RangeProgress(70, 120, 100)]
        assert book.mirror(P1) == ""

    def test_works_resume_from_stored(self) -> None:
        book = RangeBook()
        book.add(tok(1, 70, 120, committed=80, completed=frozenset({85})))
        book.add(tok(2, 0, 10, key=P1))
        book.park(P0, "g", RangeProgress(200, 300, 200))
        book.mark_stored(1, [86])
        book.commit_upto(2, 10)  # finished, not yet settled
        works = book.works()
        assert len(works) == 1
        w = works[0]
        assert (w.token_id, w.key, w.next_offset, w.end, w.skip) == (1, P0, 80, 120, frozenset({85, 86}))


# ---- stateful model --------------------------------------------------------------------------------


class BookMachine(RuleBasedStateMachine):
    """Random operations on one partition's ranges: the views stay ordered and the mirror safe."""

    SPANS = ((0, 30), (40, 60), (70, 71), (100, 140))

    def __init__(self) -> None:
        super().__init__()
        self.book = RangeBook()
        self.settled_done: set[int] = set()

    def _ids(self) -> list[int]:
        return [h.token.id for h in self.book.held() if not h.parked]

    @rule(index=st.integers(0, len(SPANS) - 1))
    def add(self, index: int) -> None:
        token_id = index + 1
        if self.book.get(token_id) is None and token_id not in self.settled_done:
            start, end = self.SPANS[index]
            self.book.add(tok(token_id, start, end))

    @precondition(lambda self: bool(self._ids()))
    @rule(data=st.data(), offsets=st.lists(st.integers(0, 145), max_size=6))
    def mark_done(self, data: st.DataObject, offsets: list[int]) -> None:
        self.book.mark_done(data.draw(st.sampled_from(self._ids())), offsets)

    @precondition(lambda self: bool(self._ids()))
    @rule(data=st.data(), offsets=st.lists(st.integers(0, 145), max_size=6))
    def mark_stored(self, data: st.DataObject, offsets: list[int]) -> None:
        self.book.mark_stored(data.draw(st.sampled_from(self._ids())), offsets)

    @precondition(lambda self: bool(self._ids()))
    @rule(data=st.data(), upto=st.integers(0, 145), stored_only=st.booleans())
    def commit(self, data: st.DataObject, upto: int, stored_only: bool) -> None:
        token_id = data.draw(st.sampled_from(self._ids()))
        if stored_only:
            self.book.store_upto(token_id, upto)
        else:
            self.book.commit_upto(token_id, upto)

    @precondition(lambda self: bool(self._ids()))
    @rule(data=st.data(), low=st.integers(0, 145))
    def skip(self, data: st.DataObject, low: int) -> None:
        token_id = data.draw(st.sampled_from(self._ids()))
        held = self.book.get(token_id)
        assert held is not None
        before = held.skipped
        never_delivered = {o for o in unfinished(held.stored) if o < low}
        assert self.book.skip_to(token_id, low) == len(never_delivered)
        assert held.skipped == before + len(never_delivered)

    @rule()
    def promote(self) -> None:
        self.book.promote_stored()

    @rule()
    def commit_to_store(self) -> None:
        """What the consumer does: write every dirty range, settle what the store returns."""
        for held in self.book.dirty():
            accepted = held.token.with_progress(held.pending, held.skipped)
            self.book.settle(accepted)
            if accepted.progress.done:
                self.settled_done.add(accepted.id)
                assert self.book.get(accepted.id) is None
            else:
                assert not held.dirty

    @invariant()
    def views_are_ordered(self) -> None:
        for held in self.book.held():
            durable, pending, stored = finished(held.durable), finished(held.pending), finished(held.stored)
            assert durable <= pending <= stored
            assert held.pending.span == held.stored.span == held.durable.span

    @invariant()
    def mirror_never_claims_more_than_the_store(self) -> None:
        decoded = decode_mirror(self.book.mirror(P0))
        redelivered = {o for r in decoded for o in unfinished(r)}
        for held in self.book.held(P0):
            assert unfinished(held.durable) <= redelivered
        fresh = encode_mirror(self.book.open_durable(P0))
        assert decode_mirror(fresh) == decoded  # the cache is never stale

    @invariant()
    def works_cover_what_is_not_stored(self) -> None:
        works = {w.token_id: w for w in self.book.works()}
        for held in self.book.held():
            if held.parked or held.stored.done:
                assert held.token.id not in works
                continue
            w = works[held.token.id]
            to_read = set(range(w.next_offset, w.end)) - set(w.skip)
            assert to_read == unfinished(held.stored)

    @invariant()
    def index_is_consistent(self) -> None:
        ids = [h.token.id for h in self.book.held(P0)]
        assert len(ids) == len(set(ids)) == len(self.book)
        assert [i for i, _ in self.book.spans(P0)] == ids


TestBookMachine = BookMachine.TestCase
TestBookMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_a_mirror_that_must_drop_maps_or_merge_ranges_is_counted() -> None:
    """metrics().mirror_degradations: the mirror said less than the book (issue 14)."""
    from fastrecover.codec import MIRROR_MAX_ROWS

    book = RangeBook("g")
    book.add(tok(1, 0, 100))
    assert book.mirror(P0) and book.mirror_degradations == 0  # one range fits whole
    for i in range(2, MIRROR_MAX_ROWS + 3):
        book.add(tok(i, i * 1000, i * 1000 + 100))
    assert book.mirror(P0) and book.mirror_degradations == 1  # too many rows: neighbours merged
    assert book.mirror(P0) and book.mirror_degradations == 1  # cached: counted once per change
