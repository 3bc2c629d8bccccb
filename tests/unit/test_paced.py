"""PacedWarning: a failure that repeats at every try is warned of once, then once per interval."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastrecover.paced import PacedWarning

LOG = logging.getLogger("fastrecover.test.paced")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _levels(caplog: pytest.LogCaptureFixture, level: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG.name and r.levelname == level]


def test_a_run_of_failures_warns_once_then_once_per_interval_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    clock = Clock()
    paced = PacedWarning(LOG, interval_s=60.0, clock=clock)
    for _ in range(30):  # one try a second for half a minute
        paced.failed("store unreadable: %s", "timeout")
        clock.now += 1.0
    assert _levels(caplog, "WARNING") == ["store unreadable: timeout"]
    assert len(_levels(caplog, "DEBUG")) == 29
    clock.now += 30.0  # a minute after the first warning
    paced.failed("store unreadable: %s", "timeout")
    warnings = _levels(caplog, "WARNING")
    assert warnings[1] == "store unreadable: timeout (failing for 60 s; 29 more since the last warning)"
    assert paced.failing


def test_a_success_ends_the_run_and_the_next_failure_is_warned_of_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOG.name)
    clock = Clock()
    paced = PacedWarning(LOG, clock=clock)
    paced.succeeded("store readable")  # no run under way: nothing said
    assert caplog.records == []
    paced.failed("down")
    clock.now += 5.0
    paced.succeeded("store readable")
    assert not paced.failing
    assert _levels(caplog, "INFO") == ["store readable again after 5 s of failures"]
    paced.failed("down")
    assert _levels(caplog, "WARNING") == ["down", "down"]


def test_an_interval_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s must be positive, got 0"):
        PacedWarning(LOG, interval_s=0)


@given(st.lists(st.tuples(st.booleans(), st.floats(min_value=0.0, max_value=200.0)), max_size=60))
def test_never_more_than_one_warning_per_interval_within_a_run(steps: list[tuple[bool, float]]) -> None:
    """Whatever the pattern of failures and successes: within a run, warnings are an interval apart."""
    records: list[tuple[str, float]] = []
    clock = Clock()

    class Sink(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append((record.levelname, clock.now))

    log = logging.getLogger("fastrecover.test.paced.property")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    sink = Sink()
    log.addHandler(sink)
    try:
        paced = PacedWarning(log, interval_s=60.0, clock=clock)
        last_warning: float | None = None
        for fails, advance in steps:
            clock.now += advance
            before = len(records)
            if fails:
                paced.failed("x")
                level = records[-1][0]
                if last_warning is None:
                    assert level == "WARNING"  # the first failure of a run is always said
                else:
                    assert (level == "WARNING") == (clock.now - last_warning >= 60.0)
                if level == "WARNING":
                    last_warning = clock.now
                assert len(records) == before + 1  # one line per failure, never none
            else:
                paced.succeeded("ok")
                last_warning = None
    finally:
        log.removeHandler(sink)
