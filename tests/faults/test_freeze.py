"""Grey failures: a member that freezes instead of dying, and comes back as a zombie.

A process paused by its machine, a long garbage collection or a network that stops passing bytes
all look the same to the group: the member stops heartbeating, its session expires, its partitions
(and their ranges) move to the others, and then it runs on from where it stopped, still believing
it holds them.  Its primary, its child and its writes to the store must then do no harm: nothing
lost, no range epoch held by two incarnations, the zombie's late range writes fenced.
"""

from __future__ import annotations

import pytest

from tests.faults.conftest import DriverFactory, cycles, verdict_ok

pytestmark = pytest.mark.faults

SESSION_MS = 3000


def test_members_frozen_past_their_session_come_back_as_zombies_and_lose_nothing(
    chaos_driver: DriverFactory,
) -> None:
    n = cycles(8)
    driver = chaos_driver(
        members=2,
        cycles=n,
        topics=2,
        partitions=4,
        session_ms=SESSION_MS,
        up_s=(4.0, 8.0),  # long enough to be assigned and recover between the group's rebalances
        down_s=(0.0, 2.0),
        stall_share=0.0,
        fail_child_share=0.0,
        # every incarnation's first uptime ends in a freeze longer than the session (it is killed at its
        # second): the group moves on without it, and it comes back to partitions it no longer holds
        freeze_share=1.0,
        freeze_s=(SESSION_MS / 1000 + 1.5, SESSION_MS / 1000 + 4.0),
    )
    result = driver.run()
    table = verdict_ok(result)
    v = result.verdict
    assert result.freezes_past_session >= 2, "members must come back after their session expired\n" + table
    assert v.ok, table
    assert v.lost == 0 and v.produced > 0, table
    assert v.epoch_conflicts == 0, "a zombie's range epoch must be fenced\n" + table
    assert v.ranges_opened > 0 and v.backfilled_records > 0 and v.range_claims > 0, "ranges must move\n" + table
    assert v.ranges_open == 0, table
