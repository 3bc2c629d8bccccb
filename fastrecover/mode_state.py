"""The parts of a mode-on consumer, and the read-only steps every path shares.

:class:`ModeParts` builds the units one consumer in KIP-333 mode is made of (primary offsets,
recoverer, child, book, committer, the store link, the partition registry) and the settings they
read; it is built once and never changed.  The units that carry the mode's paths each keep their
own state and get these parts: :mod:`fastrecover.commits` (the commit router),
:mod:`fastrecover.handover` (assignment, revocation, hand-back), :mod:`fastrecover.streams`
(the merge of the two record streams), :mod:`fastrecover.tick` (the periodic tick) and
:mod:`fastrecover.steady` (the steady gate); :mod:`fastrecover.parallel` composes them.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover.batches import GapEvent, SkipEvent
from fastrecover.book import RangeBook
from fastrecover.child import ChildReader
from fastrecover.child_config import child_config
from fastrecover.codec import lineage_cluster, new_lineage
from fastrecover.committer import RangeCommitter
from fastrecover.config import Settings, is_cooperative, parse_bool
from fastrecover.held import HeldError
from fastrecover.partitions import Partitions
from fastrecover.primary import PrimaryOffsets
from fastrecover.recoverer import Recovered, Recoverer
from fastrecover.store_link import StoreLink
from fastrecover.tokens import TopicPartitionKey

log = logging.getLogger("fastrecover.consumer")

#: on_assign / on_revoke / on_lost, as confluent_kafka calls them
RebalanceCallback = Callable[[Any, list[TopicPartition]], None]

_K = _KafkaConsumer
#: librdkafka's spellings of auto.offset.reset that start a partition with no committed offset at its log start
_EARLIEST_RESETS = ("smallest", "earliest", "beginning")


def key_of(tp: TopicPartition) -> TopicPartitionKey:
    """The hashable key of a TopicPartition (which is mutable)."""
    return TopicPartitionKey(tp.topic, tp.partition)


#: the longest a deferred store open waits for the first recovery (a member given no partition, a long join)
STORE_OPEN_DEFER_S = 5.0
#: how long after a recovery that only replayed (and after its replay has caught up: see
#: _OpensStoreAfter.hold_store_while_replaying) the deferred store open begins.  Begun at once, the
#: open's CPU (SQLAlchemy's import, the schema check; about 0.3 s under the GIL) ran while the replayed
#: lag and the first fresh records were delivered, and on a 2-core machine delayed the first fresh record
#: of a 1k-lag restart by 0.01-0.04 s; what a replay leaves to the store (ranges a crashed member owed)
#: only waits this long more.
STORE_OPEN_AFTER_REPLAY_S = 0.5


class _OpensStoreAfter(Recoverer):
    """A :class:`Recoverer` whose recoveries let a deferred store open begin (:meth:`StoreLink.open_soon`).

    The open is deferred when a lag may be replayed without it (see :attr:`Settings.defers_store_open`);
    what needs the store (a marker of unfinished ranges, a late jump whose replay would outlast the open)
    begins it at once.  Otherwise it begins a little later, once the records that recovery set flowing
    were delivered: a replay's lag, or the ranges of a jump on the mirror that the child reads early
    (their progress waits in memory for the store).  Begun at once after a jump, the open's CPU under
    the GIL halved the child's rate while it read a 100k lag, which drained at 0.45 of plain's rate.
    """

    def recover(self, partitions: list[TopicPartition]) -> Recovered:
        try:
            return super().recover(partitions)
        finally:
            self._link.open_soon(STORE_OPEN_AFTER_REPLAY_S)

    def hold_store_while_replaying(self, positions: Mapping[tuple[str, int], int], reading_early: bool) -> None:
        """Postpone the deferred open while the records it follows are still delivered (each tick).

        Begun a fixed delay after the recovery, the open's CPU (about 0.3 s under the GIL) fell inside
        long replays (2,048 partitions of 200 records each take over a second) and slowed their
        records.  What a replay leaves to the store waits until the primary has read every replayed
        partition up to the log end its recovery saw, what a jump leaves until the child has read its
        early ranges, and the delay after that; never past the deferral's bound (5 s after
        construction), and never once anyone wants the store now (a synchronous commit, a revoke).
        """
        if self.pending and self._link.opening and (reading_early or not self.replayed(positions)):
            self._link.postpone(STORE_OPEN_AFTER_REPLAY_S)


def renewed_lineage(lineage: str) -> str:
    """A new lineage of ``lineage``'s cluster, for ranges and commits that ``lineage``'s markers must not vouch for."""
    return new_lineage(lineage_cluster(lineage), os.urandom(8))


class ModeParts:
    """The units and settings of one mode-on consumer (``app`` is the application's object); never reassigned."""

    def __init__(
        self,
        app: _KafkaConsumer,
        conf: dict[str, Any],
        settings: Settings,
        child: _KafkaConsumer | None = None,
        held: HeldError | None = None,
    ) -> None:
        self.app = app
        self.settings = settings
        #: what the application's callbacks raised inside the primary's calls, for the next call to raise
        self.held = held or HeldError()
        self.group = str(conf["group.id"])
        self.auto_commit = parse_bool("enable.auto.commit", conf.get("enable.auto.commit", True))
        self.auto_store = parse_bool("enable.auto.offset.store", conf.get("enable.auto.offset.store", True))
        self.eof = parse_bool("enable.partition.eof", conf.get("enable.partition.eof", False))
        self.commit_interval_s = int(conf.get("auto.commit.interval.ms", 5000)) / 1000.0
        self.cooperative = is_cooperative(conf)
        self.owner = settings.owner_id or f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        self.book = RangeBook(self.group, settings.commit_mirror_key)
        self.link = StoreLink(
            settings.store_url,
            settings.store_create,
            settings.retry_backoff_s,
            settings.store_lock_timeout_ms,
            settings.store_statement_timeout_ms,
        )
        self.link.open_in_background(STORE_OPEN_DEFER_S if settings.defers_store_open else 0.0)
        self.child = ChildReader(
            child_config(conf, settings),
            batch_size=settings.batch_size,
            broker_timeout_s=settings.recovery_timeout_s,
            first_handle=child,
        )
        self.committer = RangeCommitter(
            self.book,
            self.link,
            self.owner,
            interval_s=settings.commit_interval_s,
            on_commit=conf.get("on_commit"),
            on_fenced=self.child.drop_range,
        )
        self.recoverer = _OpensStoreAfter(
            app,
            self.book,
            self.link,
            settings,
            self.group,
            self.owner,
            self.child.cluster_id,
            reset_earliest=str(conf.get("auto.offset.reset", "latest")).lower() in _EARLIEST_RESETS,
        )
        # the steady state from the start: records untracked, the client's positions read instead
        self.offsets = PrimaryOffsets(untracked=self.auto_store)
        self.partitions = Partitions(self.book, holders=(self.child.drop, self.offsets.drop, self.recoverer.forget))
        #: partitions whose application metadata a commit has replaced by the mirror (warned once each)
        self._metadata_deferred: set[TopicPartitionKey] = set()
        #: the new lineage each partition's commits took when its primary went back below its ranges
        self._lineage_renewed: dict[TopicPartitionKey, str] = {}

    def sync_positions(self) -> bool:
        """Steady state: what the primary returned, from its positions instead of per record.

        Call it only when every record returned so far counts as done: at the start of
        a poll()/consume() (the application came back for more), in a commit() or a
        revoke (which settle the last record too).
        """
        if not self.offsets.untracked or not len(self.partitions):
            return True
        answer = self.positions(self.partitions.assigned)
        if answer is None:  # the records stay accounted for: the next sync reads them
            return False
        self.offsets.sync(answer)
        return True

    def note_seek(self, key: tuple[str, int]) -> None:
        """Untracked records returned before a seek stay accounted for: librdkafka forgets the position."""
        if self.offsets.untracked:
            for known, offset in self.positions([key]) or ():
                self.offsets.seeking(known, offset)

    def positions(self, keys: Iterable[tuple[str, int]]) -> list[tuple[tuple[str, int], int]] | None:
        """The primary's fetch positions that librdkafka knows (negative: none yet); None when it cannot answer."""
        try:
            answer = _K.position(self.app, [TopicPartition(k[0], k[1]) for k in keys])
        except (KafkaException, ValueError) as exc:
            log.debug("primary positions unavailable: %s", exc)
            return None
        return [((tp.topic, tp.partition), tp.offset) for tp in answer if tp.error is None]

    def apply_event(self, event: SkipEvent | GapEvent) -> None:
        """A child event: a gap in a range is done; records retention deleted are skipped, and counted."""
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

    def progress_mirror(self, key: TopicPartitionKey, offset: int, user_metadata: str | None) -> TopicPartition:
        """:meth:`with_mirror` for the primary's own progress: what it returned, the application's offsets.

        A primary that jumped starts above every range its partition holds, so progress below the end
        of one means its offset went back: the application's ``seek()``, or librdkafka's
        ``auto.offset.reset`` after the log was truncated or the topic re-created under its name.
        What those ranges say about the offsets above it may then describe records that are no
        longer there, and a marker of their lineage would vouch for it: a done range would hide the
        new records for good.  So the partition's commits name a new lineage from then on, which
        vouches for none of them (a later recovery reads them again, as after an operator's offset
        reset).  A primary that replays from below its ranges renews the lineage too: that costs
        re-reads after a crash, never a record.
        """
        if self.book.holds(key):
            self._rewound(key, offset)
        return self.with_mirror(key, offset, user_metadata)

    def _rewound(self, key: TopicPartitionKey, offset: int) -> None:
        lineage = self.book.lineage(key)
        if lineage is None or self._lineage_renewed.get(key) == lineage:
            return
        top = max(h.token.span.end for h in self.book.held(key))
        if offset >= top:
            return
        renewed = renewed_lineage(lineage)
        self.book.set_lineage(key, renewed)
        self._lineage_renewed[key] = renewed
        log.warning(
            "%s: the primary's offset %d is below the ranges this member holds (up to %d): it went back "
            "(a seek, or auto.offset.reset after the log was truncated or the topic re-created); after a "
            "restart those ranges are read again rather than trusted",
            key,
            offset,
            top,
        )

    def with_mirror(self, key: TopicPartitionKey, offset: int, user_metadata: str | None) -> TopicPartition:
        """What a Kafka commit of ``offset`` carries: the application's metadata, else the ranges' mirror.

        Not the application's metadata while ``key`` holds a range the store does not have yet
        (parked: the store is down or still opening): the mirror is that range's only durable
        record, and a commit without it would lose the range at the next crash.  The
        application's text is kept in memory then (``committed()`` shows it).
        """
        if user_metadata is not None:
            if not self.book.parks(key):
                return TopicPartition(key.topic, key.partition, offset, metadata=user_metadata)
            self.partitions.keep_meta(key, user_metadata)
            if key not in self._metadata_deferred:
                self._metadata_deferred.add(key)
                log.warning(
                    "%s: the application's commit metadata is kept in memory, not committed, while ranges "
                    "of this partition wait for the store: the commit carries their mirror instead",
                    key,
                )
        # every held range counts, parked ones too: a commit without them would erase the only
        # record of ranges the store could not take
        text = self.book.metadata(key, offset) if self.settings.commit_mirror and self.book.holds(key) else ""
        if text:
            return TopicPartition(key.topic, key.partition, offset, metadata=text)
        return TopicPartition(key.topic, key.partition, offset)
