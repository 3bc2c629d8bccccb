"""The steady gate's slices around an assignment: short while one is expected, and until the first record."""

from __future__ import annotations

import time

from fastrecover import steady
from fastrecover.steady import IDLE_SLICE_S, JOIN_SLICE_S, SteadyGate


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
