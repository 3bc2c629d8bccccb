"""The child consumer: a thread that owns a second confluent_kafka.Consumer and backfills ranges.

It never joins the group (assign() only) and never commits to Kafka: the
primary's thread decides what is done and commits it to the store.  The child
only reads.  Everything crossing the thread boundary goes through this class's
locked inbox (commands) and outbox (records and events), so neither consumer is
ever touched by the other thread.

Back-pressure: when the outbox holds ``queue_max`` records the child pauses all
its partitions and resumes them once the outbox has drained to half; memory is
bounded by the outbox plus librdkafka's (reduced) prefetch queue.  ("Pauses"
means it stops calling consume(), not Consumer.pause(): librdkafka drops a
paused partition's prefetched records and a resumed one takes ~0.8 s to flow
again, which cut backfill to a few thousand records/s.  Unread, librdkafka's
own queue limits stop its fetching.)
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer as _KafkaConsumer
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from fastrecover.tokens import TopicPartitionKey

log = logging.getLogger("fastrecover.child")

_IDLE_WAIT_S = 0.5
_CONSUME_TIMEOUT_S = 0.1


@dataclass
class RangeWork:
    """What the child needs to read one range: where to start, where to stop, what to skip."""

    token_id: int
    key: TopicPartitionKey
    next_offset: int
    end: int
    skip: frozenset[int] = field(default_factory=frozenset)


@dataclass(frozen=True)
class SkipEvent:
    """Retention removed ``[from, low)`` of a range before it was read."""

    token_id: int
    low: int


@dataclass(frozen=True)
class GapEvent:
    """Offsets in ``[start, end)`` of a range hold no record (compaction, transaction markers)."""

    token_id: int
    start: int
    end: int


ChildEvent = SkipEvent | GapEvent


def _key_of(msg: Message) -> TopicPartitionKey:
    return TopicPartitionKey(msg.topic() or "", msg.partition() or 0)


class BackfillChild:
    """One standby/backfilling child thread and the consumer it owns."""

    def __init__(
        self,
        conf: dict[str, Any],
        *,
        queue_max: int,
        batch_size: int,
        consumer_factory: Callable[[dict[str, Any]], Any] = _KafkaConsumer,
        name: str = "fastrecover-child",
    ) -> None:
        self._conf = conf
        self._queue_max = queue_max
        self._batch_size = batch_size
        self._factory = consumer_factory
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._commands: deque[tuple[str, Any]] = deque()
        self._outbox: deque[tuple[int, Message]] = deque()
        self._events: list[ChildEvent] = []
        self._stopping = False
        self.failure: BaseException | None = None
        self.records_delivered = 0
        self.backpressured = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # ---- called from the primary's thread -------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def add(self, work: Iterable[RangeWork]) -> None:
        items = list(work)
        if items:
            self._command("add", items)

    def drop(self, keys: Iterable[TopicPartitionKey], timeout: float) -> bool:
        """Stop reading these partitions; True once the child acknowledged it."""
        key_set = set(keys)
        if not key_set:
            return True
        done = threading.Event()
        self._command("drop", (key_set, done))
        with self._lock:
            self._outbox = deque(item for item in self._outbox if _key_of(item[1]) not in key_set)
        return done.wait(timeout) if self.is_alive() else True

    def drop_range(self, token_id: int) -> None:
        self._command("drop_range", token_id)
        with self._lock:
            self._outbox = deque(item for item in self._outbox if item[0] != token_id)

    def pause(self, keys: Iterable[TopicPartitionKey]) -> None:
        self._command("pause", set(keys))

    def resume(self, keys: Iterable[TopicPartitionKey]) -> None:
        self._command("resume", set(keys))

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def pending(self) -> int:
        return len(self._outbox)

    def take(self, limit: int) -> list[tuple[int, Message]]:
        """Up to ``limit`` backfill records, oldest first; never blocks."""
        if not self._outbox:
            return []
        with self._cond:
            count = min(limit, len(self._outbox))
            items = [self._outbox.popleft() for _ in range(count)]
            if len(self._outbox) <= self._queue_max // 2:
                self._cond.notify_all()
            return items

    def drain_events(self) -> list[ChildEvent]:
        if not self._events:
            return []
        with self._lock:
            events, self._events = self._events, []
            return events

    def _events_append(self, event: ChildEvent) -> None:
        with self._lock:
            self._events.append(event)

    def _command(self, verb: str, arg: Any) -> None:
        with self._cond:
            self._commands.append((verb, arg))
            self._cond.notify_all()

    # ---- the child thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            _Reader(self).run()
        except BaseException as exc:  # the primary restarts us; record why we died
            self.failure = exc
            log.error("child consumer thread died: %r; it will be restarted on the next poll()", exc)


class _Reader:
    """State that only the child thread touches: its consumer and per-partition work queues."""

    def __init__(self, child: BackfillChild) -> None:
        self.child = child
        self.consumer: Any = None
        self.work: dict[TopicPartitionKey, deque[RangeWork]] = {}
        self.last_read: dict[TopicPartitionKey, int] = {}
        self.user_paused: set[TopicPartitionKey] = set()
        self.bp_paused = False
        # (topic, partition) -> the key object self.work holds: the hot loop then builds no
        # dataclass per record and dict lookups hit by identity (no dataclass __eq__)
        self._keys: dict[tuple[str | None, int | None], TopicPartitionKey] = {}

    def _key(self, msg: Message) -> TopicPartitionKey:
        key = self._keys.get((msg.topic(), msg.partition()))
        return key if key is not None else _key_of(msg)

    def run(self) -> None:
        child = self.child
        self.consumer = child._factory(child._conf)
        try:
            while True:
                with child._cond:
                    if child._stopping:
                        return
                    commands = list(child._commands)
                    child._commands.clear()
                    full = len(child._outbox) >= child._queue_max
                    low = len(child._outbox) <= child._queue_max // 2
                    if not commands and (not self.work or (self.bp_paused and not low)):
                        child._cond.wait(_IDLE_WAIT_S)
                        continue
                for verb, arg in commands:
                    getattr(self, "_cmd_" + verb)(arg)
                if not self.work:
                    self.bp_paused = False
                    continue
                if full and not self.bp_paused:
                    self.bp_paused = True
                    log.debug("child queue full (%d records): reading paused", len(child._outbox))
                elif self.bp_paused and low:
                    self.bp_paused = False
                child.backpressured = self.bp_paused
                if self.bp_paused:
                    continue
                messages = self.consumer.consume(child._batch_size, _CONSUME_TIMEOUT_S)
                if messages:
                    self._handle(messages)
        finally:
            try:
                self.consumer.close()
            except (KafkaException, RuntimeError) as exc:
                log.debug("closing child consumer: %r", exc)

    # -- commands

    def _cmd_add(self, items: list[RangeWork]) -> None:
        for item in sorted(items, key=lambda w: w.next_offset):
            if item.next_offset >= item.end:
                continue
            queue = self.work.get(item.key)
            if queue is None:
                self.work[item.key] = deque([item])
                self._keys[(item.key.topic, item.key.partition)] = item.key
                self._start(item)
            elif all(w.token_id != item.token_id for w in queue):
                queue.append(item)
                ordered = sorted(queue, key=lambda w: w.next_offset)
                queue.clear()
                queue.extend(ordered)

    def _cmd_drop(self, arg: tuple[set[TopicPartitionKey], threading.Event]) -> None:
        keys, done = arg
        present = [k for k in keys if k in self.work]
        for key in present:
            del self.work[key]
        self._unassign(present)
        done.set()

    def _cmd_drop_range(self, token_id: int) -> None:
        for key, queue in list(self.work.items()):
            if queue and queue[0].token_id == token_id:
                queue.popleft()
                self._advance(key)
            else:
                for w in list(queue):
                    if w.token_id == token_id:
                        queue.remove(w)

    def _cmd_pause(self, keys: set[TopicPartitionKey]) -> None:
        self.user_paused |= keys
        self._set_paused([k for k in keys if k in self.work], True)

    def _cmd_resume(self, keys: set[TopicPartitionKey]) -> None:
        self.user_paused -= keys
        self._set_paused([k for k in keys if k in self.work], False)

    # -- reading

    def _start(self, item: RangeWork) -> None:
        """Assign the partition at the range's next offset, skipping what retention removed."""
        tp = TopicPartition(item.key.topic, item.key.partition)
        low, _high = self.consumer.get_watermark_offsets(tp, timeout=10)
        if item.next_offset < low:
            self.child._events_append(SkipEvent(item.token_id, low))
            item.next_offset = low
            if item.next_offset >= item.end:
                self._finish_head(item.key)
                return
        self.last_read[item.key] = item.next_offset - 1
        self.consumer.incremental_assign([TopicPartition(item.key.topic, item.key.partition, item.next_offset)])
        if item.key in self.user_paused:
            self._set_paused([item.key], True)

    def _advance(self, key: TopicPartitionKey) -> None:
        """The head range of ``key`` is read; move to the next range or let the partition go."""
        queue = self.work.get(key)
        self._unassign([key])
        if not queue:
            self.work.pop(key, None)
            return
        self._start(queue[0])

    def _finish_head(self, key: TopicPartitionKey) -> None:
        queue = self.work[key]
        queue.popleft()
        if not queue:
            del self.work[key]
            return
        self._start(queue[0])

    def _handle(self, messages: list[Message]) -> None:
        child = self.child
        accepted: list[tuple[int, Message]] = []
        events: list[ChildEvent] = []
        finished: list[TopicPartitionKey] = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                self._on_error(msg, err)
                continue
            key = self._key(msg)
            queue = self.work.get(key)
            if not queue or key in finished:
                continue
            head = queue[0]
            offset = msg.offset() or 0
            if offset < head.next_offset:
                continue
            last = self.last_read.get(key, head.next_offset - 1)
            gap_end = min(offset, head.end)
            if gap_end > last + 1:
                events.append(GapEvent(head.token_id, last + 1, gap_end))
            if offset >= head.end:
                finished.append(key)
                continue
            self.last_read[key] = offset
            head.next_offset = offset + 1
            if offset not in head.skip:
                accepted.append((head.token_id, msg))
            if head.next_offset >= head.end:
                finished.append(key)
        with child._cond:
            child._outbox.extend(accepted)
            child._events.extend(events)
            child.records_delivered += len(accepted)
        for key in finished:
            queue = self.work.get(key)
            if queue:
                log.info("child finished reading range #%d of %s", queue[0].token_id, key)
                queue.popleft()
                self._advance(key)

    def _on_error(self, msg: Message, err: KafkaError) -> None:
        if err.code() == KafkaError._AUTO_OFFSET_RESET and msg.topic() is not None:
            key = _key_of(msg)
            queue = self.work.get(key)
            if queue:
                log.warning("child: %s offset out of range (%s); re-checking the log start", key, err.str())
                self._unassign([key])
                self._start(queue[0])
            return
        if err.fatal():
            raise KafkaException(err)
        log.warning("child consumer error: %s", err.str())

    def _unassign(self, keys: Iterable[TopicPartitionKey]) -> None:
        tps = [TopicPartition(k.topic, k.partition) for k in keys]
        assigned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        tps = [tp for tp in tps if (tp.topic, tp.partition) in assigned]
        if tps:
            self.consumer.incremental_unassign(tps)
        for k in keys:
            self.last_read.pop(k, None)

    def _set_paused(self, keys: Iterable[TopicPartitionKey], paused: bool) -> None:
        assigned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        tps = [TopicPartition(k.topic, k.partition) for k in keys if (k.topic, k.partition) in assigned]
        if tps:
            (self.consumer.pause if paused else self.consumer.resume)(tps)
