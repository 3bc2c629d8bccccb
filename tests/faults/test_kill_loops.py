"""Faults 1 and 2: SIGKILL loops of one member, and of any of three members, under continuous produce."""

from __future__ import annotations

import pytest

from tests.faults.conftest import GROUP_PROTOCOLS, DriverFactory, cycles, verdict_ok

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("group_protocol", GROUP_PROTOCOLS)
def test_single_member_kill_restart_loop_loses_nothing(chaos_driver: DriverFactory, group_protocol: str) -> None:
    """Fault 1: random kill/restart cycles of a single member (random moments and stall points)."""
    n = cycles(30)
    driver = chaos_driver(
        group_protocol=group_protocol,
        static=True,  # KIP-848: a quick restart may be fenced as fatal, and must be survived
        members=1,
        cycles=n,
        up_s=(0.5, 2.5),
        down_s=(0.0, 1.0),
        stall_share=0.3,
        fail_child_share=0.1,
    )
    result = driver.run()
    table = verdict_ok(result)
    v = result.verdict
    assert v.ok, table
    assert v.lost == 0 and v.produced > 0, table
    assert v.kills >= n, table
    assert v.ranges_opened > 0 and v.backfilled_records > 0, "the campaign must exercise backfill ranges\n" + table
    assert v.ranges_open == 0, table


@pytest.mark.parametrize("group_protocol", GROUP_PROTOCOLS)
def test_three_members_random_kills_fence_and_finish_every_range(
    chaos_driver: DriverFactory, group_protocol: str
) -> None:
    """Fault 2: any of three members killed at random; ranges move with their partitions."""
    n = cycles(30)
    # downtimes beyond the session timeout make partitions (and their ranges) move to the survivors
    driver = chaos_driver(
        group_protocol=group_protocol,
        static=True,  # KIP-848: a quick restart may be fenced as fatal, and must be survived
        members=3,
        cycles=n,
        up_s=(1.0, 4.0),
        down_s=(0.0, 6.0),
        stall_share=0.3,
        fail_child_share=0.1,
    )
    result = driver.run()
    table = verdict_ok(result)
    v = result.verdict
    assert v.ok, table
    assert v.lost == 0, table
    assert v.epoch_conflicts == 0 and v.concurrent_backfills == 0, "fencing\n" + table
    assert v.finished_by_non_owner == 0, table
    assert v.ranges_open == 0, "every range finished by whoever owns its partition\n" + table
    assert v.ranges_handed_over > 0, "rebalances must move ranges between members\n" + table
    assert v.kills >= n, table
