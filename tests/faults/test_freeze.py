"""Grey failures: a member that freezes instead of dying, and comes back as a zombie.

A process paused by its machine, a long garbage collection or a network that stops passing bytes
all look the same to the group: the member stops heartbeating, its session expires, its partitions
(and their ranges) move to the others, and then it runs on from where it stopped, still believing
it holds them.  Its primary, its child and its writes to the store must then do no harm: nothing
lost, no range epoch held by two incarnations, its late range writes fenced.  What it hands out
from its buffers before it learns is a duplicate (the checker counts those as ``zombie_deliveries``).
"""

from __future__ import annotations

import time

import pytest

from fastrecover_tools.chaos.checker import ranges_handed_over, read_ledgers
from fastrecover_tools.chaos.driver import ChaosDriver
from tests.faults.conftest import DriverFactory, cycles, verdict_ok, wait_or_report

pytestmark = pytest.mark.faults

SESSION_MS = 3000
#: per record: a range of a few thousand records stays open for seconds, long enough to freeze its owner in it
WORK_US = 1500


def _freeze_an_owner_mid_range(driver: ChaosDriver) -> None:
    """The scripted first act: m2 is frozen while it backfills a range, past its session; m1 takes the
    range over (a new epoch), and m2 is let go on as a zombie.

    m1 commits every record, then dies and stays down: its partitions go to m2 with the lag of its
    downtime, and m2 opens ranges on them.  At m2's first backfilled record it is frozen for its
    session and then some; m1 comes back meanwhile and, once m2's session is over, is given every
    partition and claims m2's open ranges.
    """
    driver.spawn(0, faults=False, extra=["--commit", "message"])
    owner = driver.spawn(1, faults=False)
    wait_or_report(driver, lambda: all(driver.finished_by(i, 0) > 0 for i in range(2)), 90, 0.1, "both to read")
    settled_ms = int(time.time() * 1000)
    wait_or_report(driver, lambda: driver.finished_by(0, settled_ms) >= 100, 90, 0.1, "m1 to commit")
    driver.kill(0)
    ledger = owner.ledger

    def backfilling() -> bool:
        entries, _ = read_ledgers([ledger]) if ledger.exists() else ([], 0)
        return any(e.token is not None for e in entries)

    wait_or_report(driver, backfilling, 90, 0.05, "m2 to backfill m1's lagging partitions")
    driver.freeze(1, SESSION_MS / 1000 + 5.0)
    driver.spawn(0, faults=False)
    ledgers = driver.workdir / "ledger"
    wait_or_report(
        driver,
        lambda: ranges_handed_over(read_ledgers(sorted(ledgers.glob("*.ledger")))[0]) > 0,
        120,
        0.25,
        "m1 to take over the range m2 was frozen in",
    )


def test_a_member_frozen_mid_range_past_its_session_comes_back_as_a_zombie_and_loses_nothing(
    chaos_driver: DriverFactory,
) -> None:
    n = cycles(6)
    driver = chaos_driver(
        members=2,
        cycles=n,
        topics=2,
        partitions=4,
        session_ms=SESSION_MS,
        up_s=(3.0, 6.0),
        down_s=(0.0, 2.0),
        stall_share=0.0,
        fail_child_share=0.0,
        work_us=WORK_US,
        # after the scripted freeze, half the uptimes end in a freeze past the session too
        freeze_share=0.5,
        freeze_s=(SESSION_MS / 1000 + 1.5, SESSION_MS / 1000 + 4.0),
    )
    result = driver.run(opening=_freeze_an_owner_mid_range)
    table = verdict_ok(result)
    v = result.verdict
    assert result.freezes_past_session >= 1, "the frozen owner must come back after its session expired\n" + table
    assert v.ok, table
    assert v.lost == 0 and v.produced > 0, table
    assert v.epoch_conflicts == 0, "a zombie's range epoch must be fenced\n" + table
    assert v.range_claims > 0 and v.ranges_handed_over > 0, "the frozen owner's range must move\n" + table
    assert v.ranges_open == 0, table
