"""``fastrecover.Consumer``: confluent_kafka.Consumer with KIP-333 parallel rebalance.

With the mode off this is a transparent wrapper (every call goes straight to the
wrapped consumer).  With it on, this is the imperative shell around the pure
core: on every assignment it asks :mod:`fastrecover.recovery` what to do, writes
range tokens to the store *before* moving the primary to the log end, feeds the
ranges to the child thread (:mod:`fastrecover.child`), merges both record
streams in poll()/consume(), and routes commits to the two commit logs (Kafka
group offsets for the primary, the SQL store for the child).

Threading: the primary consumer is used only from the caller's thread (as with
confluent_kafka); the child consumer only from its own thread.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_INVALID, OFFSET_STORED, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka import Consumer as _KafkaConsumer

from fastrecover.book import Held, RangeBook
from fastrecover.child import BackfillChild, GapEvent, SkipEvent
from fastrecover.codec import decode_mirror
from fastrecover.config import child_config, is_cooperative, parse_bool, split_config
from fastrecover.errors import CodecError, FencedError, StateError, StoreError, StoreUnavailableError
from fastrecover.ranges import OffsetRange, RangeProgress, merged_committed, route_record, split_commit, subtract
from fastrecover.recovery import PartitionPlan, plan_partition
from fastrecover.store import ProgressUpdate, RangeStore, open_store
from fastrecover.tokens import Token, TopicPartitionKey

log = logging.getLogger("fastrecover.consumer")

RebalanceCallback = Callable[[Any, list[TopicPartition]], None]

#: Methods that behave exactly as the primary's in both modes.
_DELEGATED = (
    "assignment",
    "position",
    "seek",
    "get_watermark_offsets",
    "offsets_for_times",
    "list_topics",
    "memberid",
    "consumer_group_metadata",
    "set_sasl_credentials",
    "cluster_id",
)
#: With the mode off, every public method is the primary's own bound method.
_ALL_METHODS = (
    *_DELEGATED,
    "subscribe",
    "unsubscribe",
    "assign",
    "unassign",
    "incremental_assign",
    "incremental_unassign",
    "poll",
    "consume",
    "commit",
    "committed",
    "store_offsets",
    "pause",
    "resume",
)
_TICK_S = 0.1
_BROKER_TIMEOUT_S = 30.0
_WAIT_SLICE_S = 0.02


@dataclass(frozen=True)
class RecoveryReport:
    """What recovery did for one partition (kept for operators and tests)."""

    key: TopicPartitionKey
    committed: int | None
    log_end: int
    primary_start: int | None
    new_ranges: tuple[OffsetRange, ...]
    resumed: tuple[int, ...]
    degraded: bool


def _key(tp: TopicPartition | Message) -> TopicPartitionKey:
    if isinstance(tp, Message):
        return TopicPartitionKey(tp.topic() or "", tp.partition() or 0)
    return TopicPartitionKey(tp.topic, tp.partition)


def _last_offsets(msgs: list[Message]) -> dict[tuple[str | None, int | None], int | None]:
    """Offset of the last record of each partition in ``msgs``; error events are not records.

    The scan is C-level (map/zip/dict); only one message per partition is looked at in Python.
    """
    keys = zip(map(Message.topic, msgs), map(Message.partition, msgs), strict=True)
    last_index = dict(zip(keys, range(len(msgs)), strict=True))
    out: dict[tuple[str | None, int | None], int | None] = {}
    for key, i in last_index.items():
        msg = msgs[i]
        if msg.error() is not None:  # rare: an error event came last; take the last real record
            real = [m for m in msgs[:i] if m.error() is None and (m.topic(), m.partition()) == key]
            if not real:
                continue
            msg = real[-1]
        out[key] = msg.offset()
    return out


def _timeout(timeout: float | None) -> float:
    return -1.0 if timeout is None else float(timeout)


class Consumer:
    """A drop-in ``confluent_kafka.Consumer`` that can recover from a crash without lag.

    Pass ``"enable.parallel.rebalance": True`` (or ``enable_parallel_rebalance=True``)
    to turn KIP-333 on; every other librdkafka property passes through unchanged.
    """

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        conf, settings = split_config(config or {}, **kwargs)
        self._settings = settings
        self._enabled = settings.enabled
        self._closed = False
        self._child: BackfillChild | None = None
        if not self._enabled:
            self._primary = _KafkaConsumer(conf)
            for name in _ALL_METHODS:
                if hasattr(self._primary, name):
                    setattr(self, name, getattr(self._primary, name))
            return
        self._group = str(conf["group.id"])
        self._auto_commit = parse_bool("enable.auto.commit", conf.get("enable.auto.commit", True))
        self._auto_store = parse_bool("enable.auto.offset.store", conf.get("enable.auto.offset.store", True))
        self._commit_interval_s = int(conf.get("auto.commit.interval.ms", 5000)) / 1000.0
        self._cooperative = is_cooperative(conf)
        primary_conf = dict(conf)
        if self._auto_store:
            # We store offsets ourselves, one poll late: a record counts as done only
            # once the application has come back for more (at-least-once).
            primary_conf["enable.auto.offset.store"] = False
        self._primary = _KafkaConsumer(primary_conf)
        for name in _DELEGATED:
            if hasattr(self._primary, name):
                setattr(self, name, getattr(self._primary, name))
        self._child_conf = child_config(conf, settings)
        self._owner = settings.owner_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._book = RangeBook()
        self._store: RangeStore | None = None
        self._store_retry_at = 0.0
        self._open_store(initial=True)
        self._user_on_assign: RebalanceCallback | None = None
        self._user_on_revoke: RebalanceCallback | None = None
        self._user_on_lost: RebalanceCallback | None = None
        self._in_rebalance = False
        self._assigned_in_callback = False
        self._assigned: set[TopicPartitionKey] = set()
        self._unsettled_primary: list[Message] = []
        # last offset per (topic, partition) of settled primary records, not yet in _primary_done
        self._settled_offsets: dict[tuple[str | None, int | None], int | None] = {}
        self._unsettled_child: list[tuple[int, Message]] = []
        self._primary_done: dict[TopicPartitionKey, int] = {}
        self._primary_dirty: set[TopicPartitionKey] = set()
        self._next_tick = 0.0
        self._next_range_commit = time.monotonic() + self._commit_interval_s
        self._turn_child = False
        self._to_mirror: list[tuple[TopicPartitionKey, int]] = []
        self.recoveries: list[RecoveryReport] = []
        self.children_started = 0
        self.child_restarts = 0

    # ---- KIP-333 public additions ----------------------------------------------------------------

    def child_consumer_is_alive(self) -> bool:
        """True while the standby child consumer exists and its thread runs (KIP: childConsumerIsAlive)."""
        return self._child is not None and self._child.is_alive()

    @property
    def parallel_rebalance_enabled(self) -> bool:
        return self._enabled

    def backfill_progress(self) -> list[tuple[Token, RangeProgress]]:
        """Held ranges with their durable token and the pending (uncommitted) progress."""
        return [(h.token, h.pending) for h in self._book.held()] if self._enabled else []

    # ---- the primary's own methods (the KIP: the child takes no part) ---------------------------
    # With the mode on or off these are replaced in __init__ by the primary's bound methods; the
    # definitions here give type checkers and help() the same surface as confluent_kafka.Consumer.

    def assignment(self) -> list[TopicPartition]:
        return self._primary.assignment()

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return self._primary.position(partitions)

    def seek(self, partition: TopicPartition) -> None:
        self._primary.seek(partition)

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int] | None:
        if timeout is None:
            return self._primary.get_watermark_offsets(partition, cached=cached)
        return self._primary.get_watermark_offsets(partition, timeout, cached)

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        if timeout is None:
            return self._primary.offsets_for_times(partitions)
        return self._primary.offsets_for_times(partitions, timeout)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return self._primary.list_topics(topic, timeout)

    def memberid(self) -> str | None:
        return self._primary.memberid()

    def consumer_group_metadata(self) -> Any:
        return self._primary.consumer_group_metadata()

    def set_sasl_credentials(self, username: str, password: str) -> None:
        self._primary.set_sasl_credentials(username, password)

    # ---- store handle --------------------------------------------------------------------------

    def _open_store(self, initial: bool = False) -> RangeStore | None:
        if self._store is not None:
            return self._store
        if not initial and time.monotonic() < self._store_retry_at:
            return None
        try:
            self._store = open_store(self._settings.store_url, create=self._settings.store_create)
        except StoreUnavailableError as exc:
            self._store_retry_at = time.monotonic() + self._settings.retry_backoff_s
            log.warning("range store unavailable (%s); fast recovery is off until it answers", exc)
        return self._store

    # ---- subscription and assignment -----------------------------------------------------------

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        self._user_on_assign, self._user_on_revoke, self._user_on_lost = on_assign, on_revoke, on_lost
        self._primary.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)

    def unsubscribe(self) -> None:
        self._primary.unsubscribe()

    def assign(self, partitions: list[TopicPartition]) -> None:
        if self._in_rebalance:
            self._assigned_in_callback = True
            self._primary.assign(partitions)
            return
        keep = {_key(tp) for tp in partitions}
        self._let_go([k for k in self._assigned if k not in keep], lost=False)
        adjusted = self._recover(partitions)
        self._primary.assign(adjusted)
        self._assigned = keep
        self._after_assign(adjusted)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        if self._in_rebalance:
            self._assigned_in_callback = True
            self._primary.incremental_assign(partitions)
            return
        adjusted = self._recover(partitions)
        self._primary.incremental_assign(adjusted)
        self._assigned |= {_key(tp) for tp in adjusted}
        self._after_assign(adjusted)

    def unassign(self) -> None:
        if self._in_rebalance:
            self._assigned_in_callback = True
        else:
            self._let_go(list(self._assigned), lost=False)
        self._primary.unassign()
        self._assigned = set()

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        keys = [_key(tp) for tp in partitions]
        if self._in_rebalance:
            self._assigned_in_callback = True
        else:
            self._let_go(keys, lost=False)
        self._primary.incremental_unassign(partitions)
        self._assigned -= set(keys)

    def _on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        adjusted = self._recover(partitions)
        self._in_rebalance, self._assigned_in_callback = True, False
        try:
            if self._user_on_assign is not None:
                self._user_on_assign(self, adjusted)
            if not self._assigned_in_callback:
                if self._cooperative:
                    self._primary.incremental_assign(adjusted)
                else:
                    self._primary.assign(adjusted)
        finally:
            self._in_rebalance = False
        keys = {_key(tp) for tp in adjusted}
        self._assigned = (self._assigned | keys) if self._cooperative else keys
        self._after_assign(adjusted)

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._rebalance_out(partitions, self._user_on_revoke, lost=False)

    def _on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._rebalance_out(partitions, self._user_on_lost or self._user_on_revoke, lost=True)

    def _rebalance_out(self, partitions: list[TopicPartition], user_cb: RebalanceCallback | None, lost: bool) -> None:
        self._in_rebalance, self._assigned_in_callback = True, False
        try:
            if user_cb is not None:
                user_cb(self, partitions)
        finally:
            self._in_rebalance = False
        keys = [_key(tp) for tp in partitions]
        self._let_go(keys, lost=lost)
        self._assigned -= set(keys)

    # ---- recovery ------------------------------------------------------------------------------

    def _recover(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Carry out the recovery plan of each partition; return the partitions with start offsets."""
        adjusted = [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in partitions]
        todo = [tp for tp in adjusted if tp.offset in (OFFSET_INVALID, OFFSET_STORED)]
        if not todo:
            return adjusted
        try:
            committed = {
                _key(tp): tp
                for tp in self._primary.committed(
                    [TopicPartition(t.topic, t.partition) for t in todo], timeout=_BROKER_TIMEOUT_S
                )
            }
        except KafkaException as exc:
            log.warning(
                "no recovery for %s: committed offsets unavailable (%s); starting as a plain consumer",
                ", ".join(str(_key(tp)) for tp in todo),
                exc,
            )
            return adjusted
        store = self._open_store()
        started: list[Held] = []
        self._to_mirror = []
        for tp in todo:
            key = _key(tp)
            ctp = committed.get(key)
            c = ctp.offset if ctp is not None and ctp.offset >= 0 else None
            try:
                watermarks = self._primary.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=_BROKER_TIMEOUT_S
                )
            except KafkaException as exc:
                watermarks = None
                log.debug("watermarks of %s: %s", key, exc)
            if watermarks is None:
                log.warning("no recovery for %s: its log end is unavailable; starting at the committed offset", key)
                continue
            high = watermarks[1]
            mirrored = self._decode_mirror(key, ctp.metadata if ctp is not None else None)
            start, held, report = self._recover_partition(store, key, c, high, mirrored)
            if start is not None:
                tp.offset = start
            started.extend(held)
            self.recoveries.append(report)
            if report.committed is not None and (report.new_ranges or report.resumed):
                self._to_mirror.append((key, report.committed))
        started_ids = {h.token.id for h in started}
        works = [w for w in self._book.works() if w.token_id in started_ids]
        if works:
            self._ensure_child().add(works)
        return adjusted

    def _decode_mirror(self, key: TopicPartitionKey, metadata: str | None) -> list[RangeProgress]:
        if not self._settings.commit_mirror or not metadata:
            return []
        try:
            return decode_mirror(metadata)
        except CodecError as exc:
            log.warning("ignoring unreadable commit-metadata mirror of %s: %s", key, exc)
            return []

    def _recover_partition(
        self,
        store: RangeStore | None,
        key: TopicPartitionKey,
        committed: int | None,
        log_end: int,
        mirrored: list[RangeProgress],
    ) -> tuple[int | None, list[Held], RecoveryReport]:
        self._book.remove_partitions([key])
        tokens: list[Token] = []
        if store is not None:
            try:
                floor = min([committed, *(m.start for m in mirrored)]) if committed is not None else None
                tokens = store.partition_ranges(
                    self._group, key.topic, key.partition, ending_after=floor, skip_corrupt=True
                )
            except StoreError as exc:
                log.warning("range store unreadable during recovery of %s: %s", key, exc)
                store = None
        plan = plan_partition(
            committed=committed,
            log_end=log_end,
            min_offsets=self._settings.backfill_min_offsets,
            store_tokens=tokens,
            mirrored=mirrored,
        )
        held: list[Held] = []
        start = plan.primary_start
        degraded = False
        if store is None:
            degraded = plan.primary_start is not None
            start = None
            for progress in plan.restored + tuple(t.progress for t in plan.backfill):
                self._book.park(key, self._group, progress)
            if degraded:
                log.warning(
                    "range store unavailable: %s starts at its committed offset %s and replays the lag of %d "
                    "records (no fast recovery, nothing lost)",
                    key,
                    committed,
                    plan.lag,
                )
        else:
            try:
                held = self._execute(store, key, plan)
            except StoreError as exc:
                degraded = plan.primary_start is not None
                start = plan.fallback_start if degraded else None
                log.warning(
                    "could not persist range tokens for %s (%s): it starts at committed offset %s "
                    "instead of the log end (no fast recovery, nothing lost)",
                    key,
                    exc,
                    committed,
                )
                held = [h for h in self._book.held(key) if not h.parked]
        if plan.new_ranges and not degraded:
            log.info(
                "fast recovery of %s: committed=%s log end=%d; primary starts at %d, child backfills %s",
                key,
                committed,
                log_end,
                start,
                ", ".join(f"[{r.start}, {r.end})" for r in plan.new_ranges),
            )
        report = RecoveryReport(
            key,
            committed,
            log_end,
            start,
            () if degraded else plan.new_ranges,
            tuple(t.id for t in plan.backfill),
            degraded,
        )
        return start, held, report

    def _execute(self, store: RangeStore, key: TopicPartitionKey, plan: PartitionPlan) -> list[Held]:
        """Persist restored and new ranges and claim open ones; tokens first, skipping after."""
        held: list[Held] = []
        for progress in plan.restored:
            token = store.create_range(self._group, key.topic, key.partition, progress.start, progress.end, self._owner)
            token = store.claim(token.id, self._owner)
            if token.is_open and progress.committed > token.progress.committed:
                token = store.commit_one(ProgressUpdate(token.id, self._owner, token.epoch, progress))
            log.warning(
                "restored range [%d, %d) of %s from the commit-metadata mirror (the store had lost it)",
                progress.start,
                progress.end,
                key,
            )
            if token.is_open:
                held.append(self._book.add(token))
        pending = list(plan.new_ranges)
        while pending:
            span = pending.pop(0)
            token = store.create_range(self._group, key.topic, key.partition, span.start, span.end, self._owner)
            if token.span != span:
                # A range already starts here (typically a done one: its holder died between the store
                # and the Kafka commit). It covers only its own span: the rest needs ranges of its own.
                pending.extend(subtract(span, [token.span]))
            if token.owner != self._owner or not token.is_open:
                token = store.claim(token.id, self._owner)
            if token.is_open:
                held.append(self._book.add(token))
        for old in plan.backfill:
            token = store.claim(old.id, self._owner)
            if token.is_open:
                held.append(self._book.add(token))
        return held

    def _after_assign(self, adjusted: list[TopicPartition]) -> None:
        """Mirror freshly created ranges into the commit metadata (same offset, new metadata)."""
        if not self._settings.commit_mirror:
            return
        offsets = [self._with_mirror(key, committed, None) for key, committed in self._to_mirror]
        self._to_mirror = []
        if offsets:
            try:
                self._primary.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                log.warning("could not mirror ranges into commit metadata: %s", exc)

    # ---- the child ----------------------------------------------------------------------------

    def _ensure_child(self) -> BackfillChild:
        child = self._child
        if child is None or not child.is_alive():
            if child is not None:
                self.child_restarts += 1
                log.warning("child consumer died (%r); restarting it from the ranges' committed offsets", child.failure)
            child = BackfillChild(
                self._child_conf, queue_max=self._settings.queue_max_messages, batch_size=self._settings.batch_size
            )
            child.start()
            self._child = child
            self.children_started += 1
            child.add(self._book.works())
        return child

    def _tick(self, now: float) -> None:
        self._next_tick = now + _TICK_S
        self._flush_primary_store()
        child = self._child
        if child is not None:
            for event in child.drain_events():
                self._apply_event(event)
            if not child.is_alive() and not self._closed and self._book.has_work:
                self._ensure_child()
        if self._auto_commit and now >= self._next_range_commit:
            self._next_range_commit = now + self._commit_interval_s
            self._book.promote_stored()
            self._commit_ranges(None, raise_errors=False)

    def _apply_event(self, event: SkipEvent | GapEvent) -> None:
        if isinstance(event, GapEvent):
            self._book.mark_done(event.token_id, range(event.start, event.end))
            return
        lost = self._book.skip_to(event.token_id, event.low)
        held = self._book.get(event.token_id)
        if held is not None and lost:
            log.warning(
                "retention deleted %d records of range #%d of %s before they were backfilled "
                "(skipped up to offset %d; recorded on the token)",
                lost,
                held.token.id,
                held.token.key,
                event.low,
            )
            self._commit_ranges([held.token.key], raise_errors=False)

    # ---- poll / consume -------------------------------------------------------------------------

    def _settle(self) -> None:
        """Records returned by an earlier call are done: that is when auto-store counts them."""
        if self._unsettled_primary:
            # Hot path: keep only the last offset per partition, in C where possible, and no
            # message beyond this call (held messages get promoted by the GC and slow it down);
            # _fold_primary() makes them offsets to store before anyone reads those.
            msgs, self._unsettled_primary = self._unsettled_primary, []
            if len(msgs) == 1:
                msg = msgs[0]
                if msg.error() is None:
                    self._settled_offsets[(msg.topic(), msg.partition())] = msg.offset()
            else:
                self._settled_offsets.update(_last_offsets(msgs))
        if self._unsettled_child:
            # One mark_stored per range, not per record: each call builds and validates a new
            # RangeProgress, and the GIL held meanwhile starves the child thread.
            by_token: dict[int, list[int]] = {}
            for token_id, msg in self._unsettled_child:
                by_token.setdefault(token_id, []).append(msg.offset() or 0)
            for token_id, offsets in by_token.items():
                self._book.mark_stored(token_id, offsets)
            self._unsettled_child = []

    def _fold_primary(self) -> None:
        """Settled offsets -> ``_primary_done``/``_primary_dirty``; call before reading either."""
        if self._settled_offsets:
            settled, self._settled_offsets = self._settled_offsets, {}
            for (topic, partition), offset in settled.items():
                key = TopicPartitionKey(topic or "", partition or 0)
                self._primary_done[key] = (offset or 0) + 1
                self._primary_dirty.add(key)

    def _begin_call(self) -> float:
        """What every poll()/consume() does first: settle the previous call's records, tick."""
        if self._auto_store:
            self._settle()
        elif self._unsettled_primary or self._unsettled_child:
            # Without the auto offset store nothing reads them: do not keep every record.
            self._unsettled_primary, self._unsettled_child = [], []
        now = time.monotonic()
        if now >= self._next_tick:
            self._tick(now)
        return now

    def poll(self, timeout: float | None = None) -> Message | None:
        now = self._begin_call()
        child = self._child
        if child is None or not (child.pending() or self._book.has_work):
            msg = self._primary.poll(_timeout(timeout))
            if msg is not None and msg.error() is None:
                self._unsettled_primary.append(msg)
            return msg
        deadline = None if timeout is None or timeout < 0 else now + timeout
        while True:
            self._turn_child = not self._turn_child
            if self._turn_child:
                item = self._take_child(1)
                if item:
                    return item[0]
            msg = self._primary.poll(0)
            if msg is not None:
                if msg.error() is None:
                    self._unsettled_primary.append(msg)
                return msg
            item = self._take_child(1)
            if item:
                return item[0]
            remaining = _WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, deadline - time.monotonic())
            if remaining <= 0:
                return None
            msg = self._primary.poll(remaining)
            if msg is not None:
                if msg.error() is None:
                    self._unsettled_primary.append(msg)
                return msg
            if time.monotonic() >= self._next_tick:
                self._tick(time.monotonic())

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        now = self._begin_call()
        child = self._child
        if child is None or not (child.pending() or self._book.has_work):
            msgs = self._primary.consume(num_messages, timeout)
            self._unsettled_primary.extend(msgs)  # error events are skipped by _settle()
            return list(msgs)
        deadline = None if timeout is None or timeout < 0 else now + timeout
        while True:
            out: list[Message] = self._take_child(max(1, num_messages // 2))
            primary = self._primary.consume(num_messages - len(out), 0) if len(out) < num_messages else []
            self._unsettled_primary.extend(m for m in primary if m.error() is None)
            out.extend(primary)
            if len(out) < num_messages:
                out.extend(self._take_child(num_messages - len(out)))
            if out:
                return out
            remaining = _WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, deadline - time.monotonic())
            if remaining <= 0:
                return []
            primary = self._primary.consume(num_messages, remaining)
            if primary:
                self._unsettled_primary.extend(m for m in primary if m.error() is None)
                return list(primary)
            if time.monotonic() >= self._next_tick:
                self._tick(time.monotonic())

    def _take_child(self, limit: int) -> list[Message]:
        child = self._child
        if child is None:
            return []
        out: list[Message] = []
        for token_id, msg in child.take(limit):
            if self._book.get(token_id) is None:
                continue  # range finished, fenced or revoked meanwhile
            self._unsettled_child.append((token_id, msg))
            out.append(msg)
        return out

    # ---- commits ---------------------------------------------------------------------------------

    def commit(
        self,
        message: Message | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        if message is not None and offsets is not None:
            raise ValueError("commit(): message and offsets are mutually exclusive")
        if message is not None:
            key = _key(message)
            pairs = [(key, (message.offset() or 0) + 1)]
            user_meta: dict[TopicPartitionKey, str | None] = {}
            token_id = route_record(message.offset() or 0, self._book.spans(key))
            if token_id is not None:
                self._book.mark_done(token_id, (message.offset() or 0,))
                return self._finish_commit([], [key], asynchronous)
        elif offsets is not None:
            pairs = [(_key(tp), tp.offset) for tp in offsets]
            user_meta = {_key(tp): tp.metadata for tp in offsets if getattr(tp, "metadata", None)}
        else:
            if self._auto_store:
                self._settle()
            self._fold_primary()
            pairs = list(self._primary_done.items())
            user_meta = {}
            if not self._auto_store:
                self._flush_primary_store()
                self._book.promote_stored()
                return self._finish_commit(None, None, asynchronous)
        self._check_assigned(k for k, _ in pairs)
        primary, routed = split_commit(pairs, {k: self._book.spans(k) for k, _ in pairs})
        for token_id, next_offset in routed.items():
            self._book.commit_upto(token_id, next_offset)
        range_keys = [h.token.key for tid in routed if (h := self._book.get(tid)) is not None]
        tps = [self._with_mirror(k, o, user_meta.get(k)) for k, o in primary]
        if message is None and offsets is None:
            self._book.promote_stored()
            range_keys = list(self._book.keys())
            for k, _ in primary:
                self._primary_dirty.discard(k)
        return self._finish_commit(tps, range_keys, asynchronous)

    def _finish_commit(
        self, tps: list[TopicPartition] | None, range_keys: list[TopicPartitionKey] | None, asynchronous: bool
    ) -> list[TopicPartition] | None:
        committed_ranges = (
            self._commit_ranges(range_keys, raise_errors=not asynchronous) if (range_keys is None or range_keys) else []
        )
        result: list[TopicPartition] | None = None
        if tps is None:
            try:
                result = (
                    self._primary.commit(asynchronous=True)
                    if asynchronous
                    else self._primary.commit(asynchronous=False)
                )
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._NO_OFFSET or not committed_ranges:
                    raise
        elif tps:
            result = (
                self._primary.commit(offsets=tps, asynchronous=True)
                if asynchronous
                else self._primary.commit(offsets=tps, asynchronous=False)
            )
        if asynchronous:
            return None
        return list(result or []) + committed_ranges

    def _with_mirror(self, key: TopicPartitionKey, offset: int, user_metadata: str | None) -> TopicPartition:
        if user_metadata is not None:
            return TopicPartition(key.topic, key.partition, offset, metadata=user_metadata)
        text = self._book.mirror(key) if self._settings.commit_mirror else ""
        if text:
            return TopicPartition(key.topic, key.partition, offset, metadata=text)
        return TopicPartition(key.topic, key.partition, offset)

    def _check_assigned(self, keys: Any) -> None:
        stray = sorted({str(k) for k in keys if k not in self._assigned})
        if stray:
            raise StateError(f"commit of partitions not assigned to this consumer: {', '.join(stray)}")

    def _commit_ranges(self, keys: list[TopicPartitionKey] | None, raise_errors: bool) -> list[TopicPartition]:
        """Write pending range progress to the store: one transaction for the lot."""
        dirty = self._book.dirty(keys)
        if not dirty:
            return []
        store = self._open_store()
        if store is None:
            err = StoreUnavailableError(
                f"range store {self._settings.store_url!r} unavailable; {len(dirty)} backfill commits kept for retry"
            )
            log.error("%s", err)
            if raise_errors:
                raise err
            return []
        updates = [ProgressUpdate(h.token.id, self._owner, h.token.epoch, h.pending, h.skipped) for h in dirty]
        try:
            result = store.commit_progress(updates)
        except StoreError as exc:
            if isinstance(exc, StoreUnavailableError):
                self._store_retry_at = time.monotonic() + self._settings.retry_backoff_s
            log.error("backfill commit of %d ranges failed, kept for retry: %s", len(updates), exc)
            if raise_errors:
                raise
            return []
        for token_id in result.fenced:
            self._book.remove(token_id)
            if self._child is not None:
                self._child.drop_range(token_id)
            log.warning("range #%d was taken over by another owner (fenced); dropping it here", token_id)
        out = []
        for token in result.tokens:
            self._book.settle(token)
            self._primary_dirty.add(token.key)
            out.append(TopicPartition(token.topic, token.partition, token.progress.committed))
            if token.progress.done:
                log.info(
                    "range #%d [%d, %d) of %s is done", token.id, token.progress.start, token.progress.end, token.key
                )
        if result.fenced and raise_errors:
            raise FencedError(f"ranges {sorted(result.fenced)} are held by another owner; not committed here")
        return out

    def _flush_primary_store(self, keys: Sequence[TopicPartitionKey] | None = None) -> None:
        """Hand done primary offsets to librdkafka's offset store (auto-commit commits them)."""
        self._fold_primary()
        if not self._auto_store or not self._primary_dirty:
            return
        todo = self._primary_dirty if keys is None else self._primary_dirty & set(keys)
        tps = [self._with_mirror(k, self._primary_done[k], None) for k in todo if k in self._primary_done]
        self._primary_dirty -= set(todo)
        if tps:
            try:
                self._primary.store_offsets(offsets=tps)
            except KafkaException as exc:
                log.debug("store_offsets skipped: %s", exc)

    def store_offsets(self, message: Message | None = None, offsets: list[TopicPartition] | None = None) -> None:
        if message is not None and offsets is not None:
            raise ValueError("store_offsets(): message and offsets are mutually exclusive")
        if message is not None:
            key = _key(message)
            token_id = route_record(message.offset() or 0, self._book.spans(key))
            if token_id is not None:
                self._book.mark_stored(token_id, (message.offset() or 0,))
                return
            self._primary.store_offsets(offsets=[self._with_mirror(key, (message.offset() or 0) + 1, None)])
            return
        pairs = [(_key(tp), tp.offset) for tp in offsets or []]
        primary, routed = split_commit(pairs, {k: self._book.spans(k) for k, _ in pairs})
        for token_id, next_offset in routed.items():
            self._book.store_upto(token_id, next_offset)
        if primary:
            self._primary.store_offsets(offsets=[self._with_mirror(k, o, None) for k, o in primary])

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        """The KIP's merged committed(): below the returned offset everything is checkpointed."""
        result = (
            self._primary.committed(partitions) if timeout is None else self._primary.committed(partitions, timeout)
        )
        foreign: dict[TopicPartitionKey, list[RangeProgress]] | None = None
        for tp in result:
            key = _key(tp)
            ranges = [h.durable for h in self._book.held(key)]
            if not ranges and key not in self._assigned:
                if foreign is None:
                    foreign = self._foreign_ranges()
                ranges = foreign.get(key, [])
            merged = merged_committed(tp.offset if tp.offset >= 0 else None, ranges)
            if merged is not None:
                tp.offset = merged
        return list(result)

    def _foreign_ranges(self) -> dict[TopicPartitionKey, list[RangeProgress]]:
        store = self._open_store()
        if store is None:
            return {}
        try:
            tokens = store.open_ranges(self._group, skip_corrupt=True)
        except StoreError as exc:
            log.warning("committed(): range store unreadable, answering from Kafka only: %s", exc)
            return {}
        out: dict[TopicPartitionKey, list[RangeProgress]] = {}
        for t in tokens:
            out.setdefault(t.key, []).append(t.progress)
        return out

    # ---- pause / resume / close ------------------------------------------------------------------

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._primary.pause(partitions)
        if self._child is not None:
            self._child.pause(_key(tp) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._primary.resume(partitions)
        if self._child is not None:
            self._child.resume(_key(tp) for tp in partitions)

    def _let_go(self, keys: list[TopicPartitionKey], lost: bool) -> None:
        """Partitions leave this member: finish what we may commit, then release their ranges."""
        if not keys:
            return
        if not lost:
            if self._auto_store:
                self._settle()
            self._fold_primary()
            if self._auto_commit:
                done = [self._with_mirror(k, self._primary_done[k], None) for k in keys if k in self._primary_done]
                if done:
                    try:
                        self._primary.commit(offsets=done, asynchronous=False)
                    except KafkaException as exc:
                        log.warning("commit on revoke failed: %s", exc)
                self._book.promote_stored(keys)
                self._commit_ranges(keys, raise_errors=False)  # logs and keeps what fails
        if self._child is not None:
            self._child.drop(keys, self._settings.revoke_timeout_s)
        released = self._book.remove_partitions(keys)
        self._fold_primary()  # offsets settled earlier are dropped with the partitions, as before
        for k in keys:
            self._primary_done.pop(k, None)
            self._primary_dirty.discard(k)
        gone = set(keys)
        self._unsettled_child = [(t, m) for t, m in self._unsettled_child if _key(m) not in gone]
        if lost or self._store is None:
            return
        for held in released:
            if held.parked:
                continue
            try:
                self._store.release(held.token.id, self._owner, held.token.epoch)
            except StoreError as exc:
                log.debug("release of range #%d failed: %s", held.token.id, exc)

    def close(self) -> None:
        if self._closed:
            return
        if not self._enabled:
            self._closed = True
            self._primary.close()
            return
        try:
            # _let_go settles, commits both logs per the commit settings and releases the ranges
            self._let_go(list(self._assigned), lost=False)
            self._primary.close()
        finally:
            self._closed = True
            if self._child is not None:
                self._child.stop()
            if self._store is not None:
                self._store.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
