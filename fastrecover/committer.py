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

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, TopicPartition

from fastrecover.book import Held, RangeBook
from fastrecover.errors import FencedError, StoreError, StoreUnavailableError
from fastrecover.latency import LatencyRecorder
from fastrecover.store import CommitResult, ProgressUpdate
from fastrecover.store_link import CONNECT_SLACK_S, StoreLink
from fastrecover.tokens import TopicPartitionKey
from fastrecover.values import record

if TYPE_CHECKING:
    from fastrecover.store import RangeStore

__all__ = ["RangeCommitter", "StoreLink"]  # StoreLink: its home is fastrecover.store_link

log = logging.getLogger("fastrecover.committer")


@record
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

    def take_settled(self) -> set[TopicPartitionKey]:
        """Partitions whose ranges the store settled since the last call (their mirrors changed)."""
        keys, self.settled_keys = self.settled_keys, set()
        return keys

    def take_finished(self) -> set[TopicPartitionKey]:
        """Partitions with a range that finished since the last call."""
        keys, self.finished_keys = self.finished_keys, set()
        return keys

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
            f"+ statement.timeout.ms + {CONNECT_SLACK_S:g} s); {len(job.updates)} range commits stay pending "
            "and are written once it answers"
        )
        log.error("%s", err)
        self._report(err, [])
        if raise_errors:
            raise err
        return False

    def _sync_job(self, keys: Iterable[TopicPartitionKey] | None, raise_errors: bool) -> _Job | None:
        keys = None if keys is None else list(keys)  # read twice below
        inflight = self._inflight
        if inflight is not None and (self._link.is_stalled or not self._await(inflight, raise_errors)):
            if raise_errors:
                raise StoreUnavailableError("the range store has not answered an earlier write; nothing was sent")
            return None
        if inflight is not None:
            self._apply(inflight, raise_errors=False)
        if raise_errors and self._book.has_early and (early := self._book.early_dirty(keys)):
            # the store's part of their recovery could not run (it is down): their progress is in memory only
            raise StoreUnavailableError(
                f"range store unavailable; {len(early)} ranges read while it opened keep their commits in "
                "memory (a crash reads them again from their start) until it answers"
            )
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
