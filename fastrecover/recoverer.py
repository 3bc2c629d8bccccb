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
from typing import Any

from confluent_kafka import OFFSET_INVALID, OFFSET_STORED, KafkaException, TopicPartition
from confluent_kafka import Consumer as _KafkaConsumer

from fastrecover.book import Held, RangeBook, mirror_context
from fastrecover.codec import decode_mirror
from fastrecover.committer import StoreLink
from fastrecover.config import Settings
from fastrecover.errors import CodecError, StoreError
from fastrecover.ranges import OffsetRange, RangeProgress, subtract
from fastrecover.recovery import PartitionPlan, plan_partition
from fastrecover.store import RangeStore
from fastrecover.tokens import Token, TopicPartitionKey

log = logging.getLogger("fastrecover.recovery")

#: start offsets that leave the choice to the group's committed offset: only these are recovered
_UNCHOSEN = (OFFSET_INVALID, OFFSET_STORED)


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
        """Start offsets for ``partitions`` and the ranges to backfill, tokens written first."""
        adjusted = [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in partitions]
        for tp, original in zip(adjusted, partitions, strict=True):
            if getattr(original, "metadata", None) is not None:
                tp.metadata = original.metadata
        out = Recovered(adjusted, [], [], {})
        todo = [tp for tp in adjusted if tp.offset in _UNCHOSEN]
        if not todo:
            return out
        timeout = self._settings.recovery_timeout_s
        try:
            committed = {
                TopicPartitionKey(tp.topic, tp.partition): tp
                for tp in _KafkaConsumer.committed(
                    self._primary, [TopicPartition(t.topic, t.partition) for t in todo], timeout=timeout
                )
            }
        except KafkaException as exc:
            log.warning(
                "no recovery for %s: committed offsets unavailable (%s); starting as a plain consumer",
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in todo),
                exc,
            )
            return out
        store = self._link.get()
        for tp in todo:
            key = TopicPartitionKey(tp.topic, tp.partition)
            ctp = committed.get(key)
            try:
                start = self._partition(store, key, ctp, out)
            except (KafkaException, StoreError, CodecError, ValueError, OverflowError, TypeError) as exc:
                log.warning(
                    "no recovery for %s (%r); it starts at its committed offset like a plain consumer", key, exc
                )
                self._book.remove_partitions([key])
                continue
            if start is not None:
                tp.offset = start
        return out

    def _partition(self, store: RangeStore | None, key: TopicPartitionKey, ctp: Any, out: Recovered) -> int | None:
        c = ctp.offset if ctp is not None and ctp.offset >= 0 else None
        try:
            watermarks = _KafkaConsumer.get_watermark_offsets(
                self._primary, TopicPartition(key.topic, key.partition), timeout=self._settings.recovery_timeout_s
            )
        except KafkaException as exc:
            watermarks = None
            log.debug("watermarks of %s: %s", key, exc)
        if watermarks is None:
            log.warning("no recovery for %s: its log end is unavailable; starting at the committed offset", key)
            return None
        high = int(watermarks[1])
        mirrored = self._mirror(key, ctp.metadata if ctp is not None else None)
        start, held, report = self._execute_plan(store, key, c, high, mirrored)
        out.started.extend(h.token.id for h in held)
        self.reports.append(report)
        if report.committed is not None and (report.new_ranges or report.resumed):
            out.to_mirror.append((key, report.committed))
        if start is not None and report.new_ranges:
            out.floors[key] = start
        return start

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

    def _execute_plan(
        self,
        store: RangeStore | None,
        key: TopicPartitionKey,
        committed: int | None,
        log_end: int,
        mirrored: list[RangeProgress],
    ) -> tuple[int | None, list[Held], RecoveryReport]:
        self._book.remove_partitions([key])
        tokens: list[Token] = []
        if store is not None:
            try:
                floor = min([committed, *(m.start for m in mirrored)]) if committed is not None else None
                tokens = store.partition_ranges(
                    self._group, key.topic, key.partition, ending_after=floor, skip_corrupt=True
                )
            except StoreError as exc:
                log.warning("range store unreadable during recovery of %s: %s", key, exc)
                store = None
        plan = plan_partition(
            committed=committed,
            log_end=log_end,
            min_offsets=self._settings.backfill_min_offsets,
            store_tokens=tokens,
            mirrored=mirrored,
        )
        held: list[Held] = []
        start = plan.primary_start
        degraded = False
        if store is None:
            degraded = plan.primary_start is not None
            start = None
            for progress in plan.restored + tuple(t.progress for t in plan.backfill):
                self._book.park(key, self._group, progress)
            if degraded:
                log.warning(
                    "range store unavailable: %s starts at its committed offset %s and replays the lag of %d "
                    "records (no fast recovery, nothing lost)",
                    key,
                    committed,
                    plan.lag,
                )
        else:
            try:
                held = self._persist(store, key, plan)
            except StoreError as exc:
                degraded = plan.primary_start is not None
                start = plan.fallback_start if degraded else None
                log.warning(
                    "could not persist range tokens for %s (%s): it starts at committed offset %s "
                    "instead of the log end (no fast recovery, nothing lost)",
                    key,
                    exc,
                    committed,
                )
                held = [h for h in self._book.held(key) if not h.parked]
        if plan.new_ranges and not degraded:
            log.info(
                "fast recovery of %s: committed=%s log end=%d; primary starts at %d, child backfills %s",
                key,
                committed,
                log_end,
                start,
                ", ".join(f"[{r.start}, {r.end})" for r in plan.new_ranges),
            )
        report = RecoveryReport(
            key,
            committed,
            log_end,
            start,
            () if degraded else plan.new_ranges,
            tuple(t.id for t in plan.backfill),
            degraded,
        )
        return start, held, report

    def _persist(self, store: RangeStore, key: TopicPartitionKey, plan: PartitionPlan) -> list[Held]:
        """Persist restored and new ranges and claim open ones; tokens first, skipping after."""
        held: list[Held] = []
        for progress in plan.restored:
            token = store.create_range(self._group, key.topic, key.partition, progress.start, progress.end, self._owner)
            token = store.claim(token.id, self._owner)
            log.warning(
                "restored range [%d, %d) of %s from the commit-metadata mirror (the store had lost it)",
                progress.start,
                progress.end,
                key,
            )
            if token.is_open:
                held.append(self._book.add(token))
        pending = list(plan.new_ranges)
        while pending:
            span = pending.pop(0)
            token = store.create_range(self._group, key.topic, key.partition, span.start, span.end, self._owner)
            if token.span != span:
                # A range already starts here (a concurrent writer): it covers only its own span.
                pending.extend(subtract(span, [token.span]))
            if token.owner != self._owner or not token.is_open:
                token = store.claim(token.id, self._owner)
            if token.is_open:
                held.append(self._book.add(token))
        for token in store.claim_many([old.id for old in plan.backfill], self._owner):
            if token.is_open:
                held.append(self._book.add(token))
        return held
