"""Deadline-based waiting for conditions that become true asynchronously.

Kafka state (group membership, topic metadata, committed offsets) changes in the
background, so tests, the demo and the broker launcher all need to wait for a
condition. A fixed ``sleep`` either wastes time or flakes; these helpers poll a
predicate until a deadline and fail loudly, naming what was awaited, so a failure
reads as "timed out after 10.0 s waiting for group g-1 to be empty" rather than a
bare assertion.

The clock and sleep functions are injectable so the helpers can be tested
without real time passing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["Deadline", "wait_for"]

T = TypeVar("T")

Clock = Callable[[], float]
Sleep = Callable[[float], None]


class Deadline:
    """A point in time several waits share, so a multi-step wait honours one overall budget."""

    def __init__(self, timeout: float, *, clock: Clock = time.monotonic) -> None:
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0, got {timeout!r}")
        self._clock = clock
        self.timeout = timeout
        self.expires_at = clock() + timeout

    def remaining(self) -> float:
        """Seconds left, never negative, so it can be passed straight to a client timeout."""
        return max(0.0, self.expires_at - self._clock())

    def expired(self) -> bool:
        return self._clock() >= self.expires_at

    def __repr__(self) -> str:
        return f"Deadline(timeout={self.timeout!r}, remaining={self.remaining():.3f})"


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.1,
    what: str = "condition",
    *,
    ignore: tuple[type[BaseException], ...] = (),
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> T:
    """Poll ``predicate`` until it returns a truthy value and return that value.

    The predicate is always evaluated at least once and once more at the
    deadline, so a zero timeout still means "check now" and a condition that
    turns true during the last interval is not reported as a timeout.

    Exceptions listed in ``ignore`` count as "not yet" (useful while a broker
    is still starting); the last one is chained to the ``TimeoutError`` so the
    real cause is visible. Any other exception propagates at once: an
    unexpected error is a bug, not a reason to keep waiting.
    """
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout!r}")
    if interval <= 0:
        raise ValueError(f"interval must be > 0, got {interval!r}")
    deadline = Deadline(timeout, clock=clock)
    last_error: BaseException | None = None
    attempts = 0
    while True:
        attempts += 1
        try:
            result = predicate()
        except ignore as exc:
            last_error = exc
        else:
            if result:
                return result
            last_error = None
        remaining = deadline.remaining()
        if remaining <= 0:
            break
        sleep(min(interval, remaining))
    message = f"timed out after {timeout:g} s waiting for {what} ({attempts} checks)"
    if last_error is not None:
        message += f"; last error: {last_error!r}"
    raise TimeoutError(message) from last_error
