"""The child consumer: a second ``confluent_kafka.Consumer`` handle that backfills ranges.

It never joins the group (``assign()`` only) and never commits to Kafka: the store is its commit
log.  No thread of ours is behind it: librdkafka fetches in its own threads, and ``poll()`` and
``consume()`` drain this handle without blocking, from the caller's thread, next to the primary,
a batch at a time, with no per-record hand-off between Python threads.

Back-pressure is librdkafka's own: nobody reads the handle while the application is busy, so its
prefetch queue fills up to ``queued.max.messages.kbytes`` and fetching stops.

Each partition reads one range at a time (its *head*).  Records of a partition arrive in offset
order, so a fetched batch is cut at the head's end with a bisect.  A fetched record counts as
delivered only once :meth:`ChildReader.take` hands it to the application; records still buffered
when a partition is paused, sought or revoked are given back by seeking the handle to the head's
delivery cursor, so none is skipped.

The client calls sit in :class:`~fastrecover.child_handle.ChildHandle`, the records fetched and not
handed out in :class:`~fastrecover.child_buffer.FetchBuffer`.  A call on the handle that fails is
the child's failure, never its caller's (:meth:`ChildReader._guard`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover import hooks
from fastrecover.batches import ChildEvent, GapEvent, Run, SkipEvent, partition_runs
from fastrecover.book import RangeWork
from fastrecover.child_buffer import FetchBuffer
from fastrecover.child_handle import ChildHandle
from fastrecover.tokens import TopicPartitionKey

log = logging.getLogger("fastrecover.child")


class ChildReader:
    """The standby/backfilling child: its handle, per-partition range queues, a small buffer (caller's thread only)."""

    def __init__(
        self,
        conf: dict[str, Any],
        *,
        batch_size: int,
        broker_timeout_s: float,
        consumer_factory: Callable[[dict[str, Any]], Any] = _KafkaConsumer,
        first_handle: Any = None,
    ) -> None:
        self._h = ChildHandle(conf, broker_timeout_s=broker_timeout_s, factory=consumer_factory)
        if first_handle is not None:  # made from ``conf`` at construction (Consumer.__init__): it connects early
            self._h.adopt(first_handle)
        self._batch = batch_size
        self._work: dict[TopicPartitionKey, deque[RangeWork]] = {}
        self._paused: set[TopicPartitionKey] = set()
        self._buffer = FetchBuffer()
        self._events: list[ChildEvent] = []
        self._finished: list[tuple[int, TopicPartitionKey]] = []
        self.failure: BaseException | None = None
        self.records_delivered = 0

    # ---- health --------------------------------------------------------------------------------

    def is_alive(self) -> bool:
        """True while a healthy handle exists (the KIP's childConsumerIsAlive)."""
        return self._h.is_open and self.failure is None

    @property
    def handles_created(self) -> int:
        return self._h.created

    @property
    def has_work(self) -> bool:
        return bool(self._work)

    def partitions(self) -> set[TopicPartitionKey]:
        return set(self._work)

    def buffered(self) -> int:
        return self._buffer.count()

    def set_credentials(self, username: str, password: str) -> None:
        self._h.set_credentials(username, password)

    # ---- work ----------------------------------------------------------------------------------

    def add(self, works: Iterable[RangeWork]) -> None:
        """Queue ranges; a partition reads its ranges one after the other, lowest first.  Queued whatever the
        handle does: a failed one is replaced at the next tick, and the new one starts every queue's head."""
        with self._guard():
            self._ensure_handle()
        heads: list[RangeWork] = []
        for item in sorted(works, key=lambda w: w.next_offset):
            if item.next_offset >= item.end:
                continue
            queue = self._work.get(item.key)
            if queue is None:
                self._work[item.key] = deque([item])
                heads.append(item)
            elif all(w.token_id != item.token_id for w in queue):  # behind the head being read, in order
                head, *rest = queue
                self._work[item.key] = deque([head, *sorted([*rest, item], key=lambda w: w.next_offset)])
        if heads and self.failure is None:
            with self._guard():
                fetching = self._h.assigned()  # asked once: each call copies the whole assignment
                starts: list[RangeWork] = []
                for item in heads:  # no log-start round trip: a start retention removed comes back as an
                    # offset-out-of-range event (auto.offset.reset=error), and _on_error asks then
                    self._start(item, assigned=item.key in fetching, check_low=False, into=starts)
                self._h.assign([(w.key, w.next_offset) for w in starts], self._paused)

    def drop(self, keys: Iterable[TopicPartitionKey]) -> None:
        """Partitions leave this member: forget their ranges and buffered records."""
        gone = [k for k in keys if k in self._work]
        if not gone:
            return
        self._purge(set(gone), rewind=False)
        for key in gone:
            del self._work[key]
        with self._guard():
            self._h.unassign(gone)

    def drop_range(self, token_id: int) -> None:
        """A range was fenced or finished elsewhere: stop reading it."""
        for key, queue in list(self._work.items()):
            if queue and queue[0].token_id == token_id:
                self._purge({key}, rewind=False)
                queue.popleft()
                with self._guard():
                    self._next_range(key)
            else:
                for w in [w for w in queue if w.token_id == token_id]:
                    queue.remove(w)

    def rename(self, ids: dict[int, int]) -> None:
        """Early ranges the store took over (old id -> new id): read on from the cursor, under the new id."""
        for queue in self._work.values():
            for work in queue:
                work.token_id = ids.get(work.token_id, work.token_id)

    def pause(self, keys: Iterable[TopicPartitionKey]) -> None:
        keys = set(keys)
        self._paused |= keys
        mine = {k for k in keys if k in self._work}
        if mine:
            with self._guard():
                self._purge(mine, rewind=True)
                self._h.set_paused(mine, True)

    def resume(self, keys: Iterable[TopicPartitionKey]) -> None:
        keys = set(keys)
        self._paused -= keys
        mine = [k for k in keys if k in self._work]
        if mine:
            with self._guard():
                self._h.set_paused(mine, False)
                for key in mine:  # records fetched while paused were ignored: fetch them again
                    self._seek(self._work[key][0])

    def rewind(self, key: TopicPartitionKey, offset: int) -> bool:
        """An application seek to ``offset``: True when a range of this member holds it.

        Inside the range being read, delivery restarts at ``offset`` (backwards:
        re-delivery as with a plain seek; forwards: the records in between are
        skipped at the application's request and count as done).  Inside a later
        range nothing needs to move: it will be read from its start.
        """
        queue = self._work.get(key)
        if not queue:
            return False
        head = queue[0]
        if head.start <= offset < head.end:
            self._purge({key}, rewind=False)
            if offset > head.next_offset:
                self._events.append(GapEvent(head.token_id, head.next_offset, offset))
            head.next_offset = offset
            head.skip = frozenset(o for o in head.skip if o >= offset)
            head.fetched_all = False
            with self._guard():
                self._seek(head)
            return True
        return any(w.start <= offset < w.end for w in queue)

    def drain_events(self) -> list[ChildEvent]:
        events, self._events = self._events, []
        return events

    def drain_finished(self) -> list[tuple[int, TopicPartitionKey]]:
        """Ranges (token id, partition) whose every record has been handed out since the last call."""
        done, self._finished = self._finished, []
        return done

    # ---- reading -------------------------------------------------------------------------------

    @property
    def reading(self) -> bool:
        """True while some range still has records to fetch (not paused): worth waiting on."""
        return any(q and not q[0].fetched_all and k not in self._paused for k, q in self._work.items())

    def take(self, limit: int, wait: float = 0.0) -> tuple[list[Message], list[Run]]:
        """Up to ``limit`` backfill records, never blocking; with the runs they form per range.

        The handle is asked for ``batch size`` records at a time, as often as ``limit``
        needs and as long as librdkafka has records ready.  Records taken before a call on
        the handle failed are returned all the same (:meth:`_guard`).
        """
        out: list[Message] = []
        runs: list[Run] = []
        with self._guard():
            fetches = 0
            while len(out) < limit:
                if not self._buffer:
                    if fetches * self._batch >= limit or self.failure is not None:
                        break
                    if any(isinstance(e, SkipEvent) for e in self._events):
                        # retention moved a cursor: the caller must count the skip (drain_events)
                        # before records past it are handed out and stored
                        break
                    self._advance_read_heads()
                    if not self._work:
                        break
                    self._fetch(self._batch, wait if fetches == 0 else 0.0)
                    fetches += 1
                    if not self._buffer:
                        break  # nothing ready now
                self._buffer.hand_out(limit, out, runs)
        self.records_delivered += len(out)
        return out, runs

    def _fetch(self, count: int, wait: float = 0.0) -> None:
        try:
            msgs = self._h.consume(count, wait)
            hooks.fire("child-batch")
        except Exception as exc:
            self._fail(exc)
            return
        if not msgs:
            self._check_tails()
            return
        if any(map(Message.error, msgs)):
            msgs = self._split_errors(msgs)
            if not msgs:
                return
        for key, lo, hi in partition_runs(msgs):
            self._accept(key, msgs[lo:hi])

    def _accept(self, key: TopicPartitionKey, msgs: list[Message]) -> None:
        """Cut a partition's records at its head range's end; buffer what belongs to the range."""
        queue = self._work.get(key)
        if not queue or not msgs or key in self._paused:
            return  # a paused partition's records are fetched again on resume
        head = queue[0]
        if head.fetched_all:
            return  # the fetcher moved past the range; a seek to the next range is pending
        self._events.extend(GapEvent(head.token_id, start, end) for start, end in self._buffer.accept(head, msgs))

    def _advance_read_heads(self) -> None:
        """Heads fetched to their end and fully handed out are done: move to the next range."""
        for key in [k for k, q in self._work.items() if q and q[0].fetched_all]:
            queue = self._work[key]
            head = queue.popleft()
            log.info("child finished reading range #%d of %s", head.token_id, key)
            self._finished.append((head.token_id, key))
            self._next_range(key)

    def _next_range(self, key: TopicPartitionKey) -> None:
        queue = self._work.get(key)
        if queue:
            self._start(queue[0], check_low=False)
            return
        self._work.pop(key, None)
        self._h.unassign([key])

    def _check_tails(self) -> None:
        """Nothing fetched: a head whose position passed its end (its tail is markers) is read."""
        heads = [q[0] for k, q in self._work.items() if q and not q[0].fetched_all and k not in self._paused]
        if not heads:
            return
        positions = self._h.positions([w.key for w in heads])
        if positions is None:
            return
        for work, position in zip(heads, positions, strict=True):
            if position >= work.end:
                work.fetched_all = True
                if work.fetch_next < work.end:
                    self._events.append(GapEvent(work.token_id, work.fetch_next, work.end))
                    work.fetch_next = work.end

    def _split_errors(self, msgs: list[Message]) -> list[Message]:
        for msg in msgs:
            if (err := msg.error()) is not None:
                self._on_error(msg, err)
        return [m for m in msgs if m.error() is None]

    def _on_error(self, msg: Message, err: KafkaError) -> None:
        if err.code() == KafkaError._AUTO_OFFSET_RESET and msg.topic() is not None:
            key = TopicPartitionKey(msg.topic() or "", msg.partition() or 0)
            queue = self._work.get(key)
            if queue:
                log.warning("child: %s offset out of range (%s); re-checking the log start", key, err.str())
                self._start(queue[0])
            return
        if err.fatal():
            self._fail(KafkaException(err))
            return
        log.warning("child consumer error: %s", err.str())

    # ---- the handle ----------------------------------------------------------------------------

    def _ensure_handle(self) -> None:
        if self._h.is_open and self.failure is None:
            return
        self.failure = None
        self._h.open()
        starts: list[RangeWork] = []
        for queue in self._work.values():
            if queue:
                queue[0].fetched_all = False
                self._start(queue[0], assigned=False, into=starts)
        self._h.assign([(w.key, w.next_offset) for w in starts], self._paused)

    def cluster_id(self, topic: str) -> str | None:
        """The Kafka cluster's id, asked through the child's handle (created for it if need be)."""
        with self._guard():
            self._ensure_handle()
            return self._h.cluster_id(topic)
        return None

    def restart(self) -> None:
        """Replace a failed handle; every range resumes from its delivery cursor."""
        self._buffer.clear()
        with self._guard():
            self._ensure_handle()

    def _fail(self, exc: BaseException) -> None:
        log.error("child consumer failed: %r; it is replaced from the ranges' progress", exc)
        self.failure = exc
        self._buffer.clear()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """A call on the handle that raises makes the child fail; the next tick replaces the handle, which
        resumes every range from its cursor.  Raised, it cost the application the primary's records that
        ``consume()`` had taken before the child's, or (in a rebalance callback) confluent_kafka's batch.
        """
        try:
            yield
        except Exception as exc:
            self._fail(exc)

    def _start(
        self, work: RangeWork, assigned: bool | None = None, check_low: bool = True, into: list[RangeWork] | None = None
    ) -> None:
        """Point the handle at the range's delivery cursor, after what retention removed.

        The log start is asked for only when a fetch reported an offset out of range (or a new
        handle takes over): were a range's start gone, the child's ``auto.offset.reset=error``
        makes the fetch report it and come back here, so the common case costs no round trip.
        A partition to assign afresh joins ``into`` when given: the caller assigns them all in one call.
        """
        low = self._h.low_watermark(work.key) if check_low else None
        if low is not None and work.next_offset < low:
            self._events.append(SkipEvent(work.token_id, low))
            work.next_offset = low
            work.skip = frozenset(o for o in work.skip if o >= low)
            if work.next_offset >= work.end:
                work.fetched_all = True
                work.fetch_next = work.end
                return
        work.fetch_next = work.next_offset
        work.fetched_all = False
        if self._h.place(work.key, work.next_offset, assigned):
            return
        if into is None:
            self._h.assign([(work.key, work.next_offset)], self._paused)
        else:
            into.append(work)

    def _seek(self, work: RangeWork) -> None:
        work.fetch_next = work.next_offset
        if not self._h.place(work.key, work.next_offset, True):  # not fetching yet (just assigned): assign afresh
            self._start(work, assigned=False)

    def _purge(self, keys: set[TopicPartitionKey], rewind: bool) -> None:
        """Give back buffered records of ``keys``; with ``rewind`` the handle re-fetches them."""
        for work in self._buffer.purge(keys):
            if rewind:
                work.fetched_all = False
                self._seek(work)

    def close(self) -> None:
        """Close the handle explicitly (never leave a handle to the garbage collector)."""
        self._buffer.clear()
        self._work.clear()
        self._h.close()
