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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import OFFSET_INVALID, OFFSET_STORED, KafkaException, TopicPartition
from confluent_kafka import Consumer as _KafkaConsumer

from fastrecover.book import Held, RangeBook, mirror_context
from fastrecover.codec import decode_mirror
from fastrecover.committer import StoreLink
from fastrecover.config import Settings
from fastrecover.errors import CodecError, StoreError
from fastrecover.ranges import OffsetRange, RangeProgress, subtract
from fastrecover.recovery import PartitionPlan, plan_partition
from fastrecover.tokens import Token, TopicPartitionKey

if TYPE_CHECKING:
    from fastrecover.store import RangeStore

log = logging.getLogger("fastrecover.recovery")

#: start offsets that leave the choice to the group's committed offset: only these are recovered
_UNCHOSEN = (OFFSET_INVALID, OFFSET_STORED)
#: the ListOffsets timestamp that asks for a partition's log end (Kafka's LATEST_TIMESTAMP)
_LATEST = -1


@dataclass(frozen=True)
class _Inputs:
    """What recovery read for one partition before planning it."""

    committed: int | None
    log_end: int
    mirrored: list[RangeProgress]

    @property
    def floor(self) -> int | None:
        """Done ranges ending at or below this cannot matter: the store read starts there."""
        if self.committed is None:
            return None
        return min([self.committed, *(m.start for m in self.mirrored)])


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
    ) -> None:
        self._primary = primary  # the application's object: its confluent_kafka methods, never overrides
        self._book = book
        self._link = link
        self._settings = settings
        self._group = group
        self._owner = owner
        self.reports: list[RecoveryReport] = []

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
        log_ends = self._log_ends(keys)
        inputs: dict[TopicPartitionKey, _Inputs] = {}
        for key in keys:
            ctp = committed.get(key)
            if key not in log_ends:
                log.warning("no recovery for %s: its log end is unavailable; starting at the committed offset", key)
                continue
            try:
                inputs[key] = _Inputs(
                    ctp.offset if ctp is not None and ctp.offset >= 0 else None,
                    log_ends[key],
                    self._mirror(key, ctp.metadata if ctp is not None else None),
                )
            except (CodecError, ValueError, OverflowError, TypeError) as exc:
                self._give_up(key, exc)
        store = self._link.get()
        stored = self._stored_tokens(store, inputs)
        if stored is None:
            store = None
        plans: dict[TopicPartitionKey, PartitionPlan] = {}
        for key, given in inputs.items():
            self._book.remove_partitions([key])
            try:
                plans[key] = plan_partition(
                    committed=given.committed,
                    log_end=given.log_end,
                    min_offsets=self._settings.backfill_min_offsets,
                    store_tokens=(stored or {}).get(key, []),
                    mirrored=given.mirrored,
                )
            except (ValueError, OverflowError, TypeError) as exc:
                self._give_up(key, exc)
        starts = self._execute(store, plans, inputs, out)
        for tp in todo:
            start = starts.get(TopicPartitionKey(tp.topic, tp.partition))
            if start is not None:
                tp.offset = start
        return out

    def _give_up(self, key: TopicPartitionKey, exc: BaseException) -> None:
        log.warning("no recovery for %s (%r); it starts at its committed offset like a plain consumer", key, exc)
        self._book.remove_partitions([key])

    def _log_ends(self, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """Each partition's log end, asked for all of them in one request where the broker allows.

        A ListOffsets for the latest timestamp is what ``get_watermark_offsets`` sends per
        partition; a partition the batched answer leaves out is asked for on its own.
        """
        timeout = self._settings.recovery_timeout_s
        ends: dict[TopicPartitionKey, int] = {}
        try:
            answered = _KafkaConsumer.offsets_for_times(
                self._primary, [TopicPartition(k.topic, k.partition, _LATEST) for k in keys], timeout=timeout
            )
            for tp in answered:
                if tp.error is None and tp.offset >= 0:
                    ends[TopicPartitionKey(tp.topic, tp.partition)] = int(tp.offset)
        except KafkaException as exc:
            log.debug("log ends of %d partition(s) in one request: %s", len(keys), exc)
        for key in keys:
            if key in ends:
                continue
            try:
                _low, high = _KafkaConsumer.get_watermark_offsets(
                    self._primary, TopicPartition(key.topic, key.partition), timeout=timeout
                )
                ends[key] = int(high)
            except KafkaException as exc:
                log.debug("watermarks of %s: %s", key, exc)
        return ends

    def _stored_tokens(
        self, store: RangeStore | None, inputs: dict[TopicPartitionKey, _Inputs]
    ) -> dict[TopicPartitionKey, list[Token]] | None:
        """What the store knows of each partition, read in one statement; None when it cannot be read."""
        if store is None or not inputs:
            return None if store is None else {}
        try:
            floors = {(key.topic, key.partition): given.floor for key, given in inputs.items()}
            found = store.partitions_ranges(self._group, floors, skip_corrupt=True)
            return {key: found[(key.topic, key.partition)] for key in inputs}
        except StoreError as exc:
            log.warning("range store unreadable during recovery of %d partition(s): %s", len(inputs), exc)
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
                    created = store.create_ranges(
                        self._group,
                        [(k.topic, k.partition, r.start, r.end) for k, plan in plans.items() for r in plan.new_ranges],
                        self._owner,
                    )
                    persisted = {key: self._persist(store, key, plan, created) for key, plan in plans.items()}
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
            report = self._report(key, plan, inputs[key], start, degraded)
            out.started.extend(h.token.id for h in held)
            self.reports.append(report)
            if report.committed is not None and (report.new_ranges or report.resumed):
                out.to_mirror.append((key, report.committed))
            if start is not None and (report.new_ranges or report.resumed):
                # the primary skipped to ``start``: once the ranges below it finish, so may Kafka's offset
                # (resumed ranges too: a range handed back leaves Kafka's offset at its lowest unfinished one)
                out.floors[key] = start
            starts[key] = start
        return starts

    def _mirror(self, key: TopicPartitionKey, metadata: str | None) -> list[RangeProgress]:
        if not self._settings.commit_mirror or not metadata:
            return []
        try:
            return decode_mirror(
                metadata, key=self._settings.commit_mirror_key, context=mirror_context(self._group, key)
            )
        except CodecError as exc:
            log.warning("ignoring unreadable commit-metadata mirror of %s: %s", key, exc)
            return []

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
        key: TopicPartitionKey, plan: PartitionPlan, given: _Inputs, start: int | None, degraded: bool
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
        return RecoveryReport(
            key,
            given.committed,
            given.log_end,
            start,
            () if degraded else plan.new_ranges,
            tuple(t.id for t in plan.backfill),
            degraded,
        )

    def _persist(
        self, store: RangeStore, key: TopicPartitionKey, plan: PartitionPlan, created: dict[tuple[str, int, int], Token]
    ) -> list[Token]:
        """Persist restored and new ranges and claim open ones (inside the caller's transaction).

        ``created`` holds the tokens of the plan's new ranges, inserted for every partition at
        once; what they do not cover (a concurrent writer's range at the same start) is
        created here, one by one.  Returns the open tokens this member now holds; the caller
        adds them to the book only once the transaction committed.
        """
        held: list[Token] = []
        for progress in plan.restored:
            token = store.create_range(self._group, key.topic, key.partition, progress.start, progress.end, self._owner)
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
                self._group, key.topic, key.partition, span.start, span.end, self._owner
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
