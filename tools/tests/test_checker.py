"""The chaos checker: pure analysis of produced records, the ledger and the range tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastrecover.ranges import RangeProgress
from fastrecover.tokens import Token, TokenState
from fastrecover.values import replace
from fastrecover_tools.chaos.checker import (
    Incarnation,
    LedgerEntry,
    OperatorLog,
    Produced,
    Recreated,
    Reread,
    Skipped,
    Stats,
    StoreRestored,
    analyze,
    parse_ledger_line,
    parse_produced_line,
    read_ledgers,
)


def produced(n: int, topic: str = "t", partition: int = 0, t0: int = 1000) -> list[Produced]:
    return [Produced(topic, partition, o, o, t0 + o) for o in range(n)]


def done(
    offsets: range | list[int],
    inc: str = "m1#1",
    at: int = 5000,
    topic: str = "t",
    partition: int = 0,
    token: int | None = None,
    epoch: int | None = None,
    t0: int = 1000,
) -> list[LedgerEntry]:
    return [LedgerEntry(topic, partition, o, at + i, t0 + o, inc, token, epoch) for i, o in enumerate(offsets)]


def token(
    tid: int,
    start: int,
    end: int,
    *,
    epoch: int = 1,
    skipped: int = 0,
    open_: bool = False,
    topic: str = "t",
    partition: int = 0,
) -> Token:
    progress = RangeProgress(start, end, start if open_ else end, frozenset())
    return Token(
        tid,
        "g",
        topic,
        partition,
        progress,
        skipped=skipped,
        owner="o",
        epoch=epoch,
        state=TokenState.OPEN if open_ else TokenState.DONE,
    )


def test_everything_finished_once_passes() -> None:
    v = analyze(produced(10), done(range(10)))
    assert (v.produced, v.finished_unique, v.lost, v.duplicates) == (10, 10, 0, 0)
    assert v.ok, v.failures


def test_a_missing_record_is_lost_and_named() -> None:
    v = analyze(produced(10), done([0, 1, 2, 4, 5, 6, 7, 8, 9]))
    assert v.lost == 1
    assert v.lost_sample == [("t", 0, 3)]
    assert not v.ok
    assert "1 records lost" in v.failures[0]


def test_duplicates_are_counted_not_failed() -> None:
    v = analyze(produced(4), done(range(4)) + done([1, 2], inc="m1#2", at=9000))
    assert v.duplicates == 2
    assert v.duplicate_rate == pytest.approx(0.5)
    assert v.ok


def test_wait_uses_the_first_time_a_record_was_finished() -> None:
    entries = done([0], at=1500) + done([0], inc="m1#2", at=9000)
    v = analyze(produced(1), entries)
    assert v.wait_ms.max == 500


def test_nothing_produced_is_a_failure() -> None:
    assert not analyze([], []).ok


def test_records_finished_that_were_never_acknowledged_are_reported() -> None:
    v = analyze(produced(2), done(range(3)))
    assert v.foreign_records == 1


def test_retention_deletion_counted_on_the_token_is_accounted() -> None:
    # records 0..9 produced, a range [2, 8) of which retention deleted 2..5 before anyone finished them
    v = analyze(
        produced(10), done([0, 1, 6, 7, 8, 9]), tokens=[token(1, 2, 8, skipped=4)], low_watermarks={("t", 0): 6}
    )
    assert v.lost == 0
    assert (v.retention_deleted_unfinished, v.skipped_recorded, v.unaccounted) == (4, 4, 0)
    assert v.ok, v.failures


def test_retention_deletion_not_counted_fails_the_verdict() -> None:
    v = analyze(
        produced(10), done([0, 1, 6, 7, 8, 9]), tokens=[token(1, 2, 8, skipped=1)], low_watermarks={("t", 0): 6}
    )
    assert v.unaccounted == 3
    assert not v.ok
    assert "retention" in v.failures[0]


def test_retention_deletion_outside_any_range_is_unaccounted() -> None:
    v = analyze(produced(10), done(range(4, 10)), low_watermarks={("t", 0): 4})
    assert v.unaccounted == 4
    assert not v.ok


def test_missing_record_still_in_the_topic_is_lost_missing_from_it_is_broker_loss() -> None:
    present = {("t", 0, o) for o in range(10) if o != 7}
    v = analyze(produced(10), done([0, 1, 2, 3, 4, 5, 6, 8]), present=present)
    assert v.lost == 2
    assert v.topic_missing == 1


def test_open_range_at_the_end_fails_unless_not_required() -> None:
    tokens = [token(1, 0, 5), token(2, 5, 10, open_=True)]
    v = analyze(produced(10), done(range(10)), tokens=tokens)
    assert (v.ranges_opened, v.ranges_finished, v.ranges_open) == (2, 1, 1)
    assert not v.ok
    assert analyze(produced(10), done(range(10)), tokens=tokens, require_ranges_finished=False).ok


def test_range_claims_and_handovers() -> None:
    tokens = [token(1, 0, 5, epoch=3), token(2, 5, 10, epoch=1)]
    entries = (
        done([0, 1], inc="m1#1", at=100, token=1, epoch=1)
        + done([2, 3, 4], inc="m2#1", at=200, token=1, epoch=3)
        + done(range(5, 10), inc="m1#1", at=300, token=2, epoch=1)
    )
    v = analyze(produced(10), entries, tokens=tokens)
    assert v.range_claims == 2
    assert v.ranges_handed_over == 1
    assert v.backfilled_records == 10
    assert v.ok, v.failures


def test_one_epoch_held_by_two_incarnations_is_a_fencing_failure() -> None:
    entries = done([0, 1], inc="m1#1", at=100, token=1, epoch=2) + done([2, 3], inc="m2#1", at=200, token=1, epoch=2)
    v = analyze(produced(4), entries, tokens=[token(1, 0, 4, epoch=2)])
    assert v.epoch_conflicts == 1
    assert not v.ok
    assert "epoch 2" in v.fencing_sample[0]


def test_two_incarnations_backfilling_at_once_is_a_fencing_failure() -> None:
    # m1#1 backfills at t=100..103, m2#1 starts at t=101: overlapping windows
    entries = done([0, 1, 2, 3], inc="m1#1", at=100, token=1, epoch=1) + done(
        [2, 3], inc="m2#1", at=101, token=1, epoch=2
    )
    v = analyze(produced(4), entries, tokens=[token(1, 0, 4, epoch=2)])
    assert v.concurrent_backfills == 1
    assert not v.ok


def test_successive_holders_are_not_concurrent() -> None:
    entries = done([0, 1], inc="m1#1", at=100, token=1, epoch=1) + done([1, 2, 3], inc="m1#2", at=500, token=1, epoch=2)
    v = analyze(produced(4), entries, tokens=[token(1, 0, 4, epoch=2)])
    assert v.concurrent_backfills == 0 and v.epoch_conflicts == 0
    assert v.duplicates == 1


def test_time_to_fresh_per_incarnation() -> None:
    # m1#1 started at 0 and first finished a record at t=1000; m1#2 started at t=2000: records are produced
    # at 1000+o, so the first it finished produced >= 2000 is o=1000, at 2600 (o=900 at 2100 is not fresh)
    incs = [
        Incarnation("m1#1", 0, 1900, "killed"),
        Incarnation("m1#2", 2000, None, "stopped"),
        Incarnation("m1#3", 9000, 9100, "killed"),
    ]
    entries = done([1000, 1001], inc="m1#2", at=2600) + done([900], inc="m1#2", at=2100)
    v = analyze(produced(1002), done(range(1000), inc="m1#1", at=1000) + entries, incarnations=incs)
    assert v.time_to_fresh_ms.count == 2
    assert (v.time_to_fresh_ms.p50, v.time_to_fresh_ms.max) == (600, 1000)
    assert v.time_to_fresh_each == [("m1#1", 1000), ("m1#2", 600)]
    assert v.never_fresh == 1
    assert v.kills == 2
    assert v.incarnations == 3


def test_several_partitions_are_independent() -> None:
    p = produced(3, partition=0) + produced(3, partition=1)
    v = analyze(p, done(range(3), partition=0) + done([0, 2], partition=1))
    assert v.lost_sample == [("t", 1, 1)]


def test_stats_percentiles() -> None:
    s = Stats.of(float(x) for x in range(1, 101))
    assert (s.count, s.p50, s.p95, s.p99, s.max) == (100, 50.0, 95.0, 99.0, 100.0)
    assert Stats.of([]).count == 0 and Stats.of([]).max is None


def test_ledger_and_producer_lines_parse_and_reject_garbage() -> None:
    assert parse_ledger_line("t 0 5 100 90 m1#1 - -") == LedgerEntry("t", 0, 5, 100, 90, "m1#1")
    assert parse_ledger_line("t 0 5 100 90 m1#1 7 2") == LedgerEntry("t", 0, 5, 100, 90, "m1#1", 7, 2)
    assert parse_ledger_line("t 0 5 10") is None
    assert parse_ledger_line("t 0 x 100 90 m1#1 - -") is None
    assert parse_produced_line("t 1 2 3 4") == Produced("t", 1, 2, 3, 4)
    assert parse_produced_line("t 1 2") is None


def test_a_line_cut_by_sigkill_is_counted_as_malformed(tmp_path: Path) -> None:
    a = tmp_path / "a.ledger"
    a.write_text("t 0 0 100 90 m1#1 - -\nt 0 1 101 91 m1#1 - -\nt 0 2 10", encoding="utf-8")
    b = tmp_path / "b.ledger"
    b.write_text("t 0 2 200 92 m1#2 - -\n", encoding="utf-8")
    entries, bad = read_ledgers([a, b])
    assert [e.offset for e in entries] == [0, 1, 2]
    assert bad == 1


def test_a_range_finished_by_a_member_without_its_partition_is_a_failure() -> None:
    t1 = token(1, 0, 2)
    t2 = token(2, 2, 4, partition=0)
    t1 = Token(1, "g", "t", 0, t1.progress, owner="h:10:a", epoch=1, state=TokenState.DONE)
    t2 = Token(2, "g", "t", 0, t2.progress, owner="h:11:b", epoch=1, state=TokenState.DONE)
    owners = {"h:10:a": "m1#1", "h:11:b": "m2#1"}
    assigned = {"m1#1": {("t", 0)}, "m2#1": {("t", 1)}}
    v = analyze(produced(4), done(range(4)), tokens=[t1, t2], owners=owners, assigned=assigned)
    assert v.finished_by_non_owner == 1
    assert "range #2" in v.fencing_sample[0]
    assert not v.ok
    assigned["m2#1"].add(("t", 0))
    assert analyze(produced(4), done(range(4)), tokens=[t1, t2], owners=owners, assigned=assigned).ok


# ---- operator actions ---------------------------------------------------------------------------


def test_a_reset_back_obliges_every_record_after_it_to_be_finished_again() -> None:
    first = done(range(100), at=5000)
    ops = OperatorLog([Reread("t", 0, 40, 100, at_ms=6000)])
    v = analyze(produced(100), first, operator=ops)
    assert v.not_reread == 60 and v.not_reread_sample[0] == ("t", 0, 40)
    assert not v.ok and "not delivered again" in v.failures[0]
    again = done(range(40, 100), at=7000, inc="m1#2")
    assert analyze(produced(100), first + again, operator=ops).ok


def test_a_later_reset_forward_excuses_what_a_reset_back_owed() -> None:
    ops = OperatorLog([Reread("t", 0, 0, 100, at_ms=6000), Skipped("t", 0, 50, 100, at_ms=6500)])
    again = done(range(50), at=7000, inc="m1#2")
    v = analyze(produced(100), done(range(100), at=5000) + again, operator=ops)
    assert v.not_reread == 0 and v.ok


def test_a_reset_forward_excuses_the_records_of_its_span_in_its_generation_only() -> None:
    # records 5..9 were written after the operator read the clock, before the group was moved past them
    ops = OperatorLog([Skipped("t", 0, 0, 10, at_ms=1005)])
    v = analyze(produced(20), done(range(10, 20)), operator=ops)
    assert v.operator_skipped == 10 and v.lost == 0
    # the topic re-created later: offsets 0..9 of the new generation are owed like any others
    ops = OperatorLog([Skipped("t", 0, 0, 10, at_ms=1005), Recreated("t", at_ms=2000)])
    v = analyze(produced(20) + produced(10, t0=3000), done(range(10, 20)), operator=ops)
    assert v.deleted_with_topic == 10, "the old generation's records went with it, skipped or not"
    assert v.lost == 10 and {k[0] for k in v.lost_sample} == {"t~1"}


def test_a_re_created_topics_offsets_are_a_new_generation() -> None:
    old = produced(100, t0=1000)  # written at 1000..1099
    new = produced(50, t0=3000)  # the same offsets again, after the topic was re-created at 2000
    ops = OperatorLog([Recreated("t", at_ms=2000)])
    ledger = done(range(50), t0=1000) + done(range(50), t0=3000, at=6000)
    v = analyze(old + new, ledger, operator=ops)
    assert v.ok, v.failures
    assert v.deleted_with_topic == 50, "the old generation's unfinished records went with it"
    # offset 10 of the new generation unfinished: the old generation's offset 10 does not stand in for it
    gap = [e for e in ledger if not (e.produced_ms >= 3000 and e.offset == 10)]
    v = analyze(old + new, gap, operator=ops, present=[("t", 0, o) for o in range(50)])
    assert v.lost == 1 and v.lost_sample == [("t~1", 0, 10)] and v.topic_missing == 0


def test_epochs_start_over_with_a_store_restored_from_a_backup() -> None:
    entries = done([0, 1], inc="m1#1", at=100, token=1, epoch=2) + done([2, 3], inc="m2#1", at=300, token=1, epoch=2)
    tokens = [token(1, 0, 4, epoch=2)]
    assert analyze(produced(4), entries, tokens=tokens).epoch_conflicts == 1
    v = analyze(produced(4), entries, tokens=tokens, operator=OperatorLog([StoreRestored(200)]))
    assert v.epoch_conflicts == 0 and v.ok, v.failures


def test_a_superseded_range_accounts_for_no_retention_deletion() -> None:
    retired = replace(token(1, 0, 10, skipped=3), state=TokenState.SUPERSEDED)
    v = analyze(produced(10), done(range(3, 10)), tokens=[retired], low_watermarks={("t", 0): 3})
    assert v.unaccounted == 3 and not v.ok
