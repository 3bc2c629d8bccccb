"""The steady gate's slices around an assignment: short while one is expected, and until the first record."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from fastrecover import steady
from fastrecover.steady import (
    IDLE_LONG_AFTER_S,
    IDLE_LONG_SLICE_S,
    IDLE_SLICE_S,
    JOIN_SLICE_S,
    POSITIONS_PER_TICK,
    SteadyGate,
    positions_period,
)


def test_the_slices_stay_short_after_an_assignment_until_the_first_record() -> None:
    gate = SteadyGate()
    now = time.monotonic()
    assert gate.wait_slice(now) == IDLE_SLICE_S
    gate.expect_assignment()
    assert gate.wait_slice(time.monotonic()) == JOIN_SLICE_S
    gate.assignment_made()
    # a jump's fresh records come one at a time: a batch must not wait a long slice for them
    assert gate.wait_slice(time.monotonic()) == JOIN_SLICE_S
    gate.count(0)
    assert gate.wait_slice(time.monotonic()) == JOIN_SLICE_S, "an empty wait is not a record"
    gate.count(3)
    assert gate.wait_slice(time.monotonic()) == IDLE_SLICE_S
    gate.count(5)
    assert gate.wait_slice(time.monotonic()) == IDLE_SLICE_S


def test_an_assignment_that_brings_no_record_ends_the_short_slices_after_a_while() -> None:
    gate = SteadyGate()
    gate.assignment_made()
    later = time.monotonic() + steady._FIRST_RECORD_WAIT_S + 0.01
    assert gate.wait_slice(later) == IDLE_SLICE_S


def test_records_while_an_assignment_is_expected_keep_the_short_slices() -> None:
    """A revoke right after an assignment: records of the partitions still held come while the next
    assignment is expected, and must not end its short slices."""
    gate = SteadyGate()
    gate.assignment_made()
    gate.expect_assignment()
    gate.count(7)
    assert gate.wait_slice(time.monotonic()) == JOIN_SLICE_S


def test_a_steady_consumer_idle_for_a_while_waits_in_long_slices_until_anything_comes() -> None:
    gate = SteadyGate()
    start = gate.idle_since
    assert gate.wait_slice(start + IDLE_LONG_AFTER_S / 2) == IDLE_SLICE_S
    idle = start + IDLE_LONG_AFTER_S
    assert gate.wait_slice(idle) == IDLE_LONG_SLICE_S
    # a record, also one the C path returned (it only adds to primary_messages), ends the long slices
    gate.primary_messages += 1
    assert gate.wait_slice(idle + 0.01) == IDLE_SLICE_S
    assert gate.wait_slice(idle + 0.01 + IDLE_LONG_AFTER_S) == IDLE_LONG_SLICE_S
    gate.count(2)
    assert gate.wait_slice(idle + 0.02 + IDLE_LONG_AFTER_S) == IDLE_SLICE_S


def test_long_slices_only_in_the_steady_state_and_never_while_an_assignment_is_expected() -> None:
    gate = SteadyGate()
    gate.set_steady(False)  # a backfill, a deferred commit or a held EOF: the tick must come every slice
    assert gate.wait_slice(time.monotonic() + 10 * IDLE_LONG_AFTER_S) == IDLE_SLICE_S
    gate.set_steady(True)
    later = time.monotonic() + 10 * IDLE_LONG_AFTER_S
    assert gate.wait_slice(later) == IDLE_LONG_SLICE_S
    gate.expect_assignment()  # a revoke came inside a long slice: the next ones are short again
    assert gate.wait_slice(time.monotonic()) == JOIN_SLICE_S
    gate.assignment_made()
    assert gate.wait_slice(time.monotonic()) == JOIN_SLICE_S
    # once the assignment's short slices end, its silence counts from there
    after_first_wait = gate.joining_until + 0.01
    assert gate.wait_slice(after_first_wait) == IDLE_SLICE_S
    assert gate.wait_slice(after_first_wait + IDLE_LONG_AFTER_S) == IDLE_LONG_SLICE_S
    gate.leave()  # a backfill starts
    assert gate.wait_slice(time.monotonic() + 10 * IDLE_LONG_AFTER_S) == IDLE_SLICE_S


@given(partitions=st.integers(0, 200_000), interval_s=st.floats(0.001, 3_600.0))
def test_positions_are_read_at_every_tick_for_small_assignments_and_bounded_for_large_ones(
    partitions: int, interval_s: float
) -> None:
    period = positions_period(partitions, interval_s)
    assert period >= steady.TICK_S
    if partitions <= POSITIONS_PER_TICK:
        assert period == steady.TICK_S  # what every assignment up to that size always had
    # several reads per auto-commit interval, whatever the size (unless the interval is shorter than a tick)
    assert period <= max(steady.TICK_S, interval_s / 4)
    assert period <= 1.0
    # on average no more than POSITIONS_PER_TICK partitions' worth per tick, until a bound takes over
    ticks = period / steady.TICK_S
    bounded = period >= min(1.0, max(steady.TICK_S, interval_s / 4)) - 1e-12
    assert bounded or partitions / ticks <= POSITIONS_PER_TICK + 1e-9


def test_a_larger_assignment_never_has_its_positions_read_more_often() -> None:
    periods = [positions_period(n, 5.0) for n in range(0, 20_000, 97)]
    assert periods == sorted(periods)
    assert positions_period(2_048, 5.0) > steady.TICK_S
