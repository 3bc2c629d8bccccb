"""The streaming source's mirror of committed offsets into the range store, on its own thread.

Spark's checkpoint is the authority on what a query has delivered; the store
only mirrors it (the query's initial offset and its still-pending backfill
ranges, for ``fastrecover status`` and the operators).  So the mirror must
never slow down or fail the query: :meth:`CommitMirror.submit` hands the newest
committed offset to a background thread, off Spark's trigger loop, which keeps
only the newest one when the store is slower than the batches, and a store
problem is logged while the query goes on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from fastrecover.errors import FastRecoverError
from fastrecover.spark.offsets import SourceOffset

log = logging.getLogger("fastrecover.spark")


class CommitMirror:
    """Writes committed offsets to the store on its own thread; only the newest one matters."""

    def __init__(self, query: str, state: Callable[[], Any]) -> None:
        """``state`` opens (once) and returns the query's SparkState; it is called on the mirror thread."""
        self._query = query
        self._state = state
        self._cond = threading.Condition()
        self._latest: SourceOffset | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="fastrecover-commit-mirror", daemon=True)
        self._thread.start()

    def submit(self, offset: SourceOffset) -> None:
        """Mirror ``offset`` soon; a newer submit before the thread gets to it replaces it."""
        with self._cond:
            self._latest = offset
            self._cond.notify()

    def close(self, timeout_s: float) -> None:
        """Write what was submitted last, then stop the thread (waiting at most ``timeout_s``)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("query %r: the store mirror did not finish within %.0f s", self._query, timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._latest is None and not self._closing:
                    self._cond.wait()
                offset, self._latest = self._latest, None
                closing = self._closing
            if offset is not None:
                self._write(offset)
            if closing and offset is None:
                return

    def _write(self, offset: SourceOffset) -> None:
        # In Spark's planning process this code was pickled by value (fastrecover.spark.register): its
        # classes are copies, so the store side gets the offset as JSON, parsed by the real modules, and
        # the store's errors are caught as the real classes.
        from fastrecover.errors import FastRecoverError as StoreSideError
        from fastrecover.spark.offsets import SourceOffset as StoreSideOffset

        try:
            state = self._state()
            state.record_commit(self._query, offset.dumps())
            state.mirror_pending(self._query, StoreSideOffset.from_json(offset.dumps()))
        except (StoreSideError, FastRecoverError) as exc:
            log.warning("query %r: could not record committed offset in the store: %s", self._query, exc)
        except Exception:  # a mirror bug must not kill the thread and silently stop mirroring
            log.exception("query %r: recording the committed offset failed", self._query)
