"""The KIP-333 mode of a consumer: two record streams merged, commits routed to two logs.

:class:`ParallelMode` is what ``fastrecover.Consumer`` delegates to when
``enable.parallel.rebalance`` is on.  It wires the units together and carries
their decisions out; each unit keeps its own state:

- :class:`~fastrecover.primary.PrimaryOffsets`: what the primary returned and settled;
- :class:`~fastrecover.recoverer.Recoverer`: recovery on assignment, tokens first;
- :class:`~fastrecover.child.ChildReader`: the child handle, drained from this thread;
- :class:`~fastrecover.book.RangeBook`: the held ranges and their progress;
- :class:`~fastrecover.committer.RangeCommitter`: the store commits, written behind.

Both consumers are used from the caller's thread only.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, cast

from confluent_kafka import Consumer as _KafkaConsumer
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from fastrecover import hooks
from fastrecover.book import RangeBook
from fastrecover.child import ChildReader, GapEvent, Run, SkipEvent
from fastrecover.codec import is_mirror
from fastrecover.committer import RangeCommitter, StoreLink
from fastrecover.config import Settings, child_config, is_cooperative, parse_bool
from fastrecover.errors import StoreError
from fastrecover.primary import PrimaryOffsets
from fastrecover.ranges import RangeProgress, merged_committed, route_commit, route_record, split_commit, subtract
from fastrecover.recoverer import Recovered, Recoverer
from fastrecover.store import ProgressUpdate
from fastrecover.tokens import Token, TopicPartitionKey

log = logging.getLogger("fastrecover.consumer")

RebalanceCallback = Callable[[Any, list[TopicPartition]], None]
_TICK_S = 0.05
_WAIT_SLICE_S = 0.02
_K = _KafkaConsumer


def _key(tp: TopicPartition) -> TopicPartitionKey:
    return TopicPartitionKey(tp.topic, tp.partition)


class ParallelMode:
    """The mode-on state and behaviour of one consumer (``app`` is the application's object)."""

    def __init__(self, app: _KafkaConsumer, conf: dict[str, Any], settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.group = str(conf["group.id"])
        self.auto_commit = parse_bool("enable.auto.commit", conf.get("enable.auto.commit", True))
        self.auto_store = parse_bool("enable.auto.offset.store", conf.get("enable.auto.offset.store", True))
        self.eof = parse_bool("enable.partition.eof", conf.get("enable.partition.eof", False))
        self.commit_interval_s = int(conf.get("auto.commit.interval.ms", 5000)) / 1000.0
        self.cooperative = is_cooperative(conf)
        self.owner = settings.owner_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.book = RangeBook()
        self.link = StoreLink(settings.store_url, settings.store_create, settings.retry_backoff_s)
        self.link.get(force=True)
        self.child = ChildReader(
            child_config(conf, settings), batch_size=settings.batch_size, broker_timeout_s=settings.recovery_timeout_s
        )
        self.committer = RangeCommitter(
            self.book,
            self.link,
            self.owner,
            interval_s=settings.commit_interval_s,
            on_commit=conf.get("on_commit"),
            on_fenced=self.child.drop_range,
        )
        self.recoverer = Recoverer(app, self.book, self.link, settings, self.group, self.owner)
        self.offsets = PrimaryOffsets()
        self.child_runs: list[Run] = []
        self.assigned: set[TopicPartitionKey] = set()
        self.routes: set[TopicPartitionKey] = set()
        self.floors: dict[TopicPartitionKey, int] = {}
        self.user_meta: dict[TopicPartitionKey, str] = {}
        self.held_eof: dict[TopicPartitionKey, Message] = {}
        self.ready_eof: list[Message] = []
        self.deferred: list[Message] = []
        self.user_cbs: tuple[RebalanceCallback | None, ...] = (None, None, None)
        self.in_rebalance = False
        self.assigned_in_cb = False
        self.next_tick = 0.0
        self.next_range_commit = time.monotonic() + self.commit_interval_s
        self.turn = False
        self.child_restarts = 0

    # ---- per call --------------------------------------------------------------------------

    @property
    def backfilling(self) -> bool:
        return self.child.has_work or bool(self.ready_eof) or bool(self.child_runs)

    def begin(self) -> float:
        """What every poll()/consume() does first: settle the previous call's records, tick."""
        if self.auto_store:
            self.offsets.settle()
            if self.child_runs:
                runs, self.child_runs = self.child_runs, []
                for run in runs:
                    self.book.store_upto(run.token_id, run.last + 1)
        elif self.offsets.unsettled or self.child_runs:
            self.offsets.forget_unsettled()
            self.child_runs = []
        now = time.monotonic()
        if now >= self.next_tick:
            self.tick(now)
        return now

    def tick(self, now: float) -> None:
        self.next_tick = now + _TICK_S
        if self.deferred:
            self.commit_deferred()
        self.store_primary()
        for event in self.child.drain_events():
            self.apply_event(event)
        finished = self.child.drain_finished()
        if finished and self.held_eof:
            self.release_eof(key for _token_id, key in finished)
        if self.child.failure is not None and self.book.has_work:
            self.child_restarts += 1
            self.child.restart()
        if self.auto_commit and now >= self.next_range_commit:
            self.next_range_commit = now + self.commit_interval_s
            self.book.promote_stored()
        self.committer.tick(now)
        self.after_commits()

    def after_commits(self) -> None:
        """Ranges settled or finished in the store: refresh mirrors, move idle partitions' Kafka offsets."""
        if self.committer.settled_keys:
            keys, self.committer.settled_keys = self.committer.settled_keys, set()
            self.offsets.dirty.update(k for k in keys if k in self.offsets.done)
        if self.committer.finished_keys:
            keys, self.committer.finished_keys = self.committer.finished_keys, set()
            self.routes = self.book.routes()
            self.advance_idle(keys)

    def advance_idle(self, keys: Iterable[TopicPartitionKey]) -> None:
        """committed() is never stale: a finished partition whose primary committed nothing moves to its floor."""
        tps = []
        for key in keys:
            floor = self.floors.get(key)
            if floor is None or self.book.held(key) or key in self.offsets.done:
                continue
            del self.floors[key]
            tps.append(TopicPartition(key.topic, key.partition, floor))
        if tps:
            try:
                _K.commit(self.app, offsets=tps, asynchronous=True)
            except KafkaException as exc:
                log.debug("moving finished partitions' offsets: %s", exc)

    def apply_event(self, event: SkipEvent | GapEvent) -> None:
        if isinstance(event, GapEvent):
            self.book.mark_done(event.token_id, range(event.start, event.end))
            return
        lost = self.book.skip_to(event.token_id, event.low)
        held = self.book.get(event.token_id)
        if held is not None and lost:
            log.warning(
                "retention deleted %d records of range #%d of %s before they were backfilled "
                "(skipped up to offset %d; recorded on the token)",
                lost,
                held.token.id,
                held.token.key,
                event.low,
            )

    # ---- the merged streams ----------------------------------------------------------------

    def note_primary(self, msg: Message | None) -> Message | None:
        if msg is not None:
            if msg.error() is None:
                self.offsets.unsettled.append(msg)
            elif self.eof and cast(KafkaError, msg.error()).code() == KafkaError._PARTITION_EOF:
                return self.hold_eof(msg)
        return msg

    def note_child(self, msgs: list[Message], runs: list[Run]) -> list[Message]:
        self.child_runs.extend(runs)
        return msgs

    def poll(self, timeout: float | None) -> Message | None:
        now = self.begin()
        if not self.backfilling:
            return self.note_primary(_K.poll(self.app, -1.0 if timeout is None else timeout))
        if self.ready_eof:
            return self.ready_eof.pop(0)
        deadline = None if timeout is None or timeout < 0 else now + timeout
        while True:
            self.turn = not self.turn
            if self.turn:
                msgs, runs = self.child.take(1)
                if msgs:
                    return self.note_child(msgs, runs)[0]
            msg = self.note_primary(_K.poll(self.app, 0))
            if msg is not None:
                return msg
            msgs, runs = self.child.take(1)
            if msgs:
                return self.note_child(msgs, runs)[0]
            remaining = _WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, deadline - time.monotonic())
            if remaining <= 0:
                return None
            msg = self.note_primary(_K.poll(self.app, remaining))
            if msg is not None:
                return msg
            now = time.monotonic()
            if now >= self.next_tick:
                self.tick(now)
            if not self.backfilling:
                left = -1.0 if deadline is None else max(0.0, deadline - now)
                return self.note_primary(_K.poll(self.app, left))

    def consume(self, num: int, timeout: float) -> list[Message]:
        now = self.begin()
        if not self.backfilling:
            return self.note_batch(_K.consume(self.app, num, timeout))
        deadline = None if timeout < 0 else now + timeout
        while True:
            out: list[Message] = self.ready_eof[:num]
            del self.ready_eof[: len(out)]
            share = 0 if num == 1 and self.turn else max(1, num // 2)
            self.turn = not self.turn
            # the primary first: if it raises (a callback, a fatal error) nothing was taken from the child
            out.extend(
                self.note_batch(_K.consume(self.app, max(0, num - len(out) - share), 0)) if len(out) < num else []
            )
            if len(out) < num:
                msgs, runs = self.child.take(num - len(out))
                out.extend(self.note_child(msgs, runs))
            if out:
                return out
            remaining = _WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, deadline - time.monotonic())
            if remaining <= 0:
                return []
            primary = self.note_batch(_K.consume(self.app, num, remaining))
            if primary:
                return primary
            now = time.monotonic()
            if now >= self.next_tick:
                self.tick(now)
            if not self.backfilling:
                left = -1.0 if deadline is None else max(0.0, deadline - now)
                return self.note_batch(_K.consume(self.app, num, left))

    def note_batch(self, msgs: list[Message]) -> list[Message]:
        if not msgs:
            return msgs
        self.offsets.unsettled.extend(msgs)  # settle() skips error events
        if self.eof and self.child.has_work and any(map(Message.error, msgs)):
            kept = []
            for msg in msgs:
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF and self.hold_eof(msg) is None:
                    continue
                kept.append(msg)
            return kept
        return msgs

    def hold_eof(self, msg: Message) -> Message | None:
        """EOF means the application has everything to the log end: not while the child still reads."""
        key = TopicPartitionKey(msg.topic() or "", msg.partition() or 0)
        if key in self.child.partitions():
            self.held_eof[key] = msg
            return None
        return msg

    def release_eof(self, keys: Iterable[TopicPartitionKey]) -> None:
        for key in keys:
            if key in self.held_eof and key not in self.child.partitions():
                self.ready_eof.append(self.held_eof.pop(key))

    # ---- commits ---------------------------------------------------------------------------

    def commit(
        self, message: Message | None, offsets: list[TopicPartition] | None, asynchronous: bool
    ) -> list[TopicPartition] | None:
        if message is not None:
            key = TopicPartitionKey(message.topic() or "", message.partition() or 0)
            if key not in self.routes:
                return self.commit_primary([(key, message.offset() + 1, None)], asynchronous)  # type: ignore[operator]
            if asynchronous:
                self.deferred.append(message)  # routed in bulk at the next tick
                return None
            self.deferred.append(message)
            return self.commit_deferred(sync=True)
        if offsets is not None:
            triples = [(_key(tp), tp.offset, tp.metadata) for tp in offsets]
            return self.commit_offsets(triples, asynchronous)
        return self.commit_all(asynchronous)

    def commit_deferred(self, sync: bool = False) -> list[TopicPartition] | None:
        """Per-message commits of partitions with ranges, routed a batch at a time."""
        msgs, self.deferred = self.deferred, []
        by_range: dict[int, list[int]] = {}
        primary: dict[TopicPartitionKey, int] = {}
        for msg in msgs:
            key = TopicPartitionKey(msg.topic() or "", msg.partition() or 0)
            offset: int = msg.offset()  # type: ignore[assignment]
            token_id = route_record(offset, self.book.spans(key))
            if token_id is None:
                primary[key] = max(primary.get(key, 0), offset + 1)
            else:
                by_range.setdefault(token_id, []).append(offset)
        for token_id, done in by_range.items():
            self.book.mark_done(token_id, done)
        if not sync:
            if primary:
                self.commit_primary([(k, o, None) for k, o in primary.items()], True)
            return None
        ranges = self.committer.flush_sync([self.book.get(t).token.key for t in by_range if self.book.get(t)])  # type: ignore[union-attr]
        hooks.fire("between-commits")
        result = self.commit_primary([(k, o, None) for k, o in primary.items()], False) if primary else []
        return list(result or []) + ranges

    def commit_offsets(
        self, triples: list[tuple[TopicPartitionKey, int, str | None]], asynchronous: bool
    ) -> list[TopicPartition] | None:
        routed: dict[int, int] = {}
        primary: list[tuple[TopicPartitionKey, int, str | None]] = []
        for key, offset, meta in triples:
            token_id = route_commit(offset, self.book.spans(key)) if key in self.routes else None
            if token_id is None:
                primary.append((key, offset, meta))
                continue
            routed[token_id] = max(offset, routed.get(token_id, offset))
            if meta:
                self.user_meta[key] = meta
        for token_id, next_offset in routed.items():
            self.book.commit_upto(token_id, next_offset)
        keys = [h.token.key for t in routed if (h := self.book.get(t)) is not None]
        if asynchronous:
            if keys:
                self.committer.flush_async(keys)
            if primary or not routed:
                self.commit_primary(primary, True)
            return None
        ranges = self.committer.flush_sync(keys) if keys else []
        if ranges and primary:
            hooks.fire("between-commits")
        result = self.commit_primary(primary, False) if primary or not routed else []
        return list(result or []) + ranges

    def commit_primary(
        self, triples: list[tuple[TopicPartitionKey, int, str | None]], asynchronous: bool
    ) -> list[TopicPartition] | None:
        tps = [self.with_mirror(k, o, m) for k, o, m in triples]
        for key, _o, _m in triples:
            self.floors.pop(key, None)
        return _K.commit(self.app, offsets=tps, asynchronous=asynchronous)  # type: ignore[call-overload,no-any-return]

    def commit_all(self, asynchronous: bool) -> list[TopicPartition] | None:
        """The offset-less commit(): everything stored so far, in both logs."""
        if self.deferred:
            self.commit_deferred()
        if self.auto_store:
            self.offsets.settle()
            for run in self.child_runs:
                self.book.store_upto(run.token_id, run.last + 1)
            self.child_runs = []
        self.store_primary()
        self.book.promote_stored()
        if asynchronous:
            self.committer.flush_async()
            try:
                _K.commit(self.app, asynchronous=True)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._NO_OFFSET or not self.book.held():
                    raise
            return None
        ranges = self.committer.flush_sync()
        if ranges:
            hooks.fire("between-commits")
        self.after_commits()
        try:
            result = _K.commit(self.app, asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET or not ranges:
                raise
            result = []
        return list(result or []) + ranges

    def store_primary(self, keys: Iterable[TopicPartitionKey] | None = None) -> None:
        """Hand settled primary offsets to librdkafka's offset store (auto-commit and commit() take them)."""
        if not self.auto_store:
            return
        done = self.offsets.take_dirty(keys)
        if not done:
            return
        tps = [self.with_mirror(TopicPartitionKey(*k), o, None) for k, o in done.items()]
        for k in done:
            self.floors.pop(TopicPartitionKey(*k), None)
        try:
            _K.store_offsets(self.app, offsets=tps)
        except KafkaException as exc:
            log.debug("store_offsets skipped: %s", exc)

    def store_offsets(self, message: Message | None, offsets: list[TopicPartition] | None) -> None:
        if message is not None:
            key = TopicPartitionKey(message.topic() or "", message.partition() or 0)
            offset: int = message.offset()  # type: ignore[assignment]
            token_id = route_record(offset, self.book.spans(key)) if key in self.routes else None
            if token_id is not None:
                self.book.mark_stored(token_id, (offset,))
                return
            _K.store_offsets(self.app, offsets=[self.with_mirror(key, offset + 1, None)])
            return
        pairs = [(_key(tp), tp.offset) for tp in offsets or []]
        primary, routed = split_commit(pairs, {k: self.book.spans(k) for k, _ in pairs})
        for token_id, next_offset in routed.items():
            self.book.store_upto(token_id, next_offset)
        if primary:
            _K.store_offsets(self.app, offsets=[self.with_mirror(k, o, None) for k, o in primary])

    def with_mirror(self, key: TopicPartitionKey, offset: int, user_metadata: str | None) -> TopicPartition:
        if user_metadata is not None:
            return TopicPartition(key.topic, key.partition, offset, metadata=user_metadata)
        text = self.book.mirror(key) if self.settings.commit_mirror and key in self.routes else ""
        if text:
            return TopicPartition(key.topic, key.partition, offset, metadata=text)
        return TopicPartition(key.topic, key.partition, offset)

    def committed(self, partitions: list[TopicPartition], timeout: float | None) -> list[TopicPartition]:
        """The KIP's merged committed(): below the returned offset everything is checkpointed."""
        result = _K.committed(self.app, partitions) if timeout is None else _K.committed(self.app, partitions, timeout)
        foreign: dict[TopicPartitionKey, list[RangeProgress]] | None = None
        answer = []
        for tp in result:
            key = _key(tp)
            if is_mirror(tp.metadata):  # our mirror is not the application's metadata
                extra: dict[str, Any] = {"metadata": self.user_meta.get(key), "leader_epoch": tp.leader_epoch}
                tp = TopicPartition(
                    tp.topic, tp.partition, tp.offset, **{k: v for k, v in extra.items() if v is not None}
                )
            answer.append(tp)
            ranges = [h.durable for h in self.book.held(key)]
            if not ranges and key not in self.assigned:
                if foreign is None:
                    foreign = self.foreign_ranges()
                ranges = foreign.get(key, [])
            merged = merged_committed(tp.offset if tp.offset >= 0 else None, ranges)
            if merged is not None:
                tp.offset = merged
        return answer

    def foreign_ranges(self) -> dict[TopicPartitionKey, list[RangeProgress]]:
        store = self.link.get()
        if store is None:
            return {}
        try:
            tokens = store.open_ranges(self.group, skip_corrupt=True)
        except StoreError as exc:
            log.warning("committed(): range store unreadable, answering from Kafka only: %s", exc)
            return {}
        out: dict[TopicPartitionKey, list[RangeProgress]] = {}
        for t in tokens:
            out.setdefault(t.key, []).append(t.progress)
        return out

    # ---- assignment ------------------------------------------------------------------------

    def subscribe(self, topics: list[str], on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        self.user_cbs = (on_assign, on_revoke, on_lost)
        _K.subscribe(self.app, topics, on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_lost)

    def assign(self, partitions: list[TopicPartition], incremental: bool) -> None:
        if not self.in_rebalance and not incremental:
            keep = {_key(tp) for tp in partitions}
            self.let_go([k for k in self.assigned if k not in keep], lost=False)
        recovered = self.recoverer.recover(partitions)
        if self.in_rebalance:
            self.assigned_in_cb = True
        (_K.incremental_assign if incremental else _K.assign)(self.app, recovered.partitions)
        keys = {_key(tp) for tp in recovered.partitions}
        self.assigned = (self.assigned | keys) if incremental else keys
        topics = {k.topic for k in self.assigned}
        self.offsets.single_topic = next(iter(topics)) if len(topics) == 1 else None
        self.started(recovered)

    def started(self, recovered: Recovered) -> None:
        """Hand new ranges to the child; mirror them into the commit metadata (same offset)."""
        self.floors.update(recovered.floors)
        token_ids, to_mirror = recovered.started, recovered.to_mirror
        self.routes = self.book.routes()
        works = self.book.works(token_ids)
        if works:
            self.child.add(works)
        if self.settings.commit_mirror and to_mirror:
            try:
                _K.commit(self.app, offsets=[self.with_mirror(k, c, None) for k, c in to_mirror], asynchronous=False)
            except KafkaException as exc:
                log.warning("could not mirror ranges into commit metadata: %s", exc)

    def unassign(self, keys: list[TopicPartitionKey] | None) -> None:
        gone = list(self.assigned) if keys is None else keys
        if not self.in_rebalance:
            self.let_go(gone, lost=False)
        else:
            self.assigned_in_cb = True
        if keys is None:
            _K.unassign(self.app)
            self.assigned = set()
        else:
            _K.incremental_unassign(self.app, [TopicPartition(k.topic, k.partition) for k in keys])
            self.assigned -= set(keys)

    def on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.in_rebalance, self.assigned_in_cb = True, False
        try:
            if self.user_cbs[0] is not None:
                self.user_cbs[0](self.app, partitions)
        finally:
            self.in_rebalance = False
        if not self.assigned_in_cb:
            self.assign(partitions, incremental=self.cooperative)

    def on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.rebalance_out(partitions, self.user_cbs[1], lost=False)

    def on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.rebalance_out(partitions, self.user_cbs[2] or self.user_cbs[1], lost=True)

    def rebalance_out(self, partitions: list[TopicPartition], user_cb: RebalanceCallback | None, lost: bool) -> None:
        keys = [_key(tp) for tp in partitions]
        try:
            self.in_rebalance = True
            if user_cb is not None:
                user_cb(self.app, partitions)
        finally:
            self.in_rebalance = False
            self.let_go(keys, lost=lost)
            self.assigned -= set(keys)

    def let_go(self, keys: list[TopicPartitionKey], lost: bool) -> None:
        """Partitions leave this member: commit what we may, hand unfinished ranges back, release."""
        if not keys:
            return
        if self.deferred:
            self.commit_deferred()
        if not lost:
            if self.auto_store:
                self.offsets.settle()
                for run in self.child_runs:
                    self.book.store_upto(run.token_id, run.last + 1)
            self.child_runs = []
            if self.auto_commit:
                done = self.offsets.take_dirty(keys)
                tps = [self.with_mirror(TopicPartitionKey(*k), o, None) for k, o in done.items()]
                if tps:
                    try:
                        _K.commit(self.app, offsets=tps, asynchronous=False)
                    except KafkaException as exc:
                        log.warning("commit on revoke failed: %s", exc)
                self.book.promote_stored(keys)
            self.committer.flush_sync(keys, raise_errors=False)
            self.hand_back(keys)
        self.child.drop(keys)
        released = self.book.remove_partitions(keys)
        self.offsets.drop(keys)
        for key in keys:
            self.floors.pop(key, None)
            self.held_eof.pop(key, None)
        self.routes = self.book.routes()
        store = self.link.get()
        if lost or store is None:
            return
        for held in released:
            if held.parked:
                continue
            try:
                store.release(held.token.id, self.owner, held.token.epoch)
            except StoreError as exc:
                log.debug("release of range #%d failed: %s", held.token.id, exc)

    def hand_back(self, keys: list[TopicPartitionKey]) -> None:
        """Move Kafka's offset down to the lowest unfinished offset of partitions with open ranges.

        What the primary processed above the ranges becomes *done* tokens first, so a
        fastrecover successor does not re-read it, while any successor, a plain
        consumer included, starts at the lowest offset not yet processed: turning the
        mode off, or a mixed group after a graceful hand-over, loses nothing.
        """
        store = self.link.get()
        open_keys = [k for k in keys if any(not h.parked and not h.pending.done for h in self.book.held(k))]
        if store is None or not open_keys:
            return
        try:
            current = {
                _key(tp): tp.offset
                for tp in _K.committed(
                    self.app,
                    [TopicPartition(k.topic, k.partition) for k in open_keys],
                    timeout=self.settings.recovery_timeout_s,
                )
            }
        except KafkaException as exc:
            log.warning("could not read committed offsets to hand ranges back: %s", exc)
            return
        tps = []
        for key in open_keys:
            held = [h for h in self.book.held(key) if not h.parked]
            lowest = min(h.pending.committed for h in held if not h.pending.done)
            primary_at = current.get(key, -1)
            if primary_at <= lowest:
                continue
            try:
                known = [
                    t.span for t in store.partition_ranges(self.group, key.topic, key.partition, ending_after=lowest)
                ]
                for gap in subtract_all(lowest, primary_at, known):
                    token = store.create_range(self.group, key.topic, key.partition, gap[0], gap[1], self.owner)
                    if token.is_open and token.owner == self.owner:
                        store.commit_one(
                            ProgressUpdate(token.id, self.owner, token.epoch, RangeProgress(gap[0], gap[1], gap[1]))
                        )
            except StoreError as exc:
                log.warning("could not record %s's primary progress; its Kafka offset stays: %s", key, exc)
                continue
            tps.append(self.with_mirror(key, lowest, None))
        if tps:
            try:
                _K.commit(self.app, offsets=tps, asynchronous=False)
            except KafkaException as exc:
                log.warning("could not hand ranges back to Kafka's offsets: %s", exc)

    # ---- the rest --------------------------------------------------------------------------

    def pause(self, partitions: list[TopicPartition]) -> None:
        _K.pause(self.app, partitions)
        self.child.pause(_key(tp) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        _K.resume(self.app, partitions)
        self.child.resume(_key(tp) for tp in partitions)

    def seek(self, partition: TopicPartition) -> None:
        if partition.offset >= 0 and self.child.rewind(_key(partition), partition.offset):
            return
        _K.seek(self.app, partition)

    def set_sasl_credentials(self, username: str, password: str) -> None:
        _K.set_sasl_credentials(self.app, username, password)
        self.child.set_credentials(username, password)

    def backfill_progress(self) -> list[tuple[Token, RangeProgress]]:
        return [(h.token, h.pending) for h in self.book.held()]

    def close(self) -> None:
        try:
            self.let_go(list(self.assigned), lost=False)
            _K.close(self.app)
        finally:
            self.child.close()
            self.committer.close()
            self.link.close()


def subtract_all(low: int, high: int, spans: list[Any]) -> list[tuple[int, int]]:
    """``[low, high)`` minus ``spans``, as (start, end) pairs."""
    from fastrecover.ranges import OffsetRange

    return [(r.start, r.end) for r in subtract(OffsetRange(low, high), spans)]
