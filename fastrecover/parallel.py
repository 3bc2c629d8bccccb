"""The KIP-333 mode of a consumer: two record streams merged, commits routed to two logs.

:class:`ParallelMode` is what ``fastrecover.Consumer`` delegates to when
``enable.parallel.rebalance`` is on.  It composes units that each own their state and
talk through small methods:

- :class:`~fastrecover.mode_state.ModeParts`: the parts built once (primary offsets, recoverer,
  child, book, committer, store link, partition registry) and the settings;
- :class:`~fastrecover.steady.SteadyGate`: whether poll() may serve the primary alone, and its counters;
- :class:`~fastrecover.streams.Streams`: the merge of the two streams, what was returned until settled;
- :class:`~fastrecover.commits.CommitRouter`: commit(), store_offsets() and committed() over both logs;
- :class:`~fastrecover.handover.Handover`: assignment, revocation, hand-back of ranges;
- :class:`~fastrecover.tick.Ticker`: the periodic tick.

Both consumers are used from the caller's thread only.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException, Message, TopicPartition
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover.commits import CommitRouter
from fastrecover.handover import Handover
from fastrecover.mode_state import ModeParts, key_of
from fastrecover.ranges import RangeProgress
from fastrecover.steady import SteadyGate
from fastrecover.streams import Streams
from fastrecover.tick import Ticker
from fastrecover.tokens import Token

if TYPE_CHECKING:
    from fastrecover.metrics import ConsumerMetrics
    from fastrecover.startup import PendingMode

log = logging.getLogger("fastrecover.consumer")

_K = _KafkaConsumer


def _wait(deadline: float | None, now: float, piece: float) -> float:
    """The next wait on the primary: a slice (``piece``), or what is left before ``deadline`` (None: none)."""
    if deadline is None:
        return piece
    return min(piece, max(0.0, deadline - now))


class ParallelMode:
    """The mode-on consumer's facade: poll()/consume() over the units, and the calls that reach one unit."""

    def __init__(self, app: _KafkaConsumer, pending: PendingMode) -> None:
        self.parts = parts = ModeParts(app, pending.conf, pending.settings, pending.child, pending.held)
        self.app = app
        self.gate = SteadyGate()
        self.held = parts.held
        self.held.ends_runs_of(self.gate)
        self.streams = Streams(parts, self.gate)
        self.router = CommitRouter(parts, self.streams)
        self.handover = Handover(parts, self.router, self.streams, self.gate)
        self.router.wait_for_store_with(self.handover.finish_recoveries)
        self.ticker = Ticker(parts, self.router, self.streams, self.handover, self.gate)
        # read by Consumer's per-record paths and by operators' tools: the parts, never replaced
        self.partitions = parts.partitions
        self.auto_store = parts.auto_store
        self.settings = parts.settings
        self.owner = parts.owner
        self.book = parts.book
        self.child = parts.child
        self.recoverer = parts.recoverer
        self.offsets = parts.offsets
        self.link = parts.link
        # the calls that one unit answers alone
        self.commit = self.router.commit
        self.store_offsets = self.router.store_offsets
        self.committed = self.router.committed
        self.subscribe = self.handover.subscribe
        self.assign = self.handover.assign
        self.unassign = self.handover.unassign
        self.note_primary = self.streams.note_primary
        self.note_batch = self.streams.note_batch

    @property
    def steady(self) -> bool:
        return bool(self.gate.steady)

    @property
    def child_restarts(self) -> int:
        return self.ticker.child_restarts

    # ---- per call --------------------------------------------------------------------------

    def begin(self) -> float:
        """What every poll()/consume() does first: settle the previous call's records, tick."""
        parts = self.parts
        if parts.offsets.untracked and parts.sync_positions():
            parts.offsets.track()  # the steady state ended: from here on records are kept
        if parts.auto_store:
            self.streams.settle_returned(sync=False)
        else:
            self.streams.forget_returned()
        now = time.monotonic()
        self.ticker.tick_if_due(now)
        return now

    def steady_wait(self, deadline: float | None) -> tuple[float, float] | None:
        """The steady state's next wait on the primary and its slice, after the tick if one is due;
        None when that tick ended the steady state."""
        now = time.monotonic()
        self.ticker.tick_if_due(now)
        if not self.gate.steady:
            return None
        return self.next_wait(deadline, now)

    def next_wait(self, deadline: float | None, now: float) -> tuple[float, float]:
        """The next wait on the primary (a slice, or what is left before ``deadline``) and the slice.

        Until the cluster's id is known, a join's wait first waits on the primary's metadata, which
        carries it, within the same bounds: the recovery that follows runs inside a callback, where
        asking is not safe (RecoveryReads.learn_cluster).
        """
        piece = self.gate.wait_slice(now)
        if now < self.gate.joining_until and not self.recoverer.cluster_known:
            self.recoverer.learn_cluster(_wait(deadline, now, piece))
            now = time.monotonic()
        return _wait(deadline, now, piece), piece

    def poll(self, timeout: float | None) -> Message | None:
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        gate = self.gate
        while True:
            self.held.raise_held()  # a callback's error, once the records of the call it ran in are out
            if gate.steady:  # no backfill under way: the primary alone, its records untracked (positions)
                waits = self.steady_wait(deadline)
                if waits is not None:
                    wait, piece = waits
                    # the clock was read: the next calls with this timeout skip it (Consumer.poll)
                    gate.start_run(timeout)
                    msg = _K.poll(self.app, wait)
                    if msg is not None:
                        gate.count(1)
                        return msg
                    gate.end_run()
                    if wait < piece:
                        return None  # the deadline came
                    continue  # a slice of the wait ended: the state may have changed in it (a recovery)
            if not self.streams.backfilling:
                wait, piece = self.next_wait(deadline, self.begin())
                msg = self.note_primary(_K.poll(self.app, wait))
                if msg is not None or wait < piece:
                    return msg
                continue
            # during a backfill poll() is consume(1): one merge loop serves both (the turns alternate the streams)
            left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            msgs = self.consume(1, left)
            return msgs[0] if msgs else None

    def consume(self, num: int, timeout: float) -> list[Message]:
        deadline = None if timeout < 0 else time.monotonic() + timeout
        while True:
            self.held.raise_held()
            if self.gate.steady:
                waits = self.steady_wait(deadline)
                if waits is not None:
                    wait, piece = waits
                    msgs = _K.consume(self.app, num, wait)
                    if msgs or wait < piece:
                        self.gate.count(len(msgs))
                        return msgs
                    continue  # a slice of the wait ended: the state may have changed in it (a recovery)
            now = self.begin()
            if not self.streams.backfilling:
                wait, piece = self.next_wait(deadline, now)
                msgs = self.note_batch(_K.consume(self.app, num, wait))
                if msgs or wait < piece:
                    return msgs
                continue
            merged = self.streams.merge(num, deadline, self.ticker.tick_if_due)
            if merged is not None:
                return merged
            # the backlog is done: the primary alone from here, still in slices (another recovery may come)
            left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            return self.consume(num, left)

    # ---- the rest --------------------------------------------------------------------------

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self.handover.unassign([key_of(tp) for tp in partitions])

    def pause(self, partitions: list[TopicPartition]) -> None:
        _K.pause(self.app, partitions)
        self.child.pause(key_of(tp) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        _K.resume(self.app, partitions)
        self.child.resume(key_of(tp) for tp in partitions)

    def seek(self, partition: TopicPartition) -> None:
        if partition.offset >= 0 and self.child.rewind(key_of(partition), partition.offset):
            return
        key = key_of(partition)
        self.parts.note_seek(key)
        self.recoverer.app_seeked(key)
        _K.seek(self.app, partition)

    def set_sasl_credentials(self, username: str, password: str) -> None:
        _K.set_sasl_credentials(self.app, username, password)
        self.child.set_credentials(username, password)

    def backfill_progress(self) -> list[tuple[Token, RangeProgress]]:
        return [(h.token, h.pending) for h in self.book.held()]

    def metrics(self) -> ConsumerMetrics:
        # the snapshot types are made at the first call, not while the mode is imported during the join
        from fastrecover.metrics import ConsumerMetrics, backfill_by_partition

        held = self.book.held()
        reports = self.recoverer.reports
        committer = self.parts.committer
        return ConsumerMetrics(
            parallel_rebalance=True,
            ranges_open=len(held),
            ranges_done=committer.ranges_done,
            backfill=backfill_by_partition(
                [(h.token.topic, h.token.partition, h.pending.committed, h.pending.end) for h in held]
            ),
            primary_messages=self.gate.primary_messages,
            child_records=self.child.records_delivered,
            child_alive=self.child.is_alive(),
            child_restarts=self.ticker.child_restarts,
            recoveries=sum(1 for r in reports if r.new_ranges or r.resumed),
            degraded_recoveries=sum(1 for r in reports if r.degraded),
            fencings=committer.fencings,
            mirror_degradations=self.book.mirror_degradations,
            store_commits=committer.commits,
            store_commit_failures=committer.failures,
            store_commit_latency=committer.latency.snapshot(),
        )

    def close(self) -> None:
        """Hand unfinished ranges back after the application's on_revoke, as in any rebalance.

        librdkafka's close revokes a subscription's partitions through the rebalance callback:
        the application's on_revoke runs, its commits routed, and the hand-back runs after it.
        Handed back first, an on_revoke that commits (``commit()``, ``commit(message=m)``) put
        Kafka's offset back above the unfinished ranges, and a plain successor skipped them.
        Partitions the application assigned itself get no callback: they are let go here first.
        """
        try:
            manual = self.handover.manual
            if manual:
                self.handover.let_go(list(self.partitions.assigned), lost=False)
            else:
                try:  # the last record returned is processed, as a revoke counts it: the hand-back reads it
                    self.router.settle_stored()
                except KafkaException as exc:  # librdkafka's close must run whatever: it leaves the group
                    log.warning("close: could not store the offsets of the last records returned: %s", exc)
                self.handover.hand_back.prepare_close(self.router.closing())
            _K.close(self.app)
            if not manual and len(self.partitions):
                log.warning(
                    "close: librdkafka revoked no partition; the open ranges of %d partitions stay with "
                    "the group's next owner, as after a crash",
                    len(self.partitions),
                )
        finally:
            self.child.close()
            self.parts.committer.close()
            self.link.close()
        self.held.raise_held()  # an on_revoke's error during close: raised once closed, as plain's close() does
