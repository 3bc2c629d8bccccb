"""The primary's record offsets: returned, then settled, then stored.

A record the primary returned counts as done only once the application comes
back for more (the next ``poll()``/``consume()``), the rule the Java client's
auto-commit follows: at-least-once even when a crash hits mid-record.  Records
are kept only until that next call, and reduced to the last offset per
partition with C-level ``map``/``zip``/``dict`` operations, never a Python loop
per record.

In the steady state (no range, nothing deferred) records are not kept at all:
the primary's own positions (librdkafka's offset after the last record it
returned, per partition) say the same, and are read only at the moments when
every record returned so far counts as done (a call's start, a commit, a
revoke).  That takes all bookkeeping off the per-record path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from confluent_kafka import Message

from fastrecover.tokens import TopicPartitionKey

Key = tuple[str, int]


def last_offsets(msgs: list[Message], single_topic: str | None = None) -> dict[Key, int]:
    """Offset of the last record of each partition in ``msgs`` (error events are not records).

    With ``single_topic`` (the one topic every assigned partition is of) partitions alone
    tell them apart, which halves the C-level passes over the batch.
    """
    if single_topic is not None:
        by_partition = dict(zip(map(Message.partition, msgs), range(len(msgs)), strict=False))
        last_index = {(single_topic, p): i for p, i in by_partition.items()}
    else:
        keys = zip(map(Message.topic, msgs), map(Message.partition, msgs), strict=True)
        last_index = dict(zip(cast("Iterable[Key]", keys), range(len(msgs)), strict=False))
    out: dict[Key, int] = {}
    for key, i in last_index.items():
        msg = msgs[i]
        if msg.error() is not None:  # rare: an event came last; take the partition's last real record
            real = [m for m in msgs[:i] if m.error() is None and (m.topic(), m.partition()) == key]
            if msg.topic() is not None and msg.topic() != key[0]:  # not one topic after all
                return last_offsets(msgs)
            if not real:
                continue
            msg = real[-1]
        out[cast(Key, key)] = cast(int, msg.offset())
    return out


class PrimaryOffsets:
    """Next offsets (last done + 1) per partition of the primary's records, and which changed.

    ``poll()`` keeps the one record it returned in :attr:`last`; the next call moves it to
    :attr:`settled` (one dict store, keyed by partition alone when the assignment is of one
    topic); offsets are read from the settled records only when someone needs them (the tick,
    a commit, a revoke).  ``consume()`` batches go through :func:`last_offsets` instead.
    """

    def __init__(self, untracked: bool = False) -> None:
        self.last: Message | None = None
        self.unsettled: list[Message] = []
        self.settled: dict[Any, Message] = {}
        self.done: dict[Key, int] = {}
        self.dirty: set[Key] = set()
        #: the topic of every assigned partition, when they share one (set on assignment)
        self.single_topic: str | None = None
        #: records were returned without being kept (the steady state): read the client's positions
        self.untracked = untracked
        #: a partition's position just before a seek (librdkafka reports none until a record from
        #: the new position is returned): the records returned before the seek still count
        self.before_seek: dict[Key, int] = {}

    def returned(self, msg: Message) -> None:
        """poll() returned ``msg`` (a record): it is done once the application comes back for more."""
        self.last = msg

    def returned_batch(self, msgs: list[Message]) -> None:
        """consume() returned ``msgs`` (error events included: :meth:`settle` skips them)."""
        self.unsettled.extend(msgs)

    @property
    def holds_returned(self) -> bool:
        """Records returned and not settled yet."""
        return self.last is not None or bool(self.unsettled)

    def track(self) -> None:
        """The steady state ended: from here on each returned record is kept."""
        self.untracked = False

    def untrack(self) -> None:
        """The steady state: records are not kept, positions say the same (read at :meth:`sync`)."""
        self.untracked = True

    def mark_dirty(self, keys: Iterable[Key]) -> None:
        """The mirror of ``keys`` changed: their next offsets are stored again (with the new mirror)."""
        self.fold()
        self.dirty.update(k for k in keys if k in self.done)

    def settle(self) -> None:
        """The previous call's records are done: the application came back for more."""
        last = self.last
        if last is not None:
            self.last = None
            self.settled[last.partition() if self.single_topic is not None else (last.topic(), last.partition())] = last
        msgs = self.unsettled
        if msgs:
            self.unsettled = []
            self.fold()
            batch = last_offsets(msgs, self.single_topic)
            for key, offset in batch.items():
                self.done[key] = offset + 1
            self.dirty.update(batch)

    def fold(self) -> None:
        """Settled records become next offsets (before anyone reads ``done``/``dirty``)."""
        if not self.settled:
            return
        settled, self.settled = self.settled, {}
        topic = self.single_topic
        for k, msg in settled.items():
            key: Key = (topic, k) if topic is not None else k
            self.done[key] = msg.offset() + 1  # type: ignore[operator]
            self.dirty.add(key)

    def sync(self, positions: Iterable[tuple[Key, int]]) -> None:
        """The client's positions become next offsets: only when every record it returned is done.

        A negative position (no record returned since the assignment or a seek) says
        nothing, so the partition keeps what it had, as librdkafka's auto store does.
        Records still held as returned (``last``, ``unsettled``, ``settled``) are folded in
        first: folded later, they would move a partition back from its newer position.
        """
        if self.last is not None or self.unsettled:
            self.settle()
        self.fold()
        done, dirty, before_seek = self.done, self.dirty, self.before_seek
        for key, position in positions:
            if before_seek:
                earlier = before_seek.pop(key, -1)
                position = position if position >= 0 else earlier
            if position >= 0 and done.get(key) != position:
                done[key] = position
                dirty.add(key)

    def seeking(self, key: Key, position: int) -> None:
        """Keep the position a seek is about to hide.

        A negative one means no record came since an earlier seek, whose kept position
        still stands; any other is newer than what was kept.
        """
        if position >= 0:
            self.before_seek[key] = position

    def set_single_topic(self, topic: str | None) -> None:
        self.fold()
        self.single_topic = topic

    def forget_unsettled(self) -> None:
        self.last = None
        self.unsettled = []

    def advance(self, key: Key, offset: int) -> None:
        """``key``'s next offset is ``offset`` though no record was returned there: every offset below is done.

        Its primary skipped to ``offset`` and the ranges below have finished.  Stored and committed from
        here as a returned record's would be, so a commit of it that failed (a rebalance in progress) is
        made again by the next store and auto-commit.
        """
        self.fold()
        self.done[key] = offset
        self.dirty.add(key)

    def take_dirty(self, keys: Iterable[Key] | None = None) -> dict[Key, int]:
        """Next offsets changed since the last call (of ``keys``), to store or commit."""
        self.fold()
        if keys is None:
            todo, self.dirty = self.dirty, set()
        else:
            todo = self.dirty & set(keys)
            self.dirty -= todo
        return {k: self.done[k] for k in todo if k in self.done}

    def drop(self, keys: Iterable[TopicPartitionKey]) -> None:
        gone = set(keys)
        self.fold()
        if self.last is not None and (self.last.topic(), self.last.partition()) in gone:
            self.last = None
        if self.unsettled:
            self.unsettled = [m for m in self.unsettled if (m.topic(), m.partition()) not in gone]
        for key in gone:
            self.done.pop(key, None)
            self.dirty.discard(key)
            self.before_seek.pop(key, None)
