"""The recovery's writes meeting a range of another lineage at the start of one of its own (real SQLite).

The store keeps one live range per (partition, start).  A range a recovery writes (restored from
the commit-metadata mirror, or new) can start exactly where a range of another lineage starts: one
the committed offset does not vouch for, kept by the plan only because it lies below that offset
(a topic re-created, an offset reset back).  Taking that range in place of the one asked for
silently skipped the rest of the span, and its done offsets excused records that were never read
in this lineage: in a chaos campaign, 643 records lost after a re-created topic and a reset to the
earliest offset.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastrecover.book import RangeBook
from fastrecover.codec import new_lineage
from fastrecover.ranges import OffsetRange, RangeProgress
from fastrecover.recovery import Trust, plan_partition
from fastrecover.recovery_reads import PartitionInputs
from fastrecover.recovery_writes import Recovered, RecoveryWriter
from fastrecover.store import RangeStore, open_store
from fastrecover.store.updates import ProgressUpdate
from fastrecover.tokens import TopicPartitionKey

GROUP, OWNER = "g", "me"
KEY = TopicPartitionKey("t", 2)


def _finish(store: RangeStore, token_id: int, owner: str) -> None:
    token = store.claim(token_id, owner)
    done = RangeProgress.fresh(token.span.start, token.span.end).mark_done(range(token.span.start, token.span.end))
    store.commit_one(ProgressUpdate(token.id, owner, token.epoch, done))


def _recover(tmp_path: Path, old_done: bool) -> tuple[list[tuple[OffsetRange, str, str | None]], list[OffsetRange]]:
    """The campaign's partition: an old range [0, 340) of lineage A below the committed offset 3434,
    whose marker (lineage B) mirrors [0, 3418); returns the store's rows and the book's held spans."""
    cluster = "c"
    a, b = new_lineage(cluster, os.urandom(8)), new_lineage(cluster, os.urandom(8))
    with open_store(f"sqlite:///{tmp_path / 'ranges.db'}") as store:
        old = store.create_range(GROUP, KEY.topic, KEY.partition, 0, 340, "gone", a)
        if old_done:
            _finish(store, old.id, "gone")
        tokens = store.partition_ranges(GROUP, KEY.topic, KEY.partition)
        trust = Trust(lineage=b)
        mirrored = [RangeProgress.fresh(0, 3418)]
        plan = plan_partition(
            committed=3434, log_end=3472, min_offsets=20, store_tokens=tokens, mirrored=mirrored, trust=trust
        )
        assert [t.id for t in plan.kept] == [old.id], "the old range lies below the committed offset: kept"
        book = RangeBook(GROUP)
        writer = RecoveryWriter(None, book, GROUP, OWNER)  # type: ignore[arg-type]
        inputs = {KEY: PartitionInputs(3434, 3472, mirrored, trust, b)}
        starts = writer.execute(store, {KEY: plan}, inputs, Recovered([], [], [], {}))
        assert starts[KEY] == 3472, "written: the primary skips to the log end"
        rows = [(t.span, t.state.value, t.lineage) for t in store.ranges(GROUP)]
        held = sorted((h.token.span for h in book.held(KEY)), key=lambda r: r.start)
        return sorted(rows, key=lambda r: (r[0].start, r[1])), held


def test_a_done_range_of_another_lineage_at_a_restored_start_is_retired_not_taken(tmp_path: Path) -> None:
    rows, held = _recover(tmp_path, old_done=True)
    assert held == [OffsetRange(0, 3418), OffsetRange(3434, 3472)], "every offset below the log end is owed"
    assert (OffsetRange(0, 340), "superseded") in [(r[0], r[1]) for r in rows]
    assert [r[0] for r in rows if r[1] == "open"] == [OffsetRange(0, 3418), OffsetRange(3434, 3472)]


def test_an_open_range_of_another_lineage_there_is_retired_and_what_it_owed_beyond_is_carried(tmp_path: Path) -> None:
    rows, held = _recover(tmp_path, old_done=False)
    # [0, 340) owed nothing outside [0, 3418): nothing to carry, and it is read once, in the restored range
    assert held == [OffsetRange(0, 3418), OffsetRange(3434, 3472)]
    assert [r[1] for r in rows if r[0] == OffsetRange(0, 340)] == ["superseded"]


def test_a_recovery_adopts_the_ranges_it_keeps_into_its_own_lineage(tmp_path: Path) -> None:
    """Kept ranges of the vouched lineage, done or open, on every partition, take the recovery's new lineage.

    So a marker committed before this recovery (one a Kafka snapshot restore brings back) vouches for
    none of them, nor for the range the recovery writes.
    """
    cluster = "c"
    vouched, fresh = new_lineage(cluster, os.urandom(8)), new_lineage(cluster, os.urandom(8))
    other = TopicPartitionKey("t", 3)
    with open_store(f"sqlite:///{tmp_path / 'ranges.db'}") as store:
        done = store.create_range(GROUP, KEY.topic, KEY.partition, 100, 200, "gone", vouched)
        _finish(store, done.id, "gone")
        store.create_range(GROUP, other.topic, other.partition, 100, 200, "gone", vouched)
        plans, inputs = {}, {}
        for key in (KEY, other):
            tokens = store.partition_ranges(GROUP, key.topic, key.partition)
            plans[key] = plan_partition(
                committed=100, log_end=500, min_offsets=20, store_tokens=tokens, trust=Trust(lineage=vouched)
            )
            assert [t.id for t in plans[key].kept] == [t.id for t in tokens], "the marker vouches for it: kept"
            inputs[key] = PartitionInputs(100, 500, [], Trust(lineage=vouched), fresh)
        writer = RecoveryWriter(None, RangeBook(GROUP), GROUP, OWNER)  # type: ignore[arg-type]
        starts = writer.execute(store, plans, inputs, Recovered([], [], [], {}))
        assert starts == {KEY: 500, other: 500}
        rows = {(t.topic, t.partition, t.span.start): (t.state.value, t.lineage) for t in store.ranges(GROUP)}
    assert rows == {
        (KEY.topic, KEY.partition, 100): ("done", fresh),
        (KEY.topic, KEY.partition, 200): ("open", fresh),
        (other.topic, other.partition, 100): ("open", fresh),
        (other.topic, other.partition, 200): ("open", fresh),
    }
