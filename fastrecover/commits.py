"""The commit router: offsets inside a held range go to the store, the rest to Kafka.

Per-message commits and stores of partitions with ranges are deferred and routed a batch at a
time (:class:`CommitRouter` owns the two lists); the store side is written behind
(:mod:`fastrecover.committer`) unless the commit is synchronous.  ``committed()`` merges both
logs the way the KIP describes.  What follows a store commit (mirrors refreshed, finished
partitions moved to their floor) is here too: only a commit changes them.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover import hooks
from fastrecover.book import RangeBook
from fastrecover.codec import is_mirror
from fastrecover.errors import StoreError
from fastrecover.mode_state import ModeParts, key_of
from fastrecover.paced import PacedWarning
from fastrecover.ranges import (
    RangeProgress,
    merged_committed,
    route_commit,
    route_records,
    split_commit,
)
from fastrecover.tokens import TopicPartitionKey

if TYPE_CHECKING:
    from fastrecover.streams import Streams

log = logging.getLogger("fastrecover.commits")

_K = _KafkaConsumer


#: per-message calls of partitions with ranges, waiting for the next tick: each partition's offsets in call order
Deferred = dict[tuple[str, int], list[int]]


def route_deferred(book: RangeBook, deferred: Deferred) -> tuple[dict[int, list[int]], dict[TopicPartitionKey, int]]:
    """Deferred record offsets, split per partition: offsets per range, next offset per partition.

    Only offsets are kept between the call and the tick, never the ``Message``: the collector
    tracks every record object, and tens of thousands of them kept alive until the tick reached its
    oldest generation and made full collections, about 0.4 µs a record of the caller's thread in a
    ``store_offsets`` drain.  Callers defer records only, never error events (an EOF's offset is the
    log end, which no one has read).
    """
    by_range: dict[int, list[int]] = {}
    primary: dict[TopicPartitionKey, int] = {}
    for (topic, partition), offsets in deferred.items():
        key = TopicPartitionKey(topic, partition)
        routed, mine = route_records(offsets, book.spans(key))
        for token_id, done in routed.items():
            by_range.setdefault(token_id, []).extend(done)
        if mine:
            primary[key] = mine[-1] + 1
    return by_range, primary


class CommitRouter:
    """commit(), store_offsets() and committed() of the KIP-333 mode; owns the deferred per-message calls."""

    def __init__(self, parts: ModeParts, streams: Streams) -> None:
        self._parts = parts
        self._streams = streams
        self.app = parts.app
        self._book = parts.book
        self._partitions = parts.partitions
        #: per-message commits (asynchronous) and stores of partitions with ranges, routed at the next tick
        self.deferred: Deferred = defaultdict(list)
        self.deferred_stored: Deferred = defaultdict(list)
        #: runs the store's part of recoveries made while it opened, waiting for the open (the hand-over's)
        self._finish_recoveries: Callable[[bool], None] = lambda wait: None
        #: while close() runs: the Kafka offsets synchronous commits wrote (an on_revoke's), which the
        #: hand-back counts as processed, since librdkafka answers no committed-offset read inside close
        self.closing_commits: dict[TopicPartitionKey, int] | None = None
        #: committed() reads the store at every call: a store that stays unreadable is said once a minute
        self._unreadable = PacedWarning(log)

    def wait_for_store_with(self, finish: Callable[[bool], None]) -> None:
        """How a synchronous commit makes ranges read early durable first (the hand-over comes after the router)."""
        self._finish_recoveries = finish

    @property
    def pending(self) -> bool:
        return bool(self.deferred or self.deferred_stored)

    def defer_commit(self, key: tuple[str, int], offset: int) -> None:
        """An asynchronous commit of record ``offset`` of ``key``, a partition with ranges: routed at the next tick."""
        self.deferred[key].append(offset)

    def defer_store(self, key: tuple[str, int], offset: int) -> None:
        """A store of record ``offset`` of ``key``, a partition with ranges: routed at the next tick or commit."""
        self.deferred_stored[key].append(offset)

    def flush_deferred(self) -> None:
        """Route the deferred per-message commits and stores now (a tick, a commit, a revoke)."""
        if self.deferred:
            self.commit_deferred()
        if self.deferred_stored:
            self.store_deferred()

    def commit(
        self, message: Message | None, offsets: list[TopicPartition] | None, asynchronous: bool
    ) -> list[TopicPartition] | None:
        if not asynchronous and self._book.has_early:
            # what the child read before the store opened is in memory only: a synchronous commit is durable
            self._finish_recoveries(True)
        if message is not None:
            key = TopicPartitionKey(message.topic() or "", message.partition() or 0)
            if key not in self._partitions.routes:
                return self.commit_primary([(key, message.offset() + 1, None)], asynchronous)  # type: ignore[operator]
            self.defer_commit(key, cast(int, message.offset()))
            if asynchronous:  # routed in bulk at the next tick
                return None
            return self.commit_deferred(sync=True)
        if offsets is not None:
            triples = [(key_of(tp), tp.offset, tp.metadata) for tp in offsets]
            return self.commit_offsets(triples, asynchronous)
        return self.commit_all(asynchronous)

    def store_deferred(self) -> None:
        """Per-message store_offsets() of partitions with ranges, applied a batch at a time."""
        deferred, self.deferred_stored = self.deferred_stored, defaultdict(list)
        by_range, primary = route_deferred(self._book, deferred)
        for token_id, done in by_range.items():
            if self._parts.settings.commit_out_of_order:
                self._book.mark_stored(token_id, done)
            else:  # Kafka's meaning: every record of the range up to the message is done
                self._book.store_upto(token_id, max(done) + 1)
        if primary:
            _K.store_offsets(self.app, offsets=[self._parts.progress_mirror(k, o, None) for k, o in primary.items()])
            self._partitions.drop_floors(primary)

    def commit_deferred(self, sync: bool = False) -> list[TopicPartition] | None:
        """Per-message commits of partitions with ranges, routed a batch at a time."""
        deferred, self.deferred = self.deferred, defaultdict(list)
        by_range, primary = route_deferred(self._book, deferred)
        for token_id, done in by_range.items():
            if self._parts.settings.commit_out_of_order:
                self._book.mark_done(token_id, done)
            else:  # Kafka's meaning: every record of the range up to the message is done
                self._book.commit_upto(token_id, max(done) + 1)
        if not sync:
            if primary:
                self.commit_primary([(k, o, None) for k, o in primary.items()], True)
            return None
        keys = [h.token.key for t in by_range if (h := self._book.get(t)) is not None]
        if not primary:
            ranges = self._parts.committer.flush_sync(keys)
            hooks.fire("between-commits")
            return ranges
        return self.commit_both(keys, lambda: self.commit_primary([(k, o, None) for k, o in primary.items()], False))

    def commit_offsets(
        self, triples: list[tuple[TopicPartitionKey, int, str | None]], asynchronous: bool
    ) -> list[TopicPartition] | None:
        routed: dict[int, int] = {}
        primary: list[tuple[TopicPartitionKey, int, str | None]] = []
        for key, offset, meta in triples:
            token_id = route_commit(offset, self._book.spans(key)) if key in self._partitions.routes else None
            if token_id is None:
                primary.append((key, offset, meta))
                continue
            routed[token_id] = max(offset, routed.get(token_id, offset))
            if meta:
                self._partitions.keep_meta(key, meta)
        for token_id, next_offset in routed.items():
            self._book.commit_upto(token_id, next_offset)
        keys = [h.token.key for t in routed if (h := self._book.get(t)) is not None]
        if asynchronous:  # marked in memory: the write-behind writes it on its cadence (tick)
            if primary or not routed:
                self.commit_primary(primary, True)
            return None
        if not primary and routed:
            return self._parts.committer.flush_sync(keys)
        return self.commit_both(keys, lambda: self.commit_primary(primary, False))

    def commit_primary(
        self, triples: list[tuple[TopicPartitionKey, int, str | None]], asynchronous: bool
    ) -> list[TopicPartition] | None:
        tps = [self._parts.progress_mirror(k, o, m) for k, o, m in triples]
        self._partitions.drop_floors(k for k, _o, _m in triples)
        if asynchronous:
            return _K.commit(self.app, offsets=tps, asynchronous=True)  # type: ignore[no-any-return]
        return self._noted(_K.commit(self.app, offsets=tps, asynchronous=False))

    def closing(self) -> dict[TopicPartitionKey, int]:
        """close() begins: the offsets synchronous commits write from here on are kept, in the dict returned."""
        self.closing_commits = {}
        return self.closing_commits

    def _noted(self, result: list[TopicPartition] | None) -> list[TopicPartition] | None:
        """``result`` of a synchronous Kafka commit, its offsets kept in :attr:`closing_commits` while closing."""
        if self.closing_commits is not None:
            for tp in result or []:
                if tp.error is None and tp.offset >= 0:
                    key = key_of(tp)
                    self.closing_commits[key] = max(tp.offset, self.closing_commits.get(key, tp.offset))
        return result

    def settle_stored(self) -> None:
        """What the application has processed, stored: the primary's in librdkafka's offset store.

        Under ``enable.auto.offset.store`` the records returned so far count as processed, the last one
        too, as librdkafka's own store counts them; the application's deferred ``store_offsets`` go in.
        Nothing is committed here.
        """
        self.flush_deferred()
        if self._parts.auto_store:
            self._streams.settle_returned(sync=True)
        self.store_primary()

    def commit_all(self, asynchronous: bool) -> list[TopicPartition] | None:
        """The offset-less commit(): everything stored so far, in both logs."""
        self.settle_stored()
        self._book.promote_stored()
        if asynchronous:  # marked in memory: the write-behind writes it on its cadence (tick)
            try:
                _K.commit(self.app, asynchronous=True)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._NO_OFFSET or not self._book.held():
                    raise
            return None
        no_offset: list[KafkaException] = []

        def kafka() -> list[TopicPartition] | None:
            try:
                return self._noted(_K.commit(self.app, asynchronous=False))
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._NO_OFFSET:
                    raise
                no_offset.append(exc)  # nothing stored for Kafka: an error only if the store had nothing either
                return []

        committed = self.commit_both(None, kafka)
        if no_offset and not committed:
            raise no_offset[0]
        return committed

    def commit_both(
        self, keys: list[TopicPartitionKey] | None, kafka: Callable[[], list[TopicPartition] | None]
    ) -> list[TopicPartition]:
        """A synchronous commit to both logs: Kafka's round trip and the store's transaction overlap.

        The store write runs on the committer's writer thread while this thread
        waits on Kafka, so the call costs the slower of the two.  The logs are
        independent (a range's token was durable before the primary skipped its
        offsets), so their order does not matter for loss: a crash between them
        re-delivers.  Both outcomes are applied before anything is raised.
        """
        job = self._parts.committer.begin_sync(keys)  # StoreUnavailableError here: nothing was sent to Kafka
        ranges: list[TopicPartition] = []
        if job is not None and hooks.armed("between-commits"):  # the fault point needs the two in order
            ranges, job = self._parts.committer.finish_sync(job), None
            hooks.fire("between-commits")
        try:
            result = kafka()
        except BaseException:
            if job is not None:
                self._parts.committer.finish_sync(job, raise_errors=False)
                self.after_commits()
            raise
        if job is not None:
            ranges = self._parts.committer.finish_sync(job)
        self.after_commits()
        return list(result or []) + ranges

    def store_primary(self, keys: Iterable[TopicPartitionKey] | None = None) -> None:
        """Hand settled primary offsets to librdkafka's offset store (auto-commit and commit() take them)."""
        if not self._parts.auto_store:
            return
        done = self._parts.offsets.take_dirty(keys)
        if not done:
            return
        tps = [self._parts.progress_mirror(TopicPartitionKey(*k), o, None) for k, o in done.items()]
        self._partitions.drop_floors(done)
        try:
            _K.store_offsets(self.app, offsets=tps)
        except KafkaException as exc:
            log.debug("store_offsets skipped: %s", exc)

    def store_offsets(self, message: Message | None, offsets: list[TopicPartition] | None) -> None:
        if message is not None:
            key = TopicPartitionKey(message.topic() or "", message.partition() or 0)
            if key in self._partitions.routes:
                self.defer_store(key, cast(int, message.offset()))  # routed in bulk at the next tick or commit
                return
            next_offset = cast(int, message.offset()) + 1
            _K.store_offsets(self.app, offsets=[self._parts.progress_mirror(key, next_offset, None)])
            self._partitions.drop_floors([key])
            return
        pairs = [(key_of(tp), tp.offset) for tp in offsets or []]
        primary, routed = split_commit(pairs, {k: self._book.spans(k) for k, _ in pairs})
        for token_id, next_offset in routed.items():
            self._book.store_upto(token_id, next_offset)
        if primary:
            _K.store_offsets(self.app, offsets=[self._parts.progress_mirror(k, o, None) for k, o in primary])
            self._partitions.drop_floors(k for k, _o in primary)

    def committed(self, partitions: list[TopicPartition], timeout: float | None) -> list[TopicPartition]:
        """The KIP's merged committed(): below the returned offset everything is checkpointed."""
        result = _K.committed(self.app, partitions) if timeout is None else _K.committed(self.app, partitions, timeout)
        foreign: dict[TopicPartitionKey, list[RangeProgress]] | None = None
        answer = []
        for tp in result:
            key = key_of(tp)
            if is_mirror(tp.metadata):  # our mirror is not the application's metadata
                extra: dict[str, Any] = {"metadata": self._partitions.meta(key), "leader_epoch": tp.leader_epoch}
                tp = TopicPartition(
                    tp.topic, tp.partition, tp.offset, **{k: v for k, v in extra.items() if v is not None}
                )
            answer.append(tp)
            ranges = [h.durable for h in self._book.held(key)]
            if not ranges and key not in self._partitions:
                if foreign is None:
                    foreign = self.foreign_ranges()
                ranges = foreign.get(key, [])
            merged = merged_committed(tp.offset if tp.offset >= 0 else None, ranges)
            if merged is not None:
                tp.offset = merged
        return answer

    def after_commits(self) -> None:
        """Ranges settled or finished in the store: refresh mirrors, move idle partitions' Kafka offsets."""
        committer, offsets = self._parts.committer, self._parts.offsets
        settled = committer.take_settled()
        if settled:
            offsets.mark_dirty(settled)
        finished = committer.take_finished()
        if settled or finished:
            self._partitions.refresh()
        if finished:
            self.advance_idle(finished)

    def advance_idle(self, keys: Iterable[TopicPartitionKey]) -> None:
        """committed() is never stale: a finished partition whose primary committed nothing moves to its floor."""
        tps = []
        offsets, partitions = self._parts.offsets, self._partitions
        offsets.fold()
        for key in keys:
            floor = partitions.floor(key)
            if floor is None or self._book.held(key) or key in offsets.done:
                continue
            partitions.drop_floors([key])
            offsets.advance(key, floor)
            tps.append(TopicPartition(key.topic, key.partition, floor))
        if tps:
            try:
                _K.commit(self.app, offsets=tps, asynchronous=True)
            except KafkaException as exc:
                log.debug("moving finished partitions' offsets: %s", exc)

    def foreign_ranges(self) -> dict[TopicPartitionKey, list[RangeProgress]]:
        store = self._parts.link.get()
        if store is None:
            return {}
        try:
            tokens = store.open_ranges(self._parts.group, skip_corrupt=True)
        except StoreError as exc:
            self._unreadable.failed("committed(): range store unreadable, answering from Kafka only: %s", exc)
            return {}
        self._unreadable.succeeded("committed(): range store readable")
        out: dict[TopicPartitionKey, list[RangeProgress]] = {}
        for t in tokens:
            out.setdefault(t.key, []).append(t.progress)
        return out
