"""The C steady path of ``Consumer.poll()`` (fastrecover/_fastpoll.c) against its Python reference.

The extension claims to repeat the Python method's inlined path branch for branch and to hand every
other call to it.  These tests drive both with the same scripted primary (a fake ``poll`` that returns
records, None or raises) and compare everything observable: what each call returned or raised, the
waits asked of the primary, the rest of a wait handed to ``ParallelMode.poll``, and the counters.
The one deliberate difference, the C path's own clock read at the end of a run, is tested apart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrecover import _accel
from fastrecover import steady as steady_module
from fastrecover.consumer import Consumer
from fastrecover.steady import FAST_CALLS, IDLE_SLICE_S, SteadyGate

REFERENCE: Callable[..., Any] = getattr(Consumer.poll, "slow", Consumer.poll)
RUN_TIMEOUT = 1.0  # one object: the loop constant whose identity the fast path checks


def test_make_test_runs_the_c_path() -> None:
    """The build hook compiled the extension for this environment (CI runs a fresh install), and
    Consumer.poll calls confluent_kafka's poll() as a C function."""
    if os.environ.get(_accel.PURE_PYTHON_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{_accel.PURE_PYTHON_ENV} is set: the suite must run the C path it ships")
    assert _accel.ENABLED
    assert type(Consumer.poll).__name__ == "FastPoll"
    assert getattr(Consumer.poll, "direct", False)
    assert issubclass(SteadyGate, _accel.StateBase)


class Primary:
    """confluent_kafka's poll(), scripted: each call takes the next outcome."""

    def __init__(self, outcomes: list[Any]) -> None:
        self.outcomes = list(outcomes)
        self.waits: list[Any] = []

    def poll(self, consumer: object, wait: Any) -> Any:
        self.waits.append(wait)
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


class FakeMode(_accel.StateBase):  # type: ignore[misc,valid-type]
    """The attributes and methods of ParallelMode that Consumer.poll touches."""

    def __init__(self, fast_calls: int, fast_timeout: Any, fast_wait: Any) -> None:
        self.fast_calls = fast_calls
        self.fast_timeout = fast_timeout
        self.fast_wait = fast_wait
        self.primary_messages = 0
        self.next_tick = 0.0  # always due: the C path never starts a run by itself (tested apart)
        self.joining_until = 0.0
        self.calls: list[tuple[str, Any]] = []

    def poll(self, timeout: Any) -> Any:
        self.calls.append(("ParallelMode.poll", timeout))
        return "full path"

    def note_primary(self, msg: Any) -> Any:
        self.calls.append(("note_primary", msg))
        return msg


class App:
    _pending = None  # as Consumer's: no mode waits to be built

    def __init__(self, fr: FakeMode | None) -> None:
        self._fr = fr
        self._gate = fr  # the fake is the mode and its steady gate at once


def run(poll: Callable[..., Any], primary: Primary, fr: FakeMode, timeouts: list[Any]) -> list[Any]:
    app = App(fr)
    seen: list[Any] = []
    with mock.patch.object(steady_module, "_K", mock.Mock(poll=primary.poll)):
        for timeout in timeouts:
            try:
                seen.append(("returned", poll(app, timeout)))
            except Exception as exc:
                seen.append(("raised", type(exc).__name__, str(exc)))
    return seen


def c_poll(primary: Primary) -> Any:
    return _accel.fast_poll(primary.poll, REFERENCE, IDLE_SLICE_S, FAST_CALLS)


TIMEOUTS = st.sampled_from([RUN_TIMEOUT, None, -1, -1.0, 0, 0.0, 0.01, IDLE_SLICE_S, 0.06, 2.0, 3, "soon", True])
OUTCOMES = st.sampled_from(["record", None, RuntimeError("callback failed")])


@settings(max_examples=400, deadline=None)
@given(
    fast_calls=st.integers(0, 4),
    run_timeout=st.sampled_from([RUN_TIMEOUT, None, -1.0, 0.02]),
    timeouts=st.lists(TIMEOUTS, max_size=8),
    outcomes=st.lists(OUTCOMES, max_size=8),
)
def test_the_c_path_does_what_the_python_method_does(
    fast_calls: int, run_timeout: Any, timeouts: list[Any], outcomes: list[Any]
) -> None:
    def state() -> FakeMode:
        wait = run_timeout if run_timeout is not None and 0 <= run_timeout <= IDLE_SLICE_S else IDLE_SLICE_S
        return FakeMode(fast_calls, run_timeout, wait)

    py_primary, c_primary = Primary(outcomes), Primary(outcomes)
    py_fr, c_fr = state(), state()
    py_seen = run(REFERENCE, py_primary, py_fr, timeouts)
    c_seen = run(c_poll(c_primary), c_primary, c_fr, timeouts)
    assert c_seen == py_seen
    assert c_primary.waits == py_primary.waits
    assert [type(w) for w in c_primary.waits] == [type(w) for w in py_primary.waits]
    assert c_fr.calls == py_fr.calls
    assert (c_fr.fast_calls, c_fr.primary_messages) == (py_fr.fast_calls, py_fr.primary_messages)


def test_the_rest_of_a_long_wait_goes_to_the_full_path() -> None:
    primary = Primary([None])
    fr = FakeMode(3, RUN_TIMEOUT, IDLE_SLICE_S)
    seen = run(c_poll(primary), primary, fr, [2.0])
    assert seen == [("returned", "full path")]
    assert primary.waits == [IDLE_SLICE_S]  # one slice on the fast path
    assert fr.calls == [("ParallelMode.poll", pytest.approx(2.0 - IDLE_SLICE_S))]
    assert fr.fast_calls == 0  # an empty slice ends the run: the next call reads the clock


def test_a_run_goes_on_without_python_while_no_tick_is_due() -> None:
    primary = Primary(["record"] * (3 * FAST_CALLS))
    fr = FakeMode(FAST_CALLS, RUN_TIMEOUT, IDLE_SLICE_S)
    fr.next_tick = time.monotonic() + 3600
    seen = run(c_poll(primary), primary, fr, [RUN_TIMEOUT] * (3 * FAST_CALLS))
    assert seen == [("returned", "record")] * (3 * FAST_CALLS)
    assert fr.calls == []  # never the Python path
    assert fr.fast_calls == FAST_CALLS  # refilled at the end of each run
    assert fr.primary_messages == 3 * FAST_CALLS


@pytest.mark.parametrize("why", ["tick due", "join under way", "run stopped by Python"])
def test_a_run_ends_for_a_tick_a_join_or_a_change_of_state(why: str) -> None:
    primary = Primary(["record"] * (FAST_CALLS + 1))
    fr = FakeMode(FAST_CALLS, RUN_TIMEOUT, IDLE_SLICE_S)
    fr.next_tick = time.monotonic() + 3600
    if why == "tick due":
        fr.next_tick = time.monotonic() - 1
    elif why == "join under way":
        fr.joining_until = time.monotonic() + 3600
    timeouts = [RUN_TIMEOUT] * (FAST_CALLS + 1)
    app = App(fr)
    poll = c_poll(primary)
    with mock.patch.object(steady_module, "_K", mock.Mock(poll=primary.poll)):
        for i, timeout in enumerate(timeouts):
            if why == "run stopped by Python" and i == 2:
                fr.fast_calls = 0  # what a revoke, a tick or an empty poll does
            poll(app, timeout)
    # every call after the run (or after the stop) took the Python path (whose fake never starts a run)
    python_calls = len(timeouts) - 2 if why == "run stopped by Python" else 1
    assert fr.calls == [("ParallelMode.poll", RUN_TIMEOUT)] * python_calls


def test_it_binds_like_a_method() -> None:
    primary = Primary(["a", "b", "c", "d"])

    class Base:
        poll = c_poll(primary)

        def __init__(self) -> None:
            self._fr = self._gate = FakeMode(9, RUN_TIMEOUT, IDLE_SLICE_S)

    class Sub(Base):
        def poll(self, timeout: Any = None) -> Any:
            return ("sub", super().poll(timeout))

    obj, sub = Base(), Sub()
    with mock.patch.object(steady_module, "_K", mock.Mock(poll=primary.poll)):
        assert obj.poll(RUN_TIMEOUT) == "a"
        assert Base.poll(obj, RUN_TIMEOUT) == "b"
        bound = obj.poll
        assert bound(RUN_TIMEOUT) == "c"
        assert sub.poll(RUN_TIMEOUT) == ("sub", "d")
    assert Base.poll.__name__ == "poll"
    assert Base.poll.__doc__ == REFERENCE.__doc__


def test_keywords_and_a_missing_mode_take_the_python_path() -> None:
    primary = Primary(["record", "record"])
    fr = FakeMode(5, None, IDLE_SLICE_S)
    poll = c_poll(primary)
    with mock.patch.object(steady_module, "_K", mock.Mock(poll=primary.poll)):
        with mock.patch.object(steady_module, "_SLICE", IDLE_SLICE_S * 2):  # marks the Python method's wait
            assert poll(App(fr), timeout=2.0) == "record"  # keywords: the Python method, its fast path
        assert poll(App(None), RUN_TIMEOUT) == "record"  # mode off: confluent_kafka's poll, via Python
    assert primary.waits == [IDLE_SLICE_S * 2, RUN_TIMEOUT]
    assert fr.fast_calls == 4
    with pytest.raises(TypeError):
        poll()


def test_bad_construction_is_refused() -> None:
    with pytest.raises(TypeError):
        _accel.fast_poll(None, REFERENCE, IDLE_SLICE_S, FAST_CALLS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="run must be at least 1"):
        _accel.fast_poll(print, REFERENCE, IDLE_SLICE_S, 0)
