"""Assignment and hand-over: recovery on assign, commits and range release on revoke.

A partition that leaves this member with unfinished ranges is *handed back*
(:mod:`fastrecover.hand_back`) after the application's own revoke callback has run,
so that any successor, a plain consumer included, starts where nothing is lost.

:class:`Handover` owns the application's rebalance callbacks and whether one of them is
running; the partitions themselves are the registry's (:mod:`fastrecover.partitions`), whose
:meth:`~fastrecover.partitions.Partitions.remove` is the one call that forgets a partition.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover.commits import CommitRouter
from fastrecover.errors import StoreError
from fastrecover.hand_back import HandBack
from fastrecover.mode_state import ModeParts, RebalanceCallback, key_of
from fastrecover.recoverer import Recovered
from fastrecover.steady import SteadyGate
from fastrecover.streams import Streams
from fastrecover.tokens import TopicPartitionKey

log = logging.getLogger("fastrecover.handover")

_K = _KafkaConsumer
#: an assignment of at least this many partitions runs with Python's cyclic collector paused
_GC_PAUSE_PARTITIONS = 256


@contextmanager
def _collector_paused(pause: bool) -> Iterator[None]:
    """Python's cyclic collector off for one large recovery, if it was on.

    A recovery of thousands of partitions allocates tens of thousands of objects that all stay
    live; the collector walked the whole heap for them twice at 2,048 partitions (0.16-0.54 s) on
    the way to the first fresh record.  None of it is garbage: the collections run later, with the
    next allocations, off that path.
    """
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Handover:
    """subscribe/assign/unassign and the rebalance callbacks of the KIP-333 mode."""

    def __init__(self, parts: ModeParts, router: CommitRouter, streams: Streams, gate: SteadyGate) -> None:
        self._parts = parts
        self._router = router
        self._streams = streams
        self._gate = gate
        self._app = parts.app
        self._book = parts.book
        self._partitions = parts.partitions
        self.user_cbs: tuple[RebalanceCallback | None, ...] = (None, None, None)
        #: an application's rebalance callback runs: its assign()/unassign() only records that it called them
        self.in_rebalance = False
        self.assigned_in_cb = False
        #: partitions the application's callback unassigned: let go once the callback returns, so that
        #: its own commits of them, made after the unassign, are still routed
        self._leaving: list[TopicPartitionKey] = []
        #: the application assigned partitions itself (no group subscription): librdkafka's close calls
        #: no rebalance callback for them, so close() lets them go first (see ParallelMode.close)
        self.manual = False
        self.hand_back = HandBack(parts)

    def subscribe(self, topics: list[str], on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        _K.subscribe(self._app, topics, on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_lost)
        self.subscribed(on_assign, on_revoke, on_lost)

    def subscribed(self, on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        """The primary was subscribed with callbacks that reach this hand-over's (``subscribe()``, or
        the consumer's relays while its mode was being built: fastrecover/startup.py)."""
        # what they raise is held for the next poll()/consume(), not thrown into confluent_kafka (held.py)
        guard = self._parts.held.guarded
        self.user_cbs = tuple(None if cb is None else guard(cb) for cb in (on_assign, on_revoke, on_lost))
        self.manual = False
        self._gate.expect_assignment()

    def assign(self, partitions: list[TopicPartition], incremental: bool) -> None:
        """The application's assign() or incremental_assign(): a manual assignment outside a rebalance."""
        if not self.in_rebalance:
            self.manual = True
        self._assign_now(partitions, incremental)

    def _assign_now(self, partitions: list[TopicPartition], incremental: bool) -> None:
        with _collector_paused(len(partitions) >= _GC_PAUSE_PARTITIONS):
            self._assign(partitions, incremental)

    def _assign(self, partitions: list[TopicPartition], incremental: bool) -> None:
        if not incremental:
            keep = {key_of(tp) for tp in partitions}
            self._leave([k for k in self._partitions.assigned if k not in keep])
        if self._leaving:  # unassigned, then assigned again in the same callback: the recovery below takes it over
            coming = {key_of(tp) for tp in partitions}
            self._leaving = [k for k in self._leaving if k not in coming]
        again = [k for k in dict.fromkeys(key_of(tp) for tp in partitions) if self._book.held(k)]
        if again:  # recovery claims their ranges anew: what the current claim has not written would be re-read
            self._parts.committer.flush_sync(again, raise_errors=False)
        recovered = self._parts.recoverer.recover(partitions)
        if self.in_rebalance:
            self.assigned_in_cb = True
        (_K.incremental_assign if incremental else _K.assign)(self._app, recovered.partitions)
        self._partitions.assign(key_of(tp) for tp in recovered.partitions)
        topics = {k.topic for k in self._partitions.assigned}
        self._parts.offsets.set_single_topic(next(iter(topics)) if len(topics) == 1 else None)
        self.started(recovered)

    def started(self, recovered: Recovered) -> None:
        """Mirror new ranges into the commit metadata (same offset), then hand them to the child."""
        token_ids, to_mirror = recovered.started, recovered.to_mirror
        self._partitions.set_floors(recovered.floors)
        self._partitions.refresh()
        # Mirrored before the child is given its ranges: from then on its thread backfills them, takes
        # the GIL between its records and the CPU from the broker.  At 2,048 partitions, building and
        # committing the mirrors after that took about twice as long, on the way to the first fresh record.
        try:
            if self._parts.settings.commit_mirror and to_mirror:
                try:
                    _K.commit(
                        self._app,
                        offsets=[self._parts.with_mirror(k, c, None) for k, c in to_mirror],
                        asynchronous=False,
                    )
                except KafkaException as exc:
                    log.warning("could not mirror ranges into commit metadata: %s", exc)
        finally:
            child = self._parts.child
            if recovered.renamed:  # read on from the delivery cursor: given again, a range would be read twice
                child.rename(recovered.renamed)
                taken = set(recovered.renamed.values())
                token_ids = [t for t in token_ids if t not in taken]
            for token_id in recovered.dropped:
                child.drop_range(token_id)
            for key, offset in recovered.moved.items():
                self._move(key, offset)
            # whatever the mirror's fate, the primary has skipped: the child must read what it skipped
            works = self._book.works(token_ids)
            if works:
                self._gate.leave()
                child.add(works)

    def _move(self, key: TopicPartitionKey, offset: int) -> None:
        """The primary of a replaying partition skips to ``offset``: the store has the ranges below it."""
        self._parts.note_seek(key)
        try:
            _K.seek(self._app, TopicPartition(key.topic, key.partition, offset))
        except KafkaException as exc:
            # its range is in the store: the child reads it while the replay goes on (duplicates, nothing lost)
            log.warning(
                "%s: could not move the primary to %d after the store opened (%s); it replays on", key, offset, exc
            )

    def finish_recoveries(self, wait: bool = False) -> None:
        """The store's part of the recoveries made while it opened, once it is open.

        With ``wait`` (a synchronous commit or a revoke while the child reads ranges early) the open
        is waited for, bounded as any store call: their progress can be made durable only in the store.
        """
        parts = self._parts
        if not parts.recoverer.pending or (parts.link.opening and not wait):
            return
        if wait and parts.link.opening:
            parts.link.get()
        late = parts.recoverer.late
        positions = dict(parts.positions(late) or ()) if late else None
        recovered = parts.recoverer.recover_pending(self._partitions.assigned, positions)
        if recovered is not None:
            self.started(recovered)

    def unassign(self, keys: list[TopicPartitionKey] | None) -> None:
        self._leave(list(self._partitions.assigned) if keys is None else keys)
        if self.in_rebalance:
            self.assigned_in_cb = True
        if keys is None:
            _K.unassign(self._app)
        else:
            _K.incremental_unassign(self._app, [TopicPartition(k.topic, k.partition) for k in keys])

    def _leave(self, keys: list[TopicPartitionKey]) -> None:
        """The application gives partitions up: now, or when its rebalance callback returns."""
        if self.in_rebalance:
            self._leaving.extend(k for k in keys if k not in self._leaving)
        else:
            self.let_go(keys, lost=False)

    def on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.in_rebalance, self.assigned_in_cb = True, False
        try:
            if self.user_cbs[0] is not None:
                self.user_cbs[0](self._app, partitions)
        finally:
            # Also when the application's callback raised: confluent_kafka then assigns the partitions
            # itself (and poll() raises the error), which would start them at the committed offset,
            # with no recovery.  The assignment is made here, with recovery, and the error goes on.
            self.in_rebalance = False
            leaving, self._leaving = self._leaving, []
            self.let_go(leaving, lost=False)
            if not self.assigned_in_cb:
                self._assign_now(partitions, incremental=self._parts.cooperative)
            self._gate.assignment_made()

    def on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.rebalance_out(partitions, self.user_cbs[1], lost=False)

    def on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.rebalance_out(partitions, self.user_cbs[2] or self.user_cbs[1], lost=True)

    def rebalance_out(self, partitions: list[TopicPartition], user_cb: RebalanceCallback | None, lost: bool) -> None:
        keys = [key_of(tp) for tp in partitions]
        self._gate.expect_assignment()  # a rebalance: the new assignment follows
        try:
            self.in_rebalance = True
            if user_cb is not None:
                user_cb(self._app, partitions)
        finally:
            self.in_rebalance = False
            leaving, self._leaving = self._leaving, []
            self.let_go([k for k in leaving if k not in keys], lost=False)
            self.let_go(keys, lost=lost)

    def let_go(self, keys: list[TopicPartitionKey], lost: bool) -> None:
        """Partitions leave this member: commit what we may, hand unfinished ranges back, release.

        The one path by which a partition leaves: what it owes Kafka and the store is settled, then
        :meth:`Partitions.remove` forgets it in every unit at once.
        """
        if not keys:
            return
        self._router.flush_deferred()
        if not lost and self._book.has_early:  # what the child read early is written before the partition goes
            try:
                self.finish_recoveries(wait=True)
            except StoreError as exc:  # the open's own error (a schema behind): the marker keeps the ranges
                log.warning("range store not usable while letting partitions go: %s", exc)
        parts = self._parts
        if not lost:
            if parts.auto_store:
                self._streams.settle_returned(sync=True)
            self._streams.drop_runs()
            if parts.auto_commit:
                done = parts.offsets.take_dirty(keys)
                tps = [self._parts.progress_mirror(TopicPartitionKey(*k), o, None) for k, o in done.items()]
                if tps:
                    try:
                        _K.commit(self._app, offsets=tps, asynchronous=False)
                    except KafkaException as exc:
                        log.warning("commit on revoke failed: %s", exc)
                self._book.promote_stored(keys)
            parts.committer.flush_sync(keys, raise_errors=False)
            self.hand_back.run(keys)
        released = self._partitions.remove(keys)
        store = self.hand_back.store_for_release()
        if lost or store is None:
            return
        for held in released:
            if held.parked:
                continue
            try:
                store.release(held.token.id, self._parts.owner, held.token.epoch)
            except StoreError as exc:
                log.debug("release of range #%d failed: %s", held.token.id, exc)
