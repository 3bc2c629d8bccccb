"""What recovery reads before it plans: the broker's offsets and markers, the cluster, the store's ranges.

:class:`~fastrecover.recoverer.Recoverer` decides; this module asks.  The broker
is asked through the primary's handle with confluent_kafka's own methods (never
fastrecover's overrides), once for all partitions of a recovery where the broker
allows: committed offsets, log ends, and log starts where ``auto.offset.reset``
sends a partition there or an offset synced from another cluster must be read
again.  The store is read in one statement.  A failed read costs speed, never a
record (each method says how).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover.book import mirror_context
from fastrecover.codec import Marker, cluster_label, read_marker
from fastrecover.config import Settings
from fastrecover.errors import CodecError, StoreError
from fastrecover.paced import PacedWarning
from fastrecover.ranges import RangeProgress
from fastrecover.recovery import Trust, owing_cluster
from fastrecover.tokens import Token, TopicPartitionKey
from fastrecover.values import value

if TYPE_CHECKING:
    from fastrecover.store import RangeStore

log = logging.getLogger("fastrecover.recovery")

#: the id a client's last metadata response carried, read with no request (confluent-kafka 2.16 and later)
_CACHED_CLUSTER_ID: Callable[..., str] | None = getattr(_KafkaConsumer, "cluster_id", None)

#: the ListOffsets timestamps that ask for a partition's log end and log start (Kafka's LATEST_TIMESTAMP
#: and EARLIEST_TIMESTAMP)
LATEST = -1
EARLIEST = -2
#: a cluster id asked for and not answered is not asked again this soon: a recovery may need it twice (its
#: markers, then its plans), and a second metadata request would wait out the same timeout again
_CLUSTER_ASK_PAUSE_S = 1.0


#: what a recovery read of each partition: its committed offset (or where auto.offset.reset starts it) and marker
Reads = dict[TopicPartitionKey, tuple[int | None, Marker | None]]


@value
class PartitionInputs:
    """What recovery read for one partition before planning it."""

    committed: int | None
    log_end: int
    mirrored: list[RangeProgress]
    #: which ranges the committed offset vouches for, and the new lineage this recovery writes and keeps them in
    trust: Trust
    lineage: str
    #: the primary already started at the log end on the mirror alone (see RecoveryWriter.jump_on_mirror)
    jumped: bool = False
    #: the primary replays only because the store was not open yet: once it is, it jumps from where the
    #: replay got to (fastrecover.recovery.late_jump)
    late: bool = False


class RecoveryReads:
    """The broker's and the store's answers a recovery plans from, asked on the caller's thread."""

    def __init__(
        self,
        primary: _KafkaConsumer,
        settings: Settings,
        group: str,
        cluster_of: Callable[[str], str | None],
        *,
        reset_earliest: bool = False,
    ) -> None:
        self._primary = primary  # the application's object: its confluent_kafka methods, never overrides
        self._settings = settings
        self._group = group
        #: asks the cluster id with a metadata request for a topic, when the join did not give it
        #: (never a request on the primary's handle: see ChildHandle)
        self._cluster_of = cluster_of
        #: this consumer's Kafka cluster, as lineages name it (asked for once, when first needed)
        self._cluster: str | None = None
        #: until when an unanswered ask for the cluster id is not repeated (monotonic)
        self._cluster_unanswered_until = 0.0
        #: auto.offset.reset sends a partition with no committed offset to its log start (see reset_starts)
        self._reset_earliest = reset_earliest
        #: a store that stays unreadable is said once, then once a minute: a pending recovery retries every back-off
        self._unreadable = PacedWarning(log)

    def start_points(
        self, keys: list[TopicPartitionKey]
    ) -> (
        tuple[Reads, dict[TopicPartitionKey, int], dict[TopicPartitionKey, Marker | None], dict[TopicPartitionKey, int]]
        | None
    ):
        """Each partition's committed offset (or where ``auto.offset.reset`` starts one that has none) and
        marker, and its log end; the markers of the partitions whose log end is unavailable (they start
        unplanned); where the primaries of offsets synced from another cluster start (:meth:`_rewind_synced`);
        None when the committed offsets are unavailable (nothing is planned)."""
        try:
            committed = self.committed(keys)
        except KafkaException as exc:
            log.warning(
                "no recovery for %s: committed offsets unavailable (%s); starting as a plain consumer",
                ", ".join(f"{k.topic}[{k.partition}]" for k in keys),
                exc,
            )
            return None
        log_ends = self.list_offsets(keys, LATEST)
        unchecked = [k for k in keys if (c := committed.get(k)) is None or c.offset < 0]
        checkpointed = any(tp.offset >= 0 for tp in committed.values())
        starts_at = self.reset_starts(unchecked) if unchecked and checkpointed else {}
        read: Reads = {}
        unplanned: dict[TopicPartitionKey, Marker | None] = {}
        for key in keys:
            ctp = committed.get(key)
            marker = self.marker(key, ctp.metadata if ctp is not None else None)
            if key not in log_ends:
                log.warning("no recovery for %s: its log end is unavailable; starting at the committed offset", key)
                unplanned[key] = marker
                continue
            read[key] = (ctp.offset if ctp is not None and ctp.offset >= 0 else starts_at.get(key), marker)
        return read, log_ends, unplanned, self._rewind_synced(read, unplanned, keys[0].topic)

    def _rewind_synced(
        self, read: Reads, unplanned: dict[TopicPartitionKey, Marker | None], topic: str
    ) -> dict[TopicPartitionKey, int]:
        """Partitions whose committed offset was synced from another cluster above ranges unfinished there
        (:func:`~fastrecover.recovery.synced_from_elsewhere`) are read again from their log start.

        Their entry in ``read`` takes the log start as the checkpoint and drops the marker (its ranges are in
        the other cluster's offsets); the returned start moves the primary there whatever the plan (the
        log start's logical offset where it is unknown).  The cluster is asked only when a marker lists
        ranges, which a recovery then needs anyway.
        """
        markers = {**{k: m for k, (_, m) in read.items()}, **unplanned}
        owing = {k: source for k, m in markers.items() if (source := owing_cluster(m)) is not None}
        if not owing:
            return {}
        cluster = self.cluster_label(topic)
        synced = {k: source for k, source in owing.items() if cluster is not None and source != cluster}
        starts = self.list_offsets(list(synced), EARLIEST) if synced else {}
        for key, source in synced.items():
            log.warning(
                "%s: Kafka's committed offset was copied from another cluster (%s) above ranges unfinished there "
                "(MirrorMaker 2's offset sync, a restore into a new cluster); reading the partition again from "
                "its log start so that no record is skipped (duplicates of what was read there)",
                key,
                source,
            )
            if key in read:
                read[key] = (starts.get(key), None)
            else:
                unplanned[key] = None
        return {k: starts.get(k, OFFSET_BEGINNING) for k in synced}

    def committed(self, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, TopicPartition]:
        """The group's committed offset (and metadata) of each partition, in one OffsetFetch.

        KafkaException when the broker cannot answer: the caller recovers none of ``keys``.
        """
        timeout = self._settings.recovery_timeout_s
        return {
            TopicPartitionKey(tp.topic, tp.partition): tp
            for tp in _KafkaConsumer.committed(
                self._primary, [TopicPartition(k.topic, k.partition) for k in keys], timeout=timeout
            )
        }

    def cluster_label(self, topic: str) -> str | None:
        """The cluster part of this consumer's lineages; None (no recovery) when the broker cannot say.

        Ranges of another cluster sharing the store must never be believed nor retired here,
        so a recovery that does not know its cluster does not run.  Known from the join
        (:meth:`learn_cluster`), or asked with a metadata request through the child's handle.
        """
        if self._cluster is None:
            if time.monotonic() < self._cluster_unanswered_until:
                return None  # asked moments ago (this recovery's markers) and not answered
            found = self._cluster_of(topic)
            if found is None:
                self._cluster_unanswered_until = time.monotonic() + _CLUSTER_ASK_PAUSE_S
                log.warning("no recovery: the cluster id is unavailable; starting as a plain consumer")
                return None
            self._cluster = cluster_label(found)
        return self._cluster

    @property
    def cluster_known(self) -> bool:
        return self._cluster is not None

    def learn_cluster(self, wait: float) -> None:
        """Take the cluster id the primary's client holds, waiting up to ``wait`` seconds for its metadata.

        librdkafka keeps the id its last metadata response carried: ``cluster_id()`` (confluent-kafka
        2.16 and later) returns it with no request, or waits for the next metadata response with the
        GIL released.  A join asks for metadata before the group can hand out anything, so waiting here,
        between the waits on the primary, normally has the id known before the assignment's recovery.
        Otherwise that recovery asks with a metadata request through the child's handle, made for it:
        15-45 ms of a first recovery (45-60 ms at 2,048 partitions).  Never called from a recovery: they run
        inside librdkafka's callbacks, where a ``cluster_id()`` that raises (no metadata yet) leaves
        confluent-kafka's call state broken, and the next callback of the same poll aborts the process.
        """
        if self._cluster is not None or _CACHED_CLUSTER_ID is None:
            return
        try:
            found = _CACHED_CLUSTER_ID(self._primary, timeout=wait)
        except KafkaException:  # no metadata within the wait: the next wait of the join tries again
            return
        if isinstance(found, str) and found:
            self._cluster = cluster_label(found)

    def reset_starts(self, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """Where a plain consumer starts on partitions with no committed offset, when that is their log start.

        Called only when other partitions of the same recovery have a committed offset: the group has
        checkpoints, and these partitions lack theirs (commits that never landed before a crash, a
        partition added to the topic).  With ``auto.offset.reset=earliest`` a plain consumer reads them
        from their log start, in the same fetches as every other partition's fresh records, which then
        wait behind the replay.  That is a lag like any other: recovery takes the log start as the
        checkpoint, so a large one is backfilled by the child while the primary serves fresh records.

        A group with no committed offset at all is a new consumer, not a recovery: it reads from
        ``auto.offset.reset`` in order, as plain.  Under ``latest`` (librdkafka's default) or ``error``
        there is no lag to take: librdkafka decides.  A partition whose log start cannot be read is left
        to librdkafka too.
        """
        if not self._reset_earliest or not keys:
            return {}
        return self.list_offsets(keys, EARLIEST)

    def list_offsets(self, keys: list[TopicPartitionKey], timestamp: int) -> dict[TopicPartitionKey, int]:
        """Each partition's log end (``LATEST``) or start (``EARLIEST``), in one request where the broker allows.

        A ListOffsets for these timestamps is what ``get_watermark_offsets`` sends per
        partition; a partition the batched answer leaves out is asked for on its own.
        """
        timeout = self._settings.recovery_timeout_s
        found: dict[TopicPartitionKey, int] = {}
        try:
            answered = _KafkaConsumer.offsets_for_times(
                self._primary, [TopicPartition(k.topic, k.partition, timestamp) for k in keys], timeout=timeout
            )
            for tp in answered:
                if tp.error is None and tp.offset >= 0:
                    found[TopicPartitionKey(tp.topic, tp.partition)] = int(tp.offset)
        except KafkaException as exc:
            log.debug("offsets (timestamp %d) of %d partition(s) in one request: %s", timestamp, len(keys), exc)
        for key in keys:
            if key in found:
                continue
            try:
                low, high = _KafkaConsumer.get_watermark_offsets(
                    self._primary, TopicPartition(key.topic, key.partition), timeout=timeout
                )
                found[key] = int(high if timestamp == LATEST else low)
            except KafkaException as exc:
                log.debug("watermarks of %s: %s", key, exc)
        return found

    def stored_tokens(
        self, store: RangeStore | None, floors: dict[TopicPartitionKey, int | None]
    ) -> dict[TopicPartitionKey, list[Token]] | None:
        """What the store knows of each partition, read in one statement; None when it cannot be read."""
        if store is None or not floors:
            return None if store is None else {}
        try:
            found = store.partitions_ranges(
                self._group, {(k.topic, k.partition): f for k, f in floors.items()}, skip_corrupt=True
            )
        except StoreError as exc:
            self._unreadable.failed("range store unreadable during recovery of %d partition(s): %s", len(floors), exc)
            return None
        self._unreadable.succeeded("range store readable during recovery")
        return {key: found[(key.topic, key.partition)] for key in floors}

    def marker(self, key: TopicPartitionKey, metadata: str | None) -> Marker | None:
        """fastrecover's marker in the committed metadata; None when there is none or it cannot be read.

        Unreadable or unsigned (with a key set) metadata vouches for nothing: the partition's ranges
        above the committed offset are then retired and read again.
        """
        if not metadata:
            return None
        try:
            return read_marker(metadata, key=self._settings.commit_mirror_key, context=mirror_context(self._group, key))
        except CodecError as exc:
            log.warning("ignoring unreadable commit-metadata marker of %s: %s", key, exc)
            return None
