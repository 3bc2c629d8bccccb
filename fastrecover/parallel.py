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
import time
from collections.abc import Iterable
from typing import cast

from confluent_kafka import Consumer as _KafkaConsumer
from confluent_kafka import KafkaError, Message, TopicPartition

from fastrecover.batches import Run
from fastrecover.handover import Handover
from fastrecover.metrics import ConsumerMetrics, backfill_by_partition
from fastrecover.mode_state import FAST_CALLS, IDLE_SLICE_S, key_of
from fastrecover.ranges import (
    RangeProgress,
)
from fastrecover.tokens import Token, TopicPartitionKey

log = logging.getLogger("fastrecover.consumer")

_TICK_S = 0.05
_WAIT_SLICE_S = 0.02
_K = _KafkaConsumer


def _wait(deadline: float | None, now: float, piece: float) -> float:
    """The next wait on the primary: a slice (``piece``), or what is left before ``deadline`` (None: none)."""
    if deadline is None:
        return piece
    return min(piece, max(0.0, deadline - now))


class ParallelMode(Handover):
    """The merged record streams, the periodic tick and the remaining KIP-333 calls."""

    # ---- per call --------------------------------------------------------------------------

    @property
    def backfilling(self) -> bool:
        return self.child.has_work or bool(self.ready_eof) or bool(self.child_runs)

    def begin(self) -> float:
        """What every poll()/consume() does first: settle the previous call's records, tick."""
        if self.offsets.untracked and self.sync_positions():
            self.offsets.untracked = False  # the steady state ended: from here on records are kept
        if self.auto_store:
            self.offsets.settle()
            if self.child_runs:
                runs, self.child_runs = self.child_runs, []
                for run in runs:
                    self.book.store_upto(run.token_id, run.last + 1)
        elif self.offsets.last is not None or self.offsets.unsettled or self.child_runs:
            self.offsets.forget_unsettled()
            self.child_runs = []
        now = time.monotonic()
        if now >= self.next_tick:
            self.tick(now)
        return now

    def tick(self, now: float) -> None:
        self.next_tick = now + _TICK_S
        if self.offsets.untracked:
            self.sync_positions()
        if self.deferred:
            self.commit_deferred()
        if self.deferred_stored:
            self.store_deferred()
        self.store_primary()
        for event in self.child.drain_events():
            self.apply_event(event)
        finished = self.child.drain_finished()
        if finished and self.held_eof:
            self.release_eof(key for _token_id, key in finished)
        if self.child.failure is not None and self.book.has_work and now >= self.next_child_restart:
            # at most one new handle per back-off: a handle that cannot work must not spin
            self.next_child_restart = now + max(self.settings.retry_backoff_s, _TICK_S)
            self.child_restarts += 1
            log.warning(
                "child consumer died (%r); restarting it from the ranges' committed offsets and delivery cursors",
                self.child.failure,
            )
            self.child.restart()
        if self.auto_commit and now >= self.next_range_commit:
            self.next_range_commit = now + self.commit_interval_s
            self.book.promote_stored()
        self.committer.tick(now)
        self.after_commits()
        if self.link.open_ended:
            self.link.get()  # what the background open raised (a store behind in schema) reaches the caller here
        pending = self.recoverer.pending
        if pending and not self.link.opening:
            recovered = self.recoverer.recover_pending(self.assigned)
            if recovered is not None:
                self.started(recovered)
        # a recovery the store has still to finish keeps the steady state: its replay runs at the plain
        # client's speed, and a tick comes at least every FAST_CALLS records or idle wait to finish it
        self.steady = not (self.backfilling or self.deferred or self.deferred_stored or self.held_eof)
        if self.steady and self.auto_store:
            self.offsets.untracked = True  # a tick runs at a call's start: everything returned is done
        if not self.steady:
            self.fast_calls = 0

    # ---- the merged streams ----------------------------------------------------------------

    def note_primary(self, msg: Message | None) -> Message | None:
        if msg is not None:
            self.primary_messages += 1
            if msg.error() is None:
                self.offsets.last = msg
            elif self.eof and cast(KafkaError, msg.error()).code() == KafkaError._PARTITION_EOF:
                return self.hold_eof(msg)
        return msg

    def note_child(self, msgs: list[Message], runs: list[Run]) -> list[Message]:
        self.child_runs.extend(runs)
        return msgs

    def steady_wait(self, deadline: float | None) -> tuple[float, float] | None:
        """The steady state's next wait on the primary and its slice, after the tick if one is due;
        None when that tick ended the steady state."""
        now = time.monotonic()
        if now >= self.next_tick:
            self.tick(now)
        if not self.steady:
            return None
        return self.next_wait(deadline, now)

    def next_wait(self, deadline: float | None, now: float) -> tuple[float, float]:
        """The next wait on the primary (a slice, or what is left before ``deadline``) and the slice."""
        piece = self.wait_slice(now)
        return _wait(deadline, now, piece), piece

    def poll(self, timeout: float | None) -> Message | None:
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            if self.steady:  # no backfill under way: the primary alone, its records untracked (positions)
                waits = self.steady_wait(deadline)
                if waits is not None:
                    wait, piece = waits
                    # the clock was read: the next calls with this timeout skip it (Consumer.poll), each
                    # waiting for the timeout or, if longer, one slice
                    self.fast_calls = FAST_CALLS
                    self.fast_timeout = timeout
                    self.fast_wait = timeout if timeout is not None and 0 <= timeout <= IDLE_SLICE_S else IDLE_SLICE_S
                    msg = _K.poll(self.app, wait)
                    if msg is not None:
                        self.primary_messages += 1
                        return msg
                    self.fast_calls = 0
                    if wait < piece:
                        return None  # the deadline came
                    continue  # a slice of the wait ended: the state may have changed in it (a recovery)
            if not self.backfilling:
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
            if self.steady:
                waits = self.steady_wait(deadline)
                if waits is not None:
                    wait, piece = waits
                    msgs = _K.consume(self.app, num, wait)
                    if msgs or wait < piece:
                        self.primary_messages += len(msgs)
                        return msgs
                    continue  # a slice of the wait ended: the state may have changed in it (a recovery)
            now = self.begin()
            if not self.backfilling:
                wait, piece = self.next_wait(deadline, now)
                msgs = self.note_batch(_K.consume(self.app, num, wait))
                if msgs or wait < piece:
                    return msgs
                continue
            return self._merge(num, deadline)

    def _merge(self, num: int, deadline: float | None) -> list[Message]:
        """Up to ``num`` records of both streams: the primary's share first, the child's after."""
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
            if self.child.reading:  # the backlog is where records are coming: wait on the child
                msgs, runs = self.child.take(num, wait=remaining)
                if msgs:
                    return self.note_child(msgs, runs)
                primary = self.note_batch(_K.consume(self.app, num, 0))
            else:
                primary = self.note_batch(_K.consume(self.app, num, remaining))
            if primary:
                return primary
            now = time.monotonic()
            if now >= self.next_tick:
                self.tick(now)
            if not self.backfilling:
                # the backlog is done: the primary alone from here, still in slices (another recovery may come)
                left = -1.0 if deadline is None else max(0.0, deadline - now)
                return self.consume(num, left)

    def note_batch(self, msgs: list[Message]) -> list[Message]:
        if not msgs:
            return msgs
        self.primary_messages += len(msgs)
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

    # ---- the rest --------------------------------------------------------------------------

    def pause(self, partitions: list[TopicPartition]) -> None:
        _K.pause(self.app, partitions)
        self.child.pause(key_of(tp) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        _K.resume(self.app, partitions)
        self.child.resume(key_of(tp) for tp in partitions)

    def seek(self, partition: TopicPartition) -> None:
        if partition.offset >= 0 and self.child.rewind(key_of(partition), partition.offset):
            return
        if self.offsets.untracked:
            self.note_seek(partition)
        _K.seek(self.app, partition)

    def note_seek(self, partition: TopicPartition) -> None:
        """Untracked records returned before a seek stay accounted for: librdkafka forgets the position."""
        for key, offset in self.positions([(partition.topic, partition.partition)]) or ():
            self.offsets.seeking(key, offset)

    def set_sasl_credentials(self, username: str, password: str) -> None:
        _K.set_sasl_credentials(self.app, username, password)
        self.child.set_credentials(username, password)

    def backfill_progress(self) -> list[tuple[Token, RangeProgress]]:
        return [(h.token, h.pending) for h in self.book.held()]

    def metrics(self) -> ConsumerMetrics:
        held = self.book.held()
        reports = self.recoverer.reports
        committer = self.committer
        return ConsumerMetrics(
            parallel_rebalance=True,
            ranges_open=len(held),
            ranges_done=committer.ranges_done,
            backfill=backfill_by_partition(
                [(h.token.topic, h.token.partition, h.pending.committed, h.pending.end) for h in held]
            ),
            primary_messages=self.primary_messages,
            child_records=self.child.records_delivered,
            child_alive=self.child.is_alive(),
            child_restarts=self.child_restarts,
            recoveries=sum(1 for r in reports if r.new_ranges or r.resumed),
            degraded_recoveries=sum(1 for r in reports if r.degraded),
            fencings=committer.fencings,
            mirror_degradations=self.book.mirror_degradations,
            store_commits=committer.commits,
            store_commit_failures=committer.failures,
            store_commit_latency=committer.latency.snapshot(),
        )

    def close(self) -> None:
        try:
            self.let_go(list(self.assigned), lost=False)
            _K.close(self.app)
        finally:
            self.child.close()
            self.committer.close()
            self.link.close()
