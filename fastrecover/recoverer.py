"""Recovery carried out: the plan of :mod:`fastrecover.recovery` against the broker and the store.

For each partition the primary was just given (with no start offset of the
application's choosing) it reads the group's committed offset and the log end,
decodes the commit-metadata mirror, asks the pure planner what to do, and then
persists every new or restored range **before** the primary is moved to the log
end.  If the store cannot take the tokens, the partition starts at its committed
offset like a plain consumer: slower, never lossy.  Anything unexpected while
planning one partition (hostile metadata, a planner error) degrades that
partition the same way and is logged once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from confluent_kafka import OFFSET_INVALID, OFFSET_STORED, KafkaException, TopicPartition
from confluent_kafka import Consumer as _KafkaConsumer

from fastrecover import hooks
from fastrecover.book import Held, RangeBook, mirror_context
from fastrecover.codec import Marker, cluster_label, lineage_cluster, new_lineage, read_marker
from fastrecover.committer import StoreLink
from fastrecover.config import Settings
from fastrecover.errors import CodecError, StoreError
from fastrecover.ranges import OffsetRange, RangeProgress, subtract
from fastrecover.recovery import PartitionPlan, Trust, plan_partition, this_cluster, trust_of
from fastrecover.tokens import Token, TopicPartitionKey

if TYPE_CHECKING:
    from fastrecover.store import RangeStore

log = logging.getLogger("fastrecover.recovery")

#: start offsets that leave the choice to the group's committed offset: only these are recovered
_UNCHOSEN = (OFFSET_INVALID, OFFSET_STORED)
#: the ListOffsets timestamps that ask for a partition's log end and log start (Kafka's LATEST_TIMESTAMP
#: and EARLIEST_TIMESTAMP)
_LATEST = -1
_EARLIEST = -2
#: a backfill.min.offsets no lag reaches: the primary starts at the committed offset
_NO_JUMP = 2**63


@dataclass(frozen=True)
class _Inputs:
    """What recovery read for one partition before planning it."""

    committed: int | None
    log_end: int
    mirrored: list[RangeProgress]
    #: which ranges the committed offset vouches for, and the lineage this recovery continues or starts
    trust: Trust
    lineage: str
    #: the primary already started at the log end on the mirror alone (see Recoverer._jump_on_mirror)
    jumped: bool = False


def _floor(committed: int | None, mirrored: Sequence[RangeProgress]) -> int | None:
    """Done ranges ending at or below this cannot matter: the store read starts there."""
    if committed is None:
        return None
    return min([committed, *(m.start for m in mirrored)])


@dataclass(frozen=True)
class RecoveryReport:
    """What recovery did for one partition (kept for operators and tests)."""

    key: TopicPartitionKey
    committed: int | None
    log_end: int
    primary_start: int | None
    new_ranges: tuple[OffsetRange, ...]
    resumed: tuple[int, ...]
    degraded: bool
    #: ranges retired as superseded (their facts no longer held: see fastrecover.recovery)
    retired: tuple[int, ...] = ()
    #: the store has what this recovery decided (False: it was down, still opening, or its write failed)
    stored: bool = True


@dataclass
class Recovered:
    """The outcome for a batch of partitions."""

    partitions: list[TopicPartition]
    started: list[int]
    to_mirror: list[tuple[TopicPartitionKey, int]]
    #: where the primary starts on a partition it skipped ahead on (everything below is a range's)
    floors: dict[TopicPartitionKey, int]


class Recoverer:
    """Runs recovery for newly assigned partitions on the caller's thread."""

    def __init__(
        self,
        primary: _KafkaConsumer,
        book: RangeBook,
        link: StoreLink,
        settings: Settings,
        group: str,
        owner: str,
        cluster_of: Callable[[str], str | None],
        *,
        reset_earliest: bool = False,
    ) -> None:
        self._primary = primary  # the application's object: its confluent_kafka methods, never overrides
        self._book = book
        self._link = link
        self._settings = settings
        self._group = group
        self._owner = owner
        self.reports: list[RecoveryReport] = []
        #: partitions that replayed while the store opened, with what their recovery read (recover_pending)
        self.pending: dict[TopicPartitionKey, _Inputs] = {}
        self._pending_after = 0.0
        #: asks the cluster id with a metadata request for a topic (never the primary's handle: see ChildHandle)
        self._cluster_of = cluster_of
        #: this consumer's Kafka cluster, as lineages name it (asked for once, when first needed)
        self._cluster: str | None = None
        #: auto.offset.reset sends a partition with no committed offset to its log start (see _reset_starts)
        self._reset_earliest = reset_earliest

    def recover(self, partitions: list[TopicPartition]) -> Recovered:
        """Start offsets for ``partitions`` and the ranges to backfill, tokens written first.

        Every partition is planned before anything is written, so the broker is
        asked once for all committed offsets and once for all log ends, and the
        store is read in one transaction and written in one: a recovery costs a
        few round trips, not a few per partition.
        """
        adjusted = [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in partitions]
        for tp, original in zip(adjusted, partitions, strict=True):
            if getattr(original, "metadata", None) is not None:
                tp.metadata = original.metadata
        out = Recovered(adjusted, [], [], {})
        todo = [tp for tp in adjusted if tp.offset in _UNCHOSEN]
        if not todo:
            return out
        keys = [TopicPartitionKey(tp.topic, tp.partition) for tp in todo]
        timeout = self._settings.recovery_timeout_s
        try:
            committed = {
                TopicPartitionKey(tp.topic, tp.partition): tp
                for tp in _KafkaConsumer.committed(
                    self._primary, [TopicPartition(k.topic, k.partition) for k in keys], timeout=timeout
                )
            }
        except KafkaException as exc:
            log.warning(
                "no recovery for %s: committed offsets unavailable (%s); starting as a plain consumer",
                ", ".join(f"{k.topic}[{k.partition}]" for k in keys),
                exc,
            )
            return out
        log_ends = self._list_offsets(keys, _LATEST)
        unchecked = [k for k in keys if (c := committed.get(k)) is None or c.offset < 0]
        checkpointed = any(tp.offset >= 0 for tp in committed.values())
        starts_at = self._reset_starts(unchecked) if unchecked and checkpointed else {}
        read: dict[TopicPartitionKey, tuple[int | None, Marker | None]] = {}
        for key in keys:
            ctp = committed.get(key)
            if key not in log_ends:
                log.warning("no recovery for %s: its log end is unavailable; starting at the committed offset", key)
                continue
            offset = ctp.offset if ctp is not None and ctp.offset >= 0 else starts_at.get(key)
            read[key] = (offset, self._marker(key, ctp.metadata if ctp is not None else None))
        for key in read:
            self.pending.pop(key, None)  # recovered anew
        replay = self._replays_first(read, log_ends)
        on_mirror = not replay and self._jumps_on_mirror()
        store = None if replay or on_mirror else self._link.get()
        stored = self._stored_tokens(
            store, {k: _floor(c, m.ranges if m is not None else ()) for k, (c, m) in read.items()}
        )
        if stored is None:
            store = None
        cluster = ""
        jump_from = _NO_JUMP if replay else self._settings.backfill_min_offsets
        if any(
            self._needs_cluster(c, m, (stored or {}).get(k, ()), log_ends[k], jump_from) for k, (c, m) in read.items()
        ):
            found = self._cluster_label(keys[0].topic)
            if found is None:
                return out
            cluster = found
        inputs: dict[TopicPartitionKey, _Inputs] = {}
        for key, (offset, marker) in read.items():
            try:
                trust = trust_of(offset, marker, cluster)
                mirrored = list(marker.ranges) if marker is not None and self._settings.commit_mirror else []
                lineage = trust.lineage or new_lineage(cluster, os.urandom(8))
                inputs[key] = _Inputs(offset, log_ends[key], mirrored, trust, lineage)
            except (CodecError, ValueError, OverflowError, TypeError) as exc:
                self._give_up(key, exc)
        plans = self._plans(inputs, stored or {}, cluster, _NO_JUMP if replay else self._settings.backfill_min_offsets)
        starts = self._jump_on_mirror(plans, inputs, out) if on_mirror else self._execute(store, plans, inputs, out)
        if replay:
            # the primary replays from the committed offsets; what the store holds for these partitions
            # (ranges owed, to retire, to restore) is taken up by recover_pending once it is open
            self.pending.update((k, inputs[k]) for k in plans)
        for tp in todo:
            start = starts.get(TopicPartitionKey(tp.topic, tp.partition))
            if start is not None:
                tp.offset = start
        return out

    def _plans(
        self,
        inputs: dict[TopicPartitionKey, _Inputs],
        stored: dict[TopicPartitionKey, list[Token]],
        cluster: str,
        min_offsets: int,
    ) -> dict[TopicPartitionKey, PartitionPlan]:
        plans: dict[TopicPartitionKey, PartitionPlan] = {}
        for key, given in inputs.items():
            self._book.remove_partitions([key])
            try:
                plans[key] = plan_partition(
                    committed=given.committed,
                    log_end=given.log_end,
                    min_offsets=min_offsets,
                    store_tokens=this_cluster(stored.get(key, []), cluster),
                    mirrored=given.mirrored,
                    trust=given.trust,
                )
            except (ValueError, OverflowError, TypeError) as exc:
                self._give_up(key, exc)
        return plans

    def _replays_first(
        self, read: dict[TopicPartitionKey, tuple[int | None, Marker | None]], log_ends: dict[TopicPartitionKey, int]
    ) -> bool:
        """The store is still opening and a replay of every lag here comes sooner than it (see config)."""
        limit = self._settings.replay_max_offsets
        if limit <= 0 or not read or not self._link.opening:
            return False
        return all(c is None or log_ends[k] - c <= limit for k, (c, _) in read.items())

    def _jumps_on_mirror(self) -> bool:
        """The store is still opening and the ranges can be made durable in Kafka's commit metadata instead.

        ``fastrecover.recovery.replay.max.offsets=0`` asks every recovery to wait for the store, and
        without the mirror there is nowhere else to make a range durable first.
        """
        return self._settings.replay_max_offsets > 0 and self._settings.commit_mirror and self._link.opening

    def _jump_on_mirror(
        self, plans: dict[TopicPartitionKey, PartitionPlan], inputs: dict[TopicPartitionKey, _Inputs], out: Recovered
    ) -> dict[TopicPartitionKey, int | None]:
        """Skip to the log end with the ranges durable in Kafka's commit metadata; the store's part follows.

        The store is still opening (SQLAlchemy's import, the connection, the schema check: about 0.4 s
        on a 2-core machine) and these lags are larger than a replay would cover sooner.  Every range of
        a plan that jumps (new, restored from the mirror) is parked in the book and committed with the
        committed offset *C* itself, in its marker's mirror, synchronously: that commit is the token.  Only
        the partitions whose commit Kafka took skip to *E*; the others start at *C* and replay, as with the
        store down.  A crash before the store has them leaves the marker, whose mirror the next recovery
        restores from (read again from their start: duplicates, never a skip).  Once the store is open,
        :meth:`recover_pending` plans each partition again with the store's ranges and the same *C* and
        *E*, and persists, claims and retires what a recovery with the store open would have.
        """
        parked: dict[TopicPartitionKey, TopicPartition] = {}
        for key, plan in plans.items():
            given = inputs[key]
            self._book.set_lineage(key, given.lineage)
            self._park_known(key, plan)
            if plan.primary_start is None or given.committed is None:
                continue
            for span in plan.new_ranges:
                self._book.park(key, self._group, RangeProgress(span.start, span.end, span.start))
            parked[key] = TopicPartition(
                key.topic, key.partition, given.committed, metadata=self._book.metadata(key, given.committed)
            )
        durable = self._commit_markers(list(parked.values()))
        starts: dict[TopicPartitionKey, int | None] = {}
        for key, plan in plans.items():
            jumped = key in parked and key in durable
            if key in parked and not jumped:
                # Kafka did not take the marker: nothing may be skipped; replay from C as with the store down
                self._book.remove_partitions([key])
                self._book.set_lineage(key, inputs[key].lineage)
                self._park_known(key, plan)
                log.warning(
                    "%s: the ranges could not be written to Kafka's commit metadata while the store opens; it "
                    "starts at its committed offset %s and replays the lag of %d records (nothing lost)",
                    key,
                    plan.fallback_start,
                    plan.lag,
                )
            start = plan.primary_start if jumped else None
            report = self._report(key, plan, inputs[key], start, key in parked and not jumped, False)
            self.reports.append(report)
            if jumped and start is not None:
                out.floors[key] = start
            starts[key] = start
            self.pending[key] = replace(inputs[key], jumped=jumped)
        return starts

    def _park_known(self, key: TopicPartitionKey, plan: PartitionPlan) -> None:
        """Ranges the plan restores from the mirror or resumes, parked until the store takes them."""
        for progress in plan.restored + tuple(t.progress for t in plan.backfill):
            self._book.park(key, self._group, progress)

    def _commit_markers(self, offsets: list[TopicPartition]) -> set[TopicPartitionKey]:
        """Commit ``offsets`` (each partition's committed offset again, with a new marker); the ones Kafka took."""
        if not offsets:
            return set()
        try:
            hooks.fire("mirror-first-commit")
            answer = _KafkaConsumer.commit(self._primary, offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("could not commit the range markers of %d partition(s): %s", len(offsets), exc)
            return set()
        return {TopicPartitionKey(tp.topic, tp.partition) for tp in answer or [] if tp.error is None}

    def forget(self, keys: Iterable[TopicPartitionKey]) -> None:
        """Partitions that left this member: no store part of their recovery is owed any more."""
        for key in keys:
            self.pending.pop(key, None)

    def recover_pending(self, assigned: set[TopicPartitionKey]) -> Recovered | None:
        """The store's part of the recoveries that replayed while it opened; None until it can be done.

        Planned from what those recoveries read (committed offset, marker, log end, lineage), with
        no jump: the primary has read from the committed offset since, and is never moved here.
        Ranges owed below the committed offset are claimed, mirrored ones the store lost restored,
        outdated ones retired: what the recovery would have done with the store open.
        """
        for key in [k for k in self.pending if k not in assigned]:
            del self.pending[key]
        if not self.pending or self._link.opening or time.monotonic() < self._pending_after:
            return None
        store = self._link.get()
        inputs = self.pending
        stored = self._stored_tokens(store, {k: _floor(g.committed, g.mirrored) for k, g in inputs.items()})
        if store is None or stored is None:
            return None  # down: the link's back-off paces the next try (the parked mirror keeps the ranges)
        cluster = ""
        if any(stored.values()) or any(g.mirrored for g in inputs.values()):
            found = self._cluster_label(next(iter(inputs)).topic)
            if found is None:  # the broker cannot say yet: tried again after the back-off
                self._pending_after = time.monotonic() + self._settings.retry_backoff_s
                return None
            cluster = found
            # a lineage drawn before the cluster was asked names none: the ranges claimed, restored or
            # adopted now must carry this cluster's, or its own later recoveries would take them for
            # another cluster's and never read them
            inputs = {
                k: g
                if g.trust.lineage is not None or lineage_cluster(g.lineage) == cluster
                else replace(g, lineage=new_lineage(cluster, os.urandom(8)))
                for k, g in inputs.items()
            }
        self.pending = {}
        out = Recovered([], [], [], {})
        before = len(self.reports)
        # a partition that jumped on the mirror is planned as at its assignment, jump included (same C and E):
        # its new ranges are the ones its marker holds, now written to the store
        jumped = {k: g for k, g in inputs.items() if g.jumped}
        # the primary is past their lag: what they hold parked (the marker's mirror) stays until the store has it
        parked = {k: [h.durable for h in self._book.held(k)] for k in jumped}
        plans = self._plans({k: g for k, g in inputs.items() if not g.jumped}, stored, cluster, _NO_JUMP)
        plans.update(self._plans(jumped, stored, cluster, self._settings.backfill_min_offsets))
        self._execute(store, plans, inputs, out)
        failed = any(not r.stored for r in self.reports[before:])
        if failed:
            self.pending.update(inputs)  # the transaction rolled back: tried again after the back-off
            self._link.failed()
        for key in jumped:
            out.floors.pop(key, None)  # set at the jump; a floor the primary's own commits dropped since stays dropped
            if failed or key not in plans:  # not written (or not plannable): parked again, exactly as before
                self._book.remove_partitions([key])
                self._book.set_lineage(key, jumped[key].lineage)
                for progress in parked[key]:
                    self._book.park(key, self._group, progress)
        out.to_mirror.clear()  # the primary commits the mirror with its own offset; this one is old
        return out

    @staticmethod
    def _needs_cluster(
        committed: int | None, marker: Marker | None, tokens: Sequence[Token], log_end: int, min_offsets: int
    ) -> bool:
        """Whether planning ``key`` needs the cluster id: a lineage to compare, or new ranges to name.

        A partition with no marker, no range in the store and a lag too small to split (the usual
        first start, or a replay while the store opens) needs none, and costs no metadata request.
        """
        if marker is not None or tokens:
            return True
        return committed is not None and log_end - committed >= min_offsets

    def _cluster_label(self, topic: str) -> str | None:
        """The cluster part of this consumer's lineages; None (no recovery) when the broker cannot say.

        Ranges of another cluster sharing the store must never be believed nor retired here,
        so a recovery that does not know its cluster does not run.
        """
        if self._cluster is None:
            found = self._cluster_of(topic)
            if found is None:
                log.warning("no recovery: the cluster id is unavailable; starting as a plain consumer")
                return None
            self._cluster = cluster_label(found)
        return self._cluster

    def _give_up(self, key: TopicPartitionKey, exc: BaseException) -> None:
        log.warning("no recovery for %s (%r); it starts at its committed offset like a plain consumer", key, exc)
        self._book.remove_partitions([key])

    def _reset_starts(self, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
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
        return self._list_offsets(keys, _EARLIEST)

    def _list_offsets(self, keys: list[TopicPartitionKey], timestamp: int) -> dict[TopicPartitionKey, int]:
        """Each partition's log end (``_LATEST``) or start (``_EARLIEST``), in one request where the broker allows.

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
                found[key] = int(high if timestamp == _LATEST else low)
            except KafkaException as exc:
                log.debug("watermarks of %s: %s", key, exc)
        return found

    def _stored_tokens(
        self, store: RangeStore | None, floors: dict[TopicPartitionKey, int | None]
    ) -> dict[TopicPartitionKey, list[Token]] | None:
        """What the store knows of each partition, read in one statement; None when it cannot be read."""
        if store is None or not floors:
            return None if store is None else {}
        try:
            found = store.partitions_ranges(
                self._group, {(k.topic, k.partition): f for k, f in floors.items()}, skip_corrupt=True
            )
            return {key: found[(key.topic, key.partition)] for key in floors}
        except StoreError as exc:
            log.warning("range store unreadable during recovery of %d partition(s): %s", len(floors), exc)
            return None

    def _execute(
        self,
        store: RangeStore | None,
        plans: dict[TopicPartitionKey, PartitionPlan],
        inputs: dict[TopicPartitionKey, _Inputs],
        out: Recovered,
    ) -> dict[TopicPartitionKey, int | None]:
        """Carry the plans out: tokens of every partition in one transaction, then the start offsets."""
        persisted: dict[TopicPartitionKey, list[Token]] | None = None
        failure: Exception | None = None
        if store is not None and plans:
            try:
                with store.transaction(f"recovering {len(plans)} partition(s)"):
                    # retired first: a new range may start where a superseded one started
                    store.retire([t.id for plan in plans.values() for t in plan.retired])
                    created = store.create_ranges(
                        self._group,
                        [(k.topic, k.partition, r.start, r.end) for k, plan in plans.items() for r in plan.new_ranges],
                        self._owner,
                        {(k.topic, k.partition): inputs[k].lineage for k in plans},
                    )
                    persisted = {
                        key: self._persist(store, key, plan, created, inputs[key].lineage)
                        for key, plan in plans.items()
                    }
            except (StoreError, ValueError, OverflowError, TypeError) as exc:
                # one transaction for all: none of them has tokens, so none may skip ahead
                persisted, failure = None, exc
        starts: dict[TopicPartitionKey, int | None] = {}
        for key, plan in plans.items():
            if store is None:
                start, held, degraded = self._park(key, plan)
            elif persisted is None:  # the transaction rolled back: nothing of it is stored
                degraded = plan.primary_start is not None
                start = plan.fallback_start if degraded else None
                held = []
                # the ranges only the mirror knew stay parked in it: the next commit must carry them on
                for progress in plan.restored + tuple(t.progress for t in plan.backfill):
                    self._book.park(key, self._group, progress)
                log.warning(
                    "could not persist range tokens for %s (%s): it starts at committed offset %s "
                    "instead of the log end (no fast recovery, nothing lost)",
                    key,
                    failure,
                    plan.fallback_start,
                )
            else:
                start, degraded = plan.primary_start, False
                held = [self._book.add(token) for token in persisted[key]]
            if held or store is None or persisted is None:
                self._book.set_lineage(key, inputs[key].lineage)
            report = self._report(key, plan, inputs[key], start, degraded, persisted is not None)
            out.started.extend(h.token.id for h in held)
            self.reports.append(report)
            # ranges restored from the mirror count as much as new ones: without a floor, Kafka's offset
            # would stay below them for good once they finish, and lag monitors would show lag that is not there
            has_ranges = bool(report.new_ranges or report.resumed or (held and plan.restored))
            if report.committed is not None and has_ranges:
                out.to_mirror.append((key, report.committed))
            if start is not None and has_ranges:
                # the primary skipped to ``start``: once the ranges below it finish, so may Kafka's offset
                # (resumed ranges too: a range handed back leaves Kafka's offset at its lowest unfinished one)
                out.floors[key] = start
            starts[key] = start
        return starts

    def _marker(self, key: TopicPartitionKey, metadata: str | None) -> Marker | None:
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

    def _park(self, key: TopicPartitionKey, plan: PartitionPlan) -> tuple[int | None, list[Held], bool]:
        """The store is down: keep the known ranges parked (the mirror keeps them) and replay the lag."""
        for progress in plan.restored + tuple(t.progress for t in plan.backfill):
            self._book.park(key, self._group, progress)
        degraded = plan.primary_start is not None
        if degraded:
            log.warning(
                "range store unavailable: %s starts at its committed offset %s and replays the lag of %d "
                "records (no fast recovery, nothing lost)",
                key,
                plan.fallback_start,
                plan.lag,
            )
        return None, [], degraded

    @staticmethod
    def _report(
        key: TopicPartitionKey, plan: PartitionPlan, given: _Inputs, start: int | None, degraded: bool, stored: bool
    ) -> RecoveryReport:
        if plan.new_ranges and not degraded:
            log.info(
                "fast recovery of %s: committed=%s log end=%d; primary starts at %s, child backfills %s",
                key,
                given.committed,
                given.log_end,
                start,
                ", ".join(f"[{r.start}, {r.end})" for r in plan.new_ranges),
            )
        retired = tuple(t.id for t in plan.retired) if stored else ()
        if retired:
            log.warning(
                "%s: Kafka's committed offset %s was not written by fastrecover for these ranges (an offset "
                "reset, a re-created topic or group, a restored store, a plain member): %d range(s) at or "
                "above it retired as superseded and read again from it (%s)",
                key,
                given.committed,
                len(retired),
                ", ".join(f"#{t.id} [{t.span.start}, {t.span.end}) {t.state.value}" for t in plan.retired[:8]),
            )
        return RecoveryReport(
            key,
            given.committed,
            given.log_end,
            start,
            () if degraded else plan.new_ranges,
            tuple(t.id for t in plan.backfill),
            degraded,
            retired,
            stored,
        )

    def _persist(
        self,
        store: RangeStore,
        key: TopicPartitionKey,
        plan: PartitionPlan,
        created: dict[tuple[str, int, int], Token],
        lineage: str,
    ) -> list[Token]:
        """Persist restored and new ranges and claim open ones (inside the caller's transaction).

        ``created`` holds the tokens of the plan's new ranges, inserted for every partition at
        once; what they do not cover (a concurrent writer's range at the same start) is
        created here, one by one.  Returns the open tokens this member now holds; the caller
        adds them to the book only once the transaction committed.
        """
        held: list[Token] = []
        # the ranges kept from another lineage (older than lineages, or owed below the committed offset)
        store.adopt([t.id for t in plan.kept if t.lineage != lineage], lineage)
        for progress in plan.restored:
            token = store.create_range(
                self._group, key.topic, key.partition, progress.start, progress.end, self._owner, lineage
            )
            token = store.claim(token.id, self._owner)
            log.warning(
                "restoring range [%d, %d) of %s from the commit-metadata mirror (the store had lost it)",
                progress.start,
                progress.end,
                key,
            )
            if token.is_open:
                held.append(token)
        pending = list(plan.new_ranges)
        while pending:
            span = pending.pop(0)
            token = created.get((key.topic, key.partition, span.start)) or store.create_range(
                self._group, key.topic, key.partition, span.start, span.end, self._owner, lineage
            )
            if token.span != span:
                # A range already starts here (a concurrent writer): it covers only its own span.
                pending.extend(subtract(span, [token.span]))
            if token.owner != self._owner or not token.is_open:
                token = store.claim(token.id, self._owner)
            if token.is_open:
                held.append(token)
        held.extend(t for t in store.claim_many([old.id for old in plan.backfill], self._owner) if t.is_open)
        return held
