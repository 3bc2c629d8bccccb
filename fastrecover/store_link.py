"""The store handle of a mode-on consumer: opened on a thread at construction, re-tried after a back-off.

Every path that touches the store (recovery, the committer, hand-back, release) asks the
:class:`StoreLink` for it, so one place decides when the store counts as down: an open that
failed (until the back-off passes) or a write that stopped answering (until it ends).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING

from fastrecover import hooks
from fastrecover.errors import StoreUnavailableError
from fastrecover.paced import REPEAT_WARNING_S

if TYPE_CHECKING:
    from fastrecover.store import RangeStore

log = logging.getLogger("fastrecover.committer")

#: what the bound on a store wait counts for a statement when its timeout is off (0)
_UNBOUNDED_STATEMENT_MS = 30_000
#: room for a connection, its pre-ping and the commit around the statements of one transaction
CONNECT_SLACK_S = 5.0


class StoreLink:
    """The store handle, opened lazily and re-tried after a back-off when it is down.

    A consumer starts opening it on a thread at construction (:meth:`open_in_background`):
    importing SQLAlchemy and checking the schema take longer than a group join, and a recovery
    whose lags a replay covers need not wait for them (see ``Recoverer.recover``).

    The open may also be *deferred*: its thread then waits until something needs the store
    (:meth:`get`), :meth:`open_soon` is called (the first recovery is over), or the deferral's
    bound passes.  The open is about 0.3-0.4 s of CPU under the GIL; on a small machine, run
    during the group join and the first recovery it delayed the first fresh record of a
    small-lag restart by about a tenth of a second.  A deferred link counts as :attr:`opening`
    all along, so every path treats it exactly as an open still under way.
    """

    def __init__(
        self, url: str, create: bool, backoff_s: float, lock_timeout_ms: int, statement_timeout_ms: int
    ) -> None:
        self.url = url
        self._create = create
        self._backoff = backoff_s
        self._lock_timeout_ms = lock_timeout_ms
        self._statement_timeout_ms = statement_timeout_ms
        self._store: RangeStore | None = None
        self._retry_at = 0.0
        #: since when opens have failed (monotonic), how many, and when that was last reported; None: no outage
        self._down_since: float | None = None
        self._failed_opens = 0
        self._warned_at = 0.0
        #: a write that did not answer within the bound: until it ends, the store counts as down
        self._stalled: threading.Event | None = None
        # The longest a healthy transaction takes: a lock wait, a statement, and room for the connection.
        # A store that keeps a caller waiting longer has stopped answering (a network that froze
        # rather than failed: the server-side timeouts never see the statement).
        statement_s = (statement_timeout_ms or _UNBOUNDED_STATEMENT_MS) / 1000.0
        self.wait_s = lock_timeout_ms / 1000.0 + statement_s + CONNECT_SLACK_S
        self._opening: threading.Thread | None = None
        self._opened = threading.Event()
        self._open_error: BaseException | None = None
        self._open_lock = threading.Lock()
        self._open_slow = False
        #: a deferred open: when its thread starts opening by itself (monotonic), and whether it has
        self._turn = threading.Condition()
        self._open_at = 0.0
        #: the deferral's bound: a postponed open begins no later than this (monotonic)
        self._open_by = 0.0
        #: someone asked for the store now (get(), or open_soon() with no delay): postponing is over
        self._wanted = False
        self._began = False
        self._cancelled = False

    def open_in_background(self, defer_s: float = 0.0) -> None:
        """Open the store on a thread; the first :meth:`get` waits for it (bounded).

        With ``defer_s`` the thread waits up to that long before it opens, unless :meth:`get`
        or :meth:`open_soon` says the store is wanted sooner.
        """
        if self._store is not None or self._opening is not None:
            return
        self._opened.clear()
        with self._turn:
            self._open_at = self._open_by = time.monotonic() + max(0.0, defer_s)
            self._began = self._cancelled = self._wanted = False
        self._opening = threading.Thread(target=self._open_now, name="fastrecover-store-open", daemon=True)
        self._opening.start()

    def open_soon(self, after_s: float = 0.0) -> None:
        """A deferred open starts at the latest ``after_s`` from now (at once with 0)."""
        with self._turn:
            self._open_at = min(self._open_at, time.monotonic() + after_s)
            self._wanted = self._wanted or after_s <= 0
            self._turn.notify_all()

    def postpone(self, after_s: float) -> None:
        """A deferred open not begun yet starts no sooner than ``after_s`` from now, nor past its bound.

        For the work a replay leaves to the store, which can wait while the replay's records are
        delivered; once anyone wants the store now (:meth:`get`, ``open_soon(0)``) it opens at once.
        """
        with self._turn:
            if not self._began and not self._wanted:
                self._open_at = max(self._open_at, min(time.monotonic() + after_s, self._open_by))

    def _await_turn(self) -> bool:
        """Wait until the deferred open is due; False when :meth:`close` cancelled it first."""
        with self._turn:
            while not self._cancelled:
                left = self._open_at - time.monotonic()
                if left <= 0:
                    self._began = True
                    return True
                self._turn.wait(left)
            return False

    @property
    def open_ended(self) -> bool:
        """The background open ended and nobody has taken its outcome yet (:meth:`get` does)."""
        return self._opening is not None and self._opened.is_set()

    @property
    def opening(self) -> bool:
        """The background open has not ended yet: a :meth:`get` now would wait for it."""
        return self._opening is not None and not self._opened.is_set()

    def _open_now(self) -> None:
        try:
            if not self._await_turn():
                return  # closed before the open was due: nothing was opened
            hooks.fire("store-open")
            self._store = self._open()
        except BaseException as exc:  # handed to the first caller of get(), on its own thread
            self._open_error = exc
        finally:
            self._opened.set()

    def _open(self) -> RangeStore:
        from fastrecover.store import open_store  # imports SQLAlchemy: only a consumer with the mode on gets here

        return open_store(
            self.url,
            create=self._create,
            lock_timeout_ms=self._lock_timeout_ms,
            statement_timeout_ms=self._statement_timeout_ms,
        )

    def _join_open(self) -> bool:
        """Wait (bounded) for the background open; False if it still runs.  Raises what it raised,
        once, unless it is the store being unavailable (retried after the back-off, like any open)."""
        if not self._opened.wait(0.0 if self._open_slow else self.wait_s):
            self._open_slow = True  # it hangs (a frozen network): later calls do not wait on it again
            return False
        with self._open_lock:
            if self._opening is None:
                return True
            self._opening = None
            error, self._open_error = self._open_error, None
        if isinstance(error, StoreUnavailableError):
            self._unavailable(error)
        elif error is not None:
            raise error  # a store behind in schema, a bad URL: the operator's to fix
        return True

    def get(self, force: bool = False) -> RangeStore | None:
        if self._opening is not None:
            self.open_soon()  # a deferred open is wanted now
            if not self._join_open():
                return None  # still opening after the bound: as if it were down
        if self._stalled is not None:
            if not self._stalled.is_set():
                return None  # a write still hangs on it: nothing else may wait on the store too
            self._stalled = None
        if self._store is not None:
            return self._store
        if not force and time.monotonic() < self._retry_at:
            return None
        try:
            self._store = self._open()
        except StoreUnavailableError as exc:  # a store behind in schema is the operator's to fix: it raises
            self._unavailable(exc)
            return None
        if self._down_since is not None:
            log.info(
                "range store answers again after %.0f s and %d failed opens; fast recovery is back on",
                time.monotonic() - self._down_since,
                self._failed_opens,
            )
            self._down_since, self._failed_opens = None, 0
        return self._store

    def _unavailable(self, error: StoreUnavailableError) -> None:
        """An open failed: the next waits a back-off.  Said once per outage, then once a minute, not per try.

        Every tick that needs the store tries once its back-off (1 s by default) has passed: a warning
        per try filled the log of a long outage with the same line, sixty a minute per consumer.
        """
        now = time.monotonic()
        self._retry_at = now + self._backoff
        self._failed_opens += 1
        if self._down_since is None:
            self._down_since = self._warned_at = now
            log.warning("range store unavailable (%s); fast recovery is off until it answers", error)
        elif now - self._warned_at >= REPEAT_WARNING_S:
            self._warned_at = now
            log.warning(
                "range store still unavailable after %.0f s and %d failed opens (%s); fast recovery stays off",
                now - self._down_since,
                self._failed_opens,
                error,
            )
        else:
            log.debug("range store still unavailable: %s", error)

    def failed(self) -> None:
        """The store stopped answering: wait a back-off before the next attempt."""
        self._retry_at = time.monotonic() + self._backoff

    def stalled(self, done: threading.Event) -> None:
        """A write has hung longer than :attr:`wait_s`: the store is down until it ends (``done``)."""
        self._stalled = done

    @property
    def is_stalled(self) -> bool:
        return self._stalled is not None and not self._stalled.is_set()

    def close(self) -> None:
        if self._opening is not None:
            with self._turn:
                if not self._began:  # deferred and not yet begun: never opened, nothing to wait for
                    self._cancelled = True
                    self._turn.notify_all()
            with contextlib.suppress(BaseException):  # closing: what the open raised no longer matters
                self._join_open()
        if self._store is not None:
            self._store.close()
            self._store = None
