"""The range store's connections and transactions: the state every store call shares.

The store is written from two threads (the consumer thread creates and claims
ranges, the backfill child commits their progress), so every call takes its own
connection and transaction from the engine's pool; nothing is shared but the
thread-safe Engine.  :class:`StoreTransactions` owns every field of a store: the
engines, the lock of an in-memory SQLite database, the closed flag and the
transaction a :meth:`~StoreTransactions.transaction` block binds to its thread.
The layers above it (:class:`~fastrecover.store.reads.RangeReads`, then
:class:`~fastrecover.store.sql.RangeStore`) only add methods that go through
``_tx`` and write no field.

On SQLite we take over BEGIN from the ``sqlite3`` module: its legacy mode would
not start a transaction for our SELECT-then-UPDATE sequences, and writes use
``BEGIN IMMEDIATE`` so two writers queue on the busy timeout instead of one
failing with "database is locked" half-way through.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from sqlalchemy.engine import Connection, Engine

from fastrecover.errors import StoreError
from fastrecover.store.engine import BEGIN_OPTION, is_sqlite_memory, mask_url, translate_errors


class StoreTransactions:
    """A store's engines and the transaction of each call; safe to share between threads."""

    def __init__(self, engine: Engine, url: str) -> None:
        self._engine = engine
        self._writer = engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
        self._url = mask_url(url)
        # An in-memory SQLite database is one shared connection: serialize its users.
        self._lock: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if is_sqlite_memory(engine.url) else contextlib.nullcontext()
        )
        self._closed = False
        #: the connection of a :meth:`transaction` open on this thread, which the calls inside share
        self._bound = threading.local()

    @property
    def url(self) -> str:
        """The store URL with the password masked."""
        return self._url

    @property
    def engine(self) -> Engine:
        return self._engine

    def close(self) -> None:
        """Release pooled connections (and the SQLite file handles)."""
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    @contextlib.contextmanager
    def _tx(self, action: str, *, write: bool = False) -> Iterator[Connection]:
        """The connection of one store call: the thread's :meth:`transaction` if one is open, else its own.

        Every read and write of the layers above goes through here, so driver errors become ours
        (``action`` names the call in them) and a closed store refuses every call alike.
        """
        if self._closed:
            raise StoreError(f"range store {self._url} is closed")
        bound: Connection | None = getattr(self._bound, "conn", None)
        if bound is not None:  # inside transaction(): the outer one commits or rolls back
            with translate_errors(self._url, action):
                yield bound
            return
        engine = self._writer if write else self._engine
        with self._lock, translate_errors(self._url, action), engine.begin() as conn:
            yield conn

    @contextlib.contextmanager
    def transaction(self, action: str) -> Iterator[None]:
        """Make the calls of this thread inside the block ONE write transaction: all stored, or none.

        Recovery persists the ranges of every partition it was given at once:
        one commit (one fsync on SQLite) instead of one per partition and call.
        A StoreError inside rolls everything back, so the caller must treat
        every call made in the block as not done.  Nested blocks join the outer one.
        """
        if getattr(self._bound, "conn", None) is not None:
            yield
            return
        with self._tx(action, write=True) as conn:
            self._bound.conn = conn
            try:
                yield
            finally:
                self._bound.conn = None
