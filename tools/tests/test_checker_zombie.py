"""The checker tells a thawed zombie's buffered deliveries from a second owner's backfill (pure logic)."""

from __future__ import annotations

from fastrecover_tools.chaos.checker import LedgerEntry, Produced, analyze


def _entry(offset: int, done_ms: int, inc: str, epoch: int) -> LedgerEntry:
    return LedgerEntry("t", 0, offset, done_ms, 0, inc, 7, epoch)


def test_a_zombie_delivering_its_old_epoch_after_a_thaw_is_no_second_owner() -> None:
    produced = [Produced("t", 0, o, o, 0) for o in range(6)]
    ledger = [
        _entry(0, 1000, "m1#1", 1),  # m1 backfills range #7 at epoch 1, then is frozen at 1500
        _entry(1, 1100, "m1#1", 1),
        _entry(2, 2000, "m2#1", 2),  # m2 took the range over (epoch 2) while m1 was stopped
        _entry(3, 2100, "m2#1", 2),
        _entry(4, 2150, "m1#1", 1),  # m1, let go on at 2100, hands out what it had buffered
        _entry(5, 2400, "m2#1", 2),
    ]
    plain = analyze(produced, ledger)
    assert plain.concurrent_backfills == 1, "without the freezes the overlap is a second owner's"
    v = analyze(produced, ledger, frozen={"m1#1": [(1500, 2100)]})
    assert v.concurrent_backfills == 0 and v.zombie_deliveries == 1 and v.epoch_conflicts == 0
    assert v.lost == 0


def test_after_a_thaw_a_newly_claimed_epoch_is_counted_as_any_owner_s() -> None:
    produced = [Produced("t", 0, o, o, 0) for o in range(4)]
    ledger = [
        _entry(0, 1000, "m1#1", 1),
        _entry(1, 2200, "m1#1", 3),  # m1 claimed the range again after its thaw: its own, at a new epoch
        _entry(2, 2250, "m2#1", 3),  # and m2 delivering at that same epoch is a conflict
        _entry(3, 2300, "m1#1", 3),
    ]
    v = analyze(produced, ledger, frozen={"m1#1": [(1500, 2100)]})
    assert v.zombie_deliveries == 0 and v.epoch_conflicts == 1


def test_a_zombie_s_first_records_of_a_range_after_its_thaw_are_duplicates_too() -> None:
    """It claimed the range before the freeze but delivered none of it then: its epoch is superseded all the same."""
    produced = [Produced("t", 0, o, o, 0) for o in range(4)]
    ledger = [
        _entry(0, 2000, "m2#1", 2),  # m2 took the range over while m1 was stopped
        _entry(1, 2100, "m1#1", 1),  # m1, let go on at 2050, hands out its buffered records at epoch 1
        _entry(2, 2200, "m2#1", 2),
        _entry(3, 2300, "m2#1", 2),
    ]
    assert analyze(produced, ledger).concurrent_backfills == 1
    v = analyze(produced, ledger, frozen={"m1#1": [(1500, 2050)]})
    assert v.concurrent_backfills == 0 and v.zombie_deliveries == 1 and v.ok


def test_an_incarnation_claiming_a_range_again_after_another_is_no_concurrent_backfill() -> None:
    """Its windows are two claims: epoch 1 before the other's epoch 2, epoch 3 after it (chaos seed 2424)."""
    produced = [Produced("t", 0, o, o, 0) for o in range(6)]
    ledger = [
        _entry(0, 1000, "m1#1", 1),  # m1 backfills range #7 at epoch 1, then stops reading it (frozen, let go on)
        _entry(1, 1100, "m1#1", 1),
        _entry(2, 2000, "m2#1", 2),  # m2 got the partition and claimed the range (epoch 2)
        _entry(3, 2100, "m2#1", 2),
        _entry(4, 3000, "m1#1", 3),  # the partition came back to m1: it claimed the range anew (epoch 3)
        _entry(5, 3100, "m1#1", 3),
    ]
    v = analyze(produced, ledger)
    assert v.concurrent_backfills == 0 and v.epoch_conflicts == 0 and v.ok, v.fencing_sample


def test_two_claims_delivering_at_the_same_time_are_still_a_concurrent_backfill() -> None:
    produced = [Produced("t", 0, o, o, 0) for o in range(4)]
    ledger = [
        _entry(0, 1000, "m1#1", 1),
        _entry(1, 2000, "m2#1", 2),  # m2 claimed epoch 2 while m1 (not frozen) went on with epoch 1
        _entry(2, 2500, "m1#1", 1),
        _entry(3, 2600, "m2#1", 2),
    ]
    v = analyze(produced, ledger)
    assert v.concurrent_backfills == 1 and not v.ok


def test_a_short_later_claim_does_not_hide_another_incarnation_s_overlap() -> None:
    produced = [Produced("t", 0, o, o, 0) for o in range(5)]
    ledger = [
        _entry(0, 1000, "m1#1", 1),  # m1 delivers at epoch 1 from 1000 ...
        _entry(1, 1200, "m1#1", 3),  # ... a claim of its own at epoch 3, briefly
        _entry(2, 1500, "m2#1", 2),  # m2 at epoch 2 while m1's epoch-1 window is still open
        _entry(3, 1600, "m2#1", 2),
        _entry(4, 2000, "m1#1", 1),  # m1 (not frozen) still at epoch 1
    ]
    v = analyze(produced, ledger)
    assert v.concurrent_backfills == 1, v.fencing_sample
