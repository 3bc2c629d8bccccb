"""A warning that a failing dependency repeats at every try, said at a pace an operator can read.

The range store can stay open and still fail its reads (a PostgreSQL that froze, a SQLite file
whose disk went away).  The calls that read it then fail on every try: a pending recovery once its
back-off ends (every second by default), ``committed()`` at every call the application makes.  A
warning per try filled a long outage's log with one line, many times a second per consumer, and
hid the line that says when it began.  :class:`PacedWarning` says the first failure of a run at
once, then at most once per interval with how many came since, and logs the rest at debug level;
a success ends the run, and the next failure is said at once again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

#: the pace of the warnings of one failure that repeats (the store link's failed opens use the same)
REPEAT_WARNING_S = 60.0


class PacedWarning:
    """One kind of repeated failure: the first warned at once, then once per ``interval_s`` with a count."""

    __slots__ = ("_clock", "_interval", "_log", "_since", "_suppressed", "_warned_at")

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = REPEAT_WARNING_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._log = logger
        self._interval = interval_s
        self._clock = clock
        #: when the current run of failures began (None: the last call succeeded)
        self._since: float | None = None
        self._warned_at = 0.0
        #: failures logged at debug level since the last warning
        self._suppressed = 0

    @property
    def failing(self) -> bool:
        return self._since is not None

    def failed(self, message: str, *args: object) -> None:
        """One more failure: a warning if it begins a run or the interval has passed, else a debug line.

        ``message`` and ``args`` are the logging call's; a repeat says how long the run has lasted
        and how many failures were not warned of.
        """
        now = self._clock()
        if self._since is None:
            self._since = self._warned_at = now
            self._suppressed = 0
            self._log.warning(message, *args)
        elif now - self._warned_at >= self._interval:
            self._log.warning(
                message + " (failing for %.0f s; %d more since the last warning)",
                *args,
                now - self._since,
                self._suppressed,
            )
            self._warned_at, self._suppressed = now, 0
        else:
            self._suppressed += 1
            self._log.debug(message, *args)

    def succeeded(self, what: str) -> None:
        """The call answered: a run of failures ends, said once at info level with its length."""
        if self._since is None:
            return
        self._log.info("%s again after %.0f s of failures", what, self._clock() - self._since)
        self._since = None
        self._suppressed = 0
