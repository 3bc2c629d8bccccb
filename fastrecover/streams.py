"""The merge of the two record streams: the primary's live records and the child's backlog.

:class:`Streams` owns what the merge keeps between calls: the child's runs returned and not yet
settled, EOF events released once the child finished a partition, and whose turn it is when
``poll()`` asks for one record.  Every message the primary returns outside the steady state
passes here (:meth:`Streams.note_primary`, :meth:`Streams.note_batch`): it is counted, kept for
settling, and an EOF is held while the child still reads the partition (in the partition's
state, :mod:`fastrecover.partitions`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import cast

from confluent_kafka import KafkaError, Message
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover.batches import Run
from fastrecover.mode_state import ModeParts
from fastrecover.steady import SteadyGate
from fastrecover.tokens import TopicPartitionKey

_K = _KafkaConsumer
#: the longest one wait of the merge lasts before both streams are looked at again
_WAIT_SLICE_S = 0.02


class Streams:
    """Both streams merged into one answer; what was returned, until it is settled."""

    def __init__(self, parts: ModeParts, gate: SteadyGate) -> None:
        self._parts = parts
        self._gate = gate
        self._app = parts.app
        self._child = parts.child
        self._offsets = parts.offsets
        self._partitions = parts.partitions
        #: the child's records returned, as runs of one range, until the application comes back
        self.child_runs: list[Run] = []
        #: EOF events the child's finished partitions released, served before any record
        self.ready_eof: list[Message] = []
        #: poll() alternates the streams: True when the child's record comes first
        self.turn = False

    @property
    def backfilling(self) -> bool:
        return self._child.has_work or bool(self.ready_eof) or bool(self.child_runs)

    # ---- what was returned ---------------------------------------------------------------------

    def settle_returned(self, sync: bool) -> None:
        """The records returned so far are done (the application came back, or a commit or revoke
        settles them): the primary's become next offsets, the child's runs stored progress.
        ``sync`` reads the primary's positions too (records served untracked)."""
        self._offsets.settle()
        if sync:
            self._parts.sync_positions()
        if self.child_runs:
            runs, self.child_runs = self.child_runs, []
            book = self._parts.book
            for run in runs:
                book.store_upto(run.token_id, run.last + 1)

    def forget_returned(self) -> None:
        """Without the auto offset store nothing returned is stored by us: let it go."""
        if self._offsets.holds_returned or self.child_runs:
            self._offsets.forget_unsettled()
            self.child_runs = []

    def drop_runs(self) -> None:
        """Partitions leave (a revoke): the child's runs not settled are not this member's to store."""
        self.child_runs = []

    # ---- the primary's messages ----------------------------------------------------------------

    def note_primary(self, msg: Message | None) -> Message | None:
        if msg is not None:
            self._gate.count(1)
            if msg.error() is None:
                self._offsets.returned(msg)
            elif self._parts.eof and cast(KafkaError, msg.error()).code() == KafkaError._PARTITION_EOF:
                return self.hold_eof(msg)
        return msg

    def note_batch(self, msgs: list[Message]) -> list[Message]:
        if not msgs:
            return msgs
        self._gate.count(len(msgs))
        self._offsets.returned_batch(msgs)
        if self._parts.eof and self._child.has_work and any(map(Message.error, msgs)):
            kept = []
            for msg in msgs:
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF and self.hold_eof(msg) is None:
                    continue
                kept.append(msg)
            return kept
        return msgs

    def note_child(self, msgs: list[Message], runs: list[Run]) -> list[Message]:
        self.child_runs.extend(runs)
        return msgs

    def hold_eof(self, msg: Message) -> Message | None:
        """EOF means the application has everything to the log end: not while the child still reads."""
        key = TopicPartitionKey(msg.topic() or "", msg.partition() or 0)
        if key in self._child.partitions() and self._partitions.hold_eof(key, msg):
            return None
        return msg

    def release_eof(self, keys: Iterable[TopicPartitionKey]) -> None:
        """The child finished ``keys``: their held EOF events are served next."""
        for key in keys:
            if key not in self._child.partitions():
                msg = self._partitions.release_eof(key)
                if msg is not None:
                    self.ready_eof.append(msg)

    # ---- the merge -----------------------------------------------------------------------------

    def merge(self, num: int, deadline: float | None, tick: Callable[[float], None]) -> list[Message] | None:
        """Up to ``num`` records of both streams: the primary's share first, the child's after.

        None when the backlog ended while waiting: the primary alone serves the rest of the call.
        ``tick`` runs the tick when one is due.
        """
        child = self._child
        while True:
            eof = self.ready_eof[:num]
            share = 0 if num == 1 and self.turn else max(1, num // 2)
            self.turn = not self.turn
            # the primary first: if it raises (a callback, a fatal error) nothing was taken from the child,
            # nor from the EOF events; the child's failures never raise here (ChildReader._guard)
            primary = _K.consume(self._app, max(0, num - len(eof) - share), 0) if len(eof) < num else []
            del self.ready_eof[: len(eof)]
            out: list[Message] = [*eof, *self.note_batch(primary)]
            if len(out) < num:
                msgs, runs = child.take(num - len(out))
                out.extend(self.note_child(msgs, runs))
            if out:
                return out
            self._parts.held.raise_held()  # nothing taken in this call: a callback's error goes now
            remaining = _WAIT_SLICE_S if deadline is None else min(_WAIT_SLICE_S, deadline - time.monotonic())
            if remaining <= 0:
                return []
            if child.reading:  # the backlog is where records are coming: wait on the child
                msgs, runs = child.take(num, wait=remaining)
                if msgs:
                    return self.note_child(msgs, runs)
                primary = self.note_batch(_K.consume(self._app, num, 0))
            else:
                primary = self.note_batch(_K.consume(self._app, num, remaining))
            if primary:
                return primary
            tick(time.monotonic())
            if not self.backfilling:
                return None  # the backlog is done: the primary alone from here, still in slices
