"""Counting what a consumer process sends to its range store, through SQLAlchemy's engine events.

The partitions benchmark reports store writes beside rows: a recovery that
writes one statement per partition scales differently from one that writes a
batch.  The counter listens on the ``Engine`` class, so it sees every engine of
the process, the store's included, whichever thread opened it.

fastrecover imports SQLAlchemy in the thread that opens the store, off the path
to the first record; importing it here on the main thread would put that cost
back and distort the timings this counter sits beside.  :meth:`install_in_background`
therefore imports and registers from a thread of its own, and records when it
was ready: statements before that moment were not counted, and the driver
compares it with the moments it measures.  That thread still holds the GIL for most
of the import's 0.1 s, so a run timed from its spawn counts nothing: the partitions
benchmark counts only in its arm that subscribes once the store has opened.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

#: Statement counts of one snapshot: ``statements`` (cursor executions), ``parameter_sets`` (rows an
#: executemany sent; 1 for a plain execute), ``commits`` (transactions committed), and one ``kind:<WORD>``
#: per leading SQL keyword (``kind:INSERT``, ``kind:UPDATE``, ``kind:SELECT``...).
Snapshot = dict[str, int]


def kind_of(statement: str) -> str:
    """The statement's leading SQL keyword, upper-cased (``WITH`` for a CTE; ``?`` when there is none)."""
    words = statement.lstrip(" \t\r\n(").split(None, 1)
    return words[0].upper() if words else "?"


def parameter_sets(parameters: Any, executemany: bool) -> int:
    """How many rows of parameters one cursor execution carried."""
    if executemany and isinstance(parameters, list | tuple):
        return len(parameters)
    return 1


def delta(after: Mapping[str, int], before: Mapping[str, int]) -> Snapshot:
    """What was counted between two snapshots (keys with no change left out, none negative)."""
    out: Snapshot = {}
    for key in sorted(set(after) | set(before)):
        diff = int(after.get(key, 0)) - int(before.get(key, 0))
        if diff:
            out[key] = diff
    return out


def writes(counts: Mapping[str, int]) -> int:
    """Statements that change rows (INSERT, UPDATE, DELETE) in a snapshot or a delta."""
    return sum(int(counts.get(f"kind:{k}", 0)) for k in ("INSERT", "UPDATE", "DELETE"))


class StatementCounter:
    """Counts cursor executions and commits of every SQLAlchemy engine in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        #: wall-clock time the listeners were registered (None until then)
        self.installed_at: float | None = None
        self.error: str | None = None

    def _on_execute(
        self, _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, executemany: bool
    ) -> None:
        with self._lock:
            self._counts["statements"] += 1
            self._counts["parameter_sets"] += parameter_sets(parameters, executemany)
            self._counts[f"kind:{kind_of(statement)}"] += 1

    def _on_commit(self, _conn: Any) -> None:
        with self._lock:
            self._counts["commits"] += 1

    def install(self) -> None:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.listen(Engine, "before_cursor_execute", self._on_execute)
        event.listen(Engine, "commit", self._on_commit)
        self.installed_at = time.time()

    def install_in_background(self) -> threading.Thread:
        def run() -> None:
            try:
                self.install()
            except Exception as exc:  # counted figures become n/a; the run itself goes on
                self.error = f"{type(exc).__name__}: {exc}"

        thread = threading.Thread(target=run, name="bench-statement-counter", daemon=True)
        thread.start()
        return thread

    def snapshot(self) -> Snapshot:
        with self._lock:
            return dict(self._counts)
