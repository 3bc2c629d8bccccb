"""The child's commit log, written behind: range progress to the store.

An asynchronous commit of backfilled records (``commit(asynchronous=True)``,
auto-commit, ``store_offsets`` + auto-commit) only marks progress in the
:class:`~fastrecover.book.RangeBook`.  Every ``interval`` the dirty ranges are
written in **one** store transaction by a background writer thread, off the
caller's path; a synchronous commit writes everything pending and returns only
once the store has it.  This is the contract librdkafka gives for Kafka's own
asynchronous commits: a crash loses at most progress not yet written, which
means re-delivery, never loss.

The book stays on the caller's thread: the writer only sees an immutable
snapshot (a list of :class:`~fastrecover.store.ProgressUpdate`) and hands its
result back; :meth:`RangeCommitter.collect` applies results on the caller's
thread and reports them through the application's ``on_commit``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, TopicPartition

from fastrecover import hooks
from fastrecover.book import Held, RangeBook
from fastrecover.errors import FencedError, StoreError, StoreUnavailableError
from fastrecover.metrics import LatencyRecorder
from fastrecover.store import CommitResult, ProgressUpdate
from fastrecover.tokens import TopicPartitionKey

if TYPE_CHECKING:
    from fastrecover.store import RangeStore

log = logging.getLogger("fastrecover.committer")

#: what the bound on a store wait counts for a statement when its timeout is off (0)
_UNBOUNDED_STATEMENT_MS = 30_000
#: room for a connection, its pre-ping and the commit around the statements of one transaction
_CONNECT_SLACK_S = 5.0


class StoreLink:
    """The store handle, opened lazily and re-tried after a back-off when it is down.

    A consumer starts opening it on a thread at construction (:meth:`open_in_background`):
    importing SQLAlchemy and checking the schema take longer than a group join, and a recovery
    whose lags a replay covers need not wait for them (see ``Recoverer.recover``).
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
        #: a write that did not answer within the bound: until it ends, the store counts as down
        self._stalled: threading.Event | None = None
        # The longest a healthy transaction takes: a lock wait, a statement, and room for the connection.
        # A store that keeps a caller waiting longer has stopped answering (a network that froze
        # rather than failed: the server-side timeouts never see the statement).
        statement_s = (statement_timeout_ms or _UNBOUNDED_STATEMENT_MS) / 1000.0
        self.wait_s = lock_timeout_ms / 1000.0 + statement_s + _CONNECT_SLACK_S
        self._opening: threading.Thread | None = None
        self._opened = threading.Event()
        self._open_error: BaseException | None = None
        self._open_lock = threading.Lock()
        self._open_slow = False

    def open_in_background(self) -> None:
        """Start opening the store on a thread; the first :meth:`get` waits for it (bounded)."""
        if self._store is not None or self._opening is not None:
            return
        self._opened.clear()
        self._opening = threading.Thread(target=self._open_now, name="fastrecover-store-open", daemon=True)
        self._opening.start()

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
            self._retry_at = time.monotonic() + self._backoff
            log.warning("range store unavailable (%s); fast recovery is off until it answers", error)
        elif error is not None:
            raise error  # a store behind in schema, a bad URL: the operator's to fix
        return True

    def get(self, force: bool = False) -> RangeStore | None:
        if self._opening is not None and not self._join_open():
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
            self._retry_at = time.monotonic() + self._backoff
            log.warning("range store unavailable (%s); fast recovery is off until it answers", exc)
        return self._store

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
            with contextlib.suppress(BaseException):  # closing: what the open raised no longer matters
                self._join_open()
        if self._store is not None:
            self._store.close()
            self._store = None


@dataclass
class _Job:
    updates: list[ProgressUpdate]
    store: RangeStore
    result: CommitResult | None = None
    error: StoreError | None = None
    done: threading.Event | None = None
    seconds: float = 0.0  # how long the store transaction took


def _run_job(store: RangeStore, job: _Job) -> None:
    """One store transaction for ``job``: its result or its error, and how long it took."""
    began = time.perf_counter()
    try:
        job.result = store.commit_progress(job.updates)
    except StoreError as exc:
        job.error = exc
    except Exception as exc:  # never let a job go unanswered (the writer thread must not die)
        job.error = StoreError(f"range commit failed: {exc!r}")
        job.error.__cause__ = exc
    finally:
        job.seconds = time.perf_counter() - began


class _Writer:
    """One daemon thread that runs store transactions handed to it, one at a time."""

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue[tuple[RangeStore, _Job] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="fastrecover-range-writer", daemon=True)
        self._thread.start()

    def submit(self, store: RangeStore, job: _Job) -> None:
        job.done = threading.Event()
        self._inbox.put((store, job))

    def _run(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            store, job = item
            try:
                _run_job(store, job)
            finally:
                assert job.done is not None
                job.done.set()

    def stop(self, timeout: float) -> None:
        self._inbox.put(None)
        self._thread.join(timeout)


class RangeCommitter:
    """Commits range progress: write-behind for asynchronous commits, at once for synchronous ones."""

    def __init__(
        self,
        book: RangeBook,
        link: StoreLink,
        owner: str,
        *,
        interval_s: float,
        on_commit: Callable[[Any, list[TopicPartition]], None] | None,
        on_fenced: Callable[[int], None],
    ) -> None:
        self._book = book
        self._link = link
        self._owner = owner
        self._interval = interval_s
        self._on_commit = on_commit
        self._on_fenced = on_fenced
        self._writer: _Writer | None = None
        self._inflight: _Job | None = None
        self._next_flush = 0.0
        self.settled_keys: set[TopicPartitionKey] = set()
        self.finished_keys: set[TopicPartitionKey] = set()
        self.commits = 0
        self.failures = 0
        self.ranges_done = 0
        self.fencings = 0
        self.latency = LatencyRecorder()

    # ---- write-behind ------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Apply what the writer finished; start the next write when one is due."""
        self.collect()
        if now >= self._next_flush and self._inflight is None:
            self._next_flush = now + self._interval
            self.flush_async()

    def flush_async(self, keys: Iterable[TopicPartitionKey] | None = None) -> None:
        if self._inflight is not None:
            return  # the next tick writes what this one would have
        updates = self._updates(keys)
        if not updates:
            return
        store = self._link.get()
        if store is None:
            return  # kept in the book; written once the store answers
        self._inflight = _Job(updates, store)
        self._writer_thread().submit(store, self._inflight)

    def collect(self, wait: float = 0.0) -> None:
        job = self._inflight
        if job is None or job.done is None or not job.done.wait(wait):
            return
        self._inflight = None
        self._apply(job, raise_errors=False)

    # ---- synchronous -------------------------------------------------------------------------

    def flush_sync(
        self, keys: Iterable[TopicPartitionKey] | None = None, raise_errors: bool = True
    ) -> list[TopicPartition]:
        """Write every pending progress of ``keys`` now; returns the ranges' committed offsets."""
        job = self._sync_job(keys, raise_errors)
        if job is None:
            return []
        self._writer_thread().submit(job.store, job)  # on the writer: a hung driver call cannot hold the caller
        return self.finish_sync(job, raise_errors=raise_errors)

    def begin_sync(self, keys: Iterable[TopicPartitionKey] | None = None) -> _Job | None:
        """Start writing every pending progress of ``keys`` on the writer thread; :meth:`finish_sync` waits.

        A synchronous commit that also commits to Kafka overlaps the two round
        trips: the store transaction runs while the caller waits on Kafka, so
        the commit costs the slower of the two, not their sum.  Raises
        StoreUnavailableError, before anything is sent, when the store is down.
        """
        job = self._sync_job(keys, raise_errors=True)
        if job is not None:
            self._writer_thread().submit(job.store, job)
        return job

    def finish_sync(self, job: _Job, raise_errors: bool = True) -> list[TopicPartition]:
        """Wait for a :meth:`begin_sync` write and apply it; returns the ranges' committed offsets."""
        if not self._await(job, raise_errors):
            return []
        return self._apply(job, raise_errors=raise_errors)

    def _await(self, job: _Job, raise_errors: bool) -> bool:
        """Wait for ``job`` at most the link's bound; past it the store counts as down until the job ends.

        The job stays in flight: its result, whenever it comes, is applied by a later tick, so
        progress becomes durable only when the store has it.  Until then nothing else waits on
        the store (recovery, hand-back and release skip it, as for a store that is down).
        """
        assert job.done is not None
        if job.done.wait(self._link.wait_s):
            if self._inflight is job:
                self._inflight = None
            return True
        self._inflight = job
        self._link.stalled(job.done)
        self.failures += 1
        err = StoreUnavailableError(
            f"the range store did not answer within {self._link.wait_s:g} s (fastrecover.store.lock.timeout.ms "
            f"+ statement.timeout.ms + {_CONNECT_SLACK_S:g} s); {len(job.updates)} range commits stay pending "
            "and are written once it answers"
        )
        log.error("%s", err)
        self._report(err, [])
        if raise_errors:
            raise err
        return False

    def _sync_job(self, keys: Iterable[TopicPartitionKey] | None, raise_errors: bool) -> _Job | None:
        inflight = self._inflight
        if inflight is not None and (self._link.is_stalled or not self._await(inflight, raise_errors)):
            if raise_errors:
                raise StoreUnavailableError("the range store has not answered an earlier write; nothing was sent")
            return None
        if inflight is not None:
            self._apply(inflight, raise_errors=False)
        updates = self._updates(keys)
        if not updates:
            return None
        store = self._link.get(force=True)
        if store is None:
            err = StoreUnavailableError(f"range store unavailable; {len(updates)} backfill commits kept for retry")
            log.error("%s", err)
            if raise_errors:
                raise err
            return None
        return _Job(updates, store)

    def _updates(self, keys: Iterable[TopicPartitionKey] | None) -> list[ProgressUpdate]:
        dirty: list[Held] = self._book.dirty(keys)
        return [ProgressUpdate(h.token.id, self._owner, h.token.epoch, h.pending, h.skipped) for h in dirty]

    def _apply(self, job: _Job, raise_errors: bool) -> list[TopicPartition]:
        self.latency.observe(job.seconds)
        if job.error is not None:
            self.failures += 1
            if isinstance(job.error, StoreUnavailableError):
                self._link.failed()
            log.error("backfill commit of %d ranges failed, kept for retry: %s", len(job.updates), job.error)
            self._report(job.error, [])
            if raise_errors:
                raise job.error
            return []
        result = job.result
        assert result is not None
        self.commits += 1
        # A result answers the claim it was written under: a range claimed again since (the same
        # partitions assigned again, or lost and assigned back) is held at a newer epoch, which an
        # old write neither fences nor settles.
        sent = {u.token_id: u.epoch for u in job.updates}
        for token_id in result.fenced:
            if not self._held_at(token_id, sent.get(token_id)):
                continue
            self.fencings += 1
            self._book.remove(token_id)
            self._on_fenced(token_id)
            log.warning("range #%d was taken over by another owner (fenced); dropping it here", token_id)
        out = []
        for token in result.tokens:
            if not self._held_at(token.id, token.epoch):
                continue
            self._book.settle(token)
            self.settled_keys.add(token.key)
            out.append(TopicPartition(token.topic, token.partition, token.progress.committed))
            if token.progress.done:
                self.ranges_done += 1
                self.finished_keys.add(token.key)
                log.info(
                    "range #%d [%d, %d) of %s is done",
                    token.id,
                    token.progress.start,
                    token.progress.end,
                    token.key,
                )
        self._report(None, out)
        if result.fenced and raise_errors:
            raise FencedError(f"ranges {sorted(result.fenced)} are held by another owner; not committed here")
        return out

    def _held_at(self, token_id: int, epoch: int | None) -> bool:
        """Whether the book holds range ``token_id`` at ``epoch`` (a result of an older claim: not)."""
        held = self._book.get(token_id)
        if held is None or held.token.epoch == epoch:
            return True
        log.debug(
            "range #%d: a result for epoch %s ignored, the range is held at epoch %d", token_id, epoch, held.token.epoch
        )
        return False

    def _report(self, error: StoreError | None, tps: list[TopicPartition]) -> None:
        """Tell the application's on_commit, the way librdkafka reports Kafka commits."""
        if self._on_commit is None or (error is None and not tps):
            return
        kafka_error = None if error is None else KafkaError(KafkaError._FAIL, f"range store commit failed: {error}")
        self._on_commit(kafka_error, tps)

    def _writer_thread(self) -> _Writer:
        if self._writer is None:
            self._writer = _Writer()
        return self._writer

    def close(self, timeout: float = 10.0) -> None:
        if self._link.is_stalled:
            timeout = 0.0  # a write hangs on a store that stopped answering: waiting more cannot help
        if self._inflight is not None:
            self.collect(wait=timeout)
        if self._writer is not None:
            self._writer.stop(timeout)
            self._writer = None
