"""A large recovery runs with Python's cyclic collector paused, and the collector always comes back."""

from __future__ import annotations

import gc

import pytest

from fastrecover.handover import _collector_paused


def test_the_collector_is_paused_for_a_large_assignment_and_back_after_it_even_when_it_raises() -> None:
    assert gc.isenabled()
    with _collector_paused(True):
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), _collector_paused(True):
        raise RuntimeError("the application's callback failed")
    assert gc.isenabled()
    with _collector_paused(False):
        assert gc.isenabled(), "a small assignment leaves it alone"


def test_an_application_that_turned_the_collector_off_keeps_it_off() -> None:
    gc.disable()
    try:
        with _collector_paused(True):
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
