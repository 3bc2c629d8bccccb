"""The hand-back: Kafka's committed offset moves down below the ranges a partition leaves unfinished.

When a partition with open ranges leaves this member, what the primary processed
above the ranges becomes *done* tokens first, then Kafka's offset moves down to the
lowest unfinished offset: any successor, a plain consumer included, starts where
nothing is lost (:class:`~fastrecover.handover.Handover` calls it on every revoke
and on close).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover import hooks
from fastrecover.errors import StoreError
from fastrecover.mode_state import ModeParts, key_of, renewed_lineage
from fastrecover.ranges import OffsetRange, RangeProgress, subtract
from fastrecover.store import ProgressUpdate
from fastrecover.tokens import TopicPartitionKey

if TYPE_CHECKING:  # the store module imports SQLAlchemy: a consumer with the mode off never loads it
    from fastrecover.store import RangeStore

log = logging.getLogger("fastrecover.handover")

_K = _KafkaConsumer


class HandBack:
    """Moves Kafka's offsets below unfinished ranges as their partitions leave (:meth:`run`)."""

    def __init__(self, parts: ModeParts) -> None:
        self._parts = parts
        self._app = parts.app
        self._book = parts.book
        self._partitions = parts.partitions
        #: Kafka's committed offsets and the primary's positions, read before librdkafka's close
        #: (prepare_close): inside close's revoke librdkafka answers neither; and the offsets synchronous
        #: commits wrote since (the router's, filled as an on_revoke commits).  None when not closing
        self._close_read: (
            tuple[dict[TopicPartitionKey, int], dict[tuple[str, int], int], dict[TopicPartitionKey, int]] | None
        ) = None

    def store_for_release(self) -> RangeStore | None:
        """The store for a revoke or close; what its background open raised is not raised here.

        A consumer closed before it ever polled has not seen the open's error yet (a store behind in
        schema): close() must still close the consumer, and there is nothing of this member's to release.
        """
        try:
            return self._parts.link.get()
        except StoreError as exc:
            log.warning("range store not usable while letting partitions go: %s", exc)
            return None

    def run(self, keys: list[TopicPartitionKey]) -> None:
        """Move Kafka's offset down to the lowest unfinished offset of partitions with open ranges.

        What the primary processed above the ranges becomes *done* tokens first, so a
        fastrecover successor does not re-read it, while any successor, a plain
        consumer included, starts at the lowest offset not yet processed: turning the
        mode off, or a mixed group after a graceful hand-over, loses nothing.

        "What the primary processed" is Kafka's committed offset, but never above the
        primary's position: a committed offset is read from outside (another member, a
        tool, an application bug can write any number), and a done token above what
        this member returned would make every later recovery skip records it never saw.
        Under ``enable.auto.commit`` librdkafka's offset store is flushed first (the
        primary's progress may sit only there), and the handed-back offset is stored as
        well: librdkafka commits the stored offsets of the partitions it unassigns, which
        would otherwise put Kafka's offset back above the open ranges.
        """
        store = self.store_for_release()
        open_keys = self._open_keys(keys)
        if store is None or not open_keys:
            return
        if self._close_read is not None:
            # closing: read before librdkafka's close, and the application's on_revoke may have committed
            # above it since, so the hand-back is committed whatever that read said (flushed False); what
            # that on_revoke committed synchronously counts as processed, as a committed read would say
            (read, reached, since), flushed = self._close_read, False
            current = {**read, **{k: max(o, read.get(k, o)) for k, o in since.items()}}
        else:
            flushed = self._commit_stored() if self._parts.auto_commit else True
            current = self._read_committed(open_keys)
            reached = dict(self._parts.positions(open_keys) or [])
        tps = []
        for key in open_keys:
            held = [h for h in self._book.held(key) if not h.parked]
            lowest = min(h.pending.committed for h in held if not h.pending.done)
            primary_at = current.get(key)
            if primary_at is None:
                # Kafka's offset is unknown, and may be above the open ranges (the primary's own commits,
                # or the offset store flushed just above): a plain successor would skip them.  Hand back
                # the lowest unfinished offset without done work; the primary's records are read again.
                log.warning("%s: Kafka's committed offset is unknown; handing back offset %d", key, lowest)
                tps.append(self._parts.with_mirror(key, lowest, None))
                continue
            if primary_at <= lowest:
                if not flushed:  # librdkafka may hold a higher offset that its auto-commit would write
                    tps.append(self._parts.with_mirror(key, lowest, None))
                continue
            done_to = min(primary_at, reached.get((key.topic, key.partition), -1))
            if primary_at > done_to:
                log.warning(
                    "%s: Kafka's committed offset %d is above what the primary returned (position %s); "
                    "records up to offset %d only are handed back as done",
                    key,
                    primary_at,
                    done_to if done_to >= 0 else "unknown",
                    max(lowest, done_to),
                )
            try:
                self._record_done(store, key, OffsetRange(lowest, max(lowest, done_to)))
            except StoreError as exc:
                log.warning("could not record %s's primary progress; its Kafka offset stays: %s", key, exc)
                continue
            tps.append(self._parts.with_mirror(key, lowest, None))
        if not tps:
            return
        try:
            _K.commit(self._app, offsets=tps, asynchronous=False)
        except KafkaException as exc:
            log.warning("could not hand ranges back to Kafka's offsets: %s", exc)
        if self._parts.auto_commit:
            try:
                _K.store_offsets(self._app, offsets=tps)
            except KafkaException as exc:
                log.warning("could not store the handed-back offsets for librdkafka's auto-commit: %s", exc)

    def _open_keys(self, keys: list[TopicPartitionKey]) -> list[TopicPartitionKey]:
        return [k for k in keys if any(not h.parked and not h.pending.done for h in self._book.held(k))]

    def _read_committed(self, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """Kafka's committed offsets of ``keys``; those it cannot say are left out."""
        try:
            hooks.fire("hand-back-read")
            return {
                key_of(tp): tp.offset
                for tp in _K.committed(
                    self._app,
                    [TopicPartition(k.topic, k.partition) for k in keys],
                    timeout=self._parts.settings.recovery_timeout_s,
                )
                if tp.error is None
            }
        except KafkaException as exc:
            log.warning("could not read committed offsets to hand ranges back: %s", exc)
            return {}

    def prepare_close(self, committed_since: dict[TopicPartitionKey, int]) -> None:
        """Read the committed offsets and positions the hand-back needs before librdkafka's close begins.

        Inside the revoke that close runs, librdkafka answers no committed-offset request (the
        call times out), while commits still go through; and it knows no position any more.  Without
        the positions, nothing the primary returned could be handed back as done, and a fastrecover
        successor read it again: every rolling restart during a backfill re-read its fresh records.
        No record reaches the application once close() has begun, so these positions are its last.
        ``committed_since`` fills with what the application commits synchronously from here on (in its
        on_revoke): read after this, it would be in the committed offsets.
        """
        keys = self._open_keys(list(self._partitions.assigned))
        if keys and self._parts.auto_commit:
            self._commit_stored()  # the primary's progress may sit in librdkafka's offset store only
        read = (self._read_committed(keys), dict(self._parts.positions(keys) or [])) if keys else ({}, {})
        self._close_read = (*read, committed_since)

    def _commit_stored(self) -> bool:
        """Commit what librdkafka's offset store holds (there is no call that reads it); False on failure."""
        try:
            _K.commit(self._app, asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError._NO_OFFSET:
                return True
            log.warning("could not commit the stored offsets before handing ranges back: %s", exc)
            return False
        return True

    def _record_done(self, store: RangeStore, key: TopicPartitionKey, span: OffsetRange) -> None:
        """Done tokens over what the primary processed in ``span``, outside every range the store knows.

        Written under a new lineage, which also adopts the partition's ranges of the current one, in one
        transaction; the handed-back offset's marker then names it.  A marker committed before (one a
        Kafka snapshot restore brings back) names the old lineage and vouches for none of these done
        tokens: the primary's records above its offset may not be in the restored log, and whatever the
        restored log holds there now was never read.
        """
        if len(span) == 0:
            return
        group = self._parts.group
        known = store.partition_ranges(group, key.topic, key.partition, ending_after=span.start)
        gaps = subtract(span, [t.span for t in known])
        if not gaps:
            return
        lineage = self._book.lineage(key)
        renewed = None if lineage is None else renewed_lineage(lineage)
        with store.transaction(f"handing {key} back"):
            if renewed is not None:
                store.adopt([t.id for t in known if t.lineage == lineage and not t.is_superseded], renewed)
            for gap in gaps:
                token = store.create_range(
                    group, key.topic, key.partition, gap.start, gap.end, self._parts.owner, renewed
                )
                # a token that already starts there (a concurrent writer) is not ours to finish
                if token.is_open and token.owner == self._parts.owner and token.span == gap:
                    store.commit_one(
                        ProgressUpdate(
                            token.id, self._parts.owner, token.epoch, RangeProgress(gap.start, gap.end, gap.end)
                        )
                    )
        if renewed is not None:
            self._book.set_lineage(key, renewed)
