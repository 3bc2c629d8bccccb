"""wait_for and Deadline against a fake clock: exact, instant, and no real sleeping."""

from __future__ import annotations

import pytest

from fastrecover_tools.testing.waiting import Deadline, wait_for


class FakeClock:
    """A monotonic clock that only moves when the code under test sleeps."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0, "never sleep zero or negative time"
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_returns_truthy_value_at_once_without_sleeping(clock: FakeClock) -> None:
    assert wait_for(lambda: "ready", 5.0, clock=clock, sleep=clock.sleep) == "ready"
    assert clock.sleeps == []


def test_polls_at_interval_until_the_condition_holds(clock: FakeClock) -> None:
    # Binary-exact intervals keep the fake time arithmetic exact.
    ready_at = clock.now + 0.3

    def predicate() -> float | None:
        return clock.now if clock.now >= ready_at else None

    result = wait_for(predicate, 5.0, 0.125, clock=clock, sleep=clock.sleep)
    assert result == clock.now == 1000.375
    assert clock.sleeps == [0.125, 0.125, 0.125]


@pytest.mark.parametrize("falsy", [0, "", [], None, False])
def test_falsy_results_keep_waiting(clock: FakeClock, falsy: object) -> None:
    with pytest.raises(TimeoutError):
        wait_for(lambda: falsy, 1.0, 0.25, clock=clock, sleep=clock.sleep)


def test_timeout_names_what_and_checks_again_at_the_deadline(clock: FakeClock) -> None:
    checks: list[float] = []

    def predicate() -> bool:
        checks.append(clock.now)
        return False

    start = clock.now
    with pytest.raises(TimeoutError, match=r"timed out after 1 s waiting for group g-1 to be empty \(4 checks\)"):
        wait_for(predicate, 1.0, 0.375, "group g-1 to be empty", clock=clock, sleep=clock.sleep)
    # The last sleep is cut to the time left, and the predicate runs once more at the deadline.
    assert clock.sleeps == [0.375, 0.375, 0.25]
    assert checks == [start, start + 0.375, start + 0.75, start + 1.0]


def test_condition_true_exactly_at_the_deadline_is_not_a_timeout(clock: FakeClock) -> None:
    deadline = clock.now + 1.0
    assert wait_for(lambda: clock.now >= deadline, 1.0, 0.375, clock=clock, sleep=clock.sleep) is True
    assert clock.now == deadline


def test_zero_timeout_checks_once(clock: FakeClock) -> None:
    calls: list[int] = []

    def predicate() -> bool:
        calls.append(1)
        return False

    with pytest.raises(TimeoutError, match=r"\(1 checks\)"):
        wait_for(predicate, 0.0, clock=clock, sleep=clock.sleep)
    assert calls == [1]
    assert clock.sleeps == []


def test_ignored_exceptions_are_retried_and_chained(clock: FakeClock) -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError(f"refused #{len(attempts)}")
        return "up"

    assert wait_for(flaky, 5.0, 0.1, ignore=(ConnectionError,), clock=clock, sleep=clock.sleep) == "up"

    def always_down() -> bool:
        raise ConnectionError("refused")

    with pytest.raises(TimeoutError, match="last error: ConnectionError") as info:
        wait_for(always_down, 0.5, 0.1, "broker", ignore=(ConnectionError,), clock=clock, sleep=clock.sleep)
    assert isinstance(info.value.__cause__, ConnectionError)


def test_a_later_plain_false_clears_the_remembered_error(clock: FakeClock) -> None:
    results: list[bool] = []

    def predicate() -> bool:
        results.append(False)
        if len(results) == 1:
            raise ConnectionError("first")
        return False

    with pytest.raises(TimeoutError) as info:
        wait_for(predicate, 0.3, 0.1, ignore=(ConnectionError,), clock=clock, sleep=clock.sleep)
    assert info.value.__cause__ is None
    assert "last error" not in str(info.value)


def test_other_exceptions_propagate_immediately(clock: FakeClock) -> None:
    def broken() -> bool:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        wait_for(broken, 10.0, ignore=(ConnectionError,), clock=clock, sleep=clock.sleep)
    assert clock.sleeps == []


@pytest.mark.parametrize(("timeout", "interval"), [(-1.0, 0.1), (1.0, 0.0), (1.0, -0.5)])
def test_rejects_nonsense_arguments(clock: FakeClock, timeout: float, interval: float) -> None:
    with pytest.raises(ValueError):
        wait_for(lambda: True, timeout, interval, clock=clock, sleep=clock.sleep)


def test_deadline_counts_down_and_never_goes_negative(clock: FakeClock) -> None:
    deadline = Deadline(2.0, clock=clock)
    assert deadline.remaining() == pytest.approx(2.0)
    assert not deadline.expired()
    clock.sleep(1.5)
    assert deadline.remaining() == pytest.approx(0.5)
    clock.sleep(0.5)
    assert deadline.expired()
    clock.sleep(3.0)
    assert deadline.remaining() == 0.0
    assert "remaining=0.000" in repr(deadline)


def test_deadline_rejects_negative_timeout(clock: FakeClock) -> None:
    with pytest.raises(ValueError):
        Deadline(-0.1, clock=clock)
