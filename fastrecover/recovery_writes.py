"""Recovery's plans carried out: the tokens made durable first, then the book, the start offsets and the reports.

Every partition's tokens go to the store in ONE transaction (retired ranges,
new ones, restored ones, claims), and only once it committed do the ranges
enter the book and the primaries' starts move past the committed offset.  While
the store is still opening and ``fastrecover.recovery.jump.on.mirror`` is on, a lag too large to replay
is made durable in Kafka's commit metadata instead (:meth:`RecoveryWriter.jump_on_mirror`).  When the store
is down or the transaction rolls back, the known ranges stay parked in the
commit-metadata mirror and the partition starts at its committed offset: slower,
never lossy.  :class:`RecoveryReport` and :class:`Recovered` are what
:class:`~fastrecover.recoverer.Recoverer` hands back (and re-exports).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover import hooks
from fastrecover.book import Held, RangeBook
from fastrecover.errors import StoreError
from fastrecover.ranges import OffsetRange, RangeProgress, subtract
from fastrecover.recovery import PartitionPlan
from fastrecover.recovery_reads import PartitionInputs
from fastrecover.tokens import Token, TopicPartitionKey
from fastrecover.values import field, record, replace, value

if TYPE_CHECKING:
    from fastrecover.store import RangeStore

#: ranges of another lineage one recovery of a partition may retire where its own ranges start
_MAX_START_CONFLICTS = 64

log = logging.getLogger("fastrecover.recovery")


@value
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


@record
class Recovered:
    """The outcome for a batch of partitions."""

    partitions: list[TopicPartition]
    started: list[int]
    to_mirror: list[tuple[TopicPartitionKey, int]]
    #: where the primary starts on a partition it skipped ahead on (everything below is a range's)
    floors: dict[TopicPartitionKey, int]
    #: early ranges a store token took over (old id -> new id): the child goes on reading them under the new id
    renamed: dict[int, int] = field(default_factory=dict)
    #: early ranges no store token took over (the store had them done, or split): the child stops reading them
    dropped: list[int] = field(default_factory=list)
    #: where the primaries of replaying partitions jump now that their ranges are in the store (the caller seeks)
    moved: dict[TopicPartitionKey, int] = field(default_factory=dict)


def _warn_unwritten(
    key: TopicPartitionKey, failure: Exception | None, plan: PartitionPlan, degraded: bool, at_assignment: bool
) -> None:
    """Say what a recovery whose store write rolled back does instead: an operator reads it when the store fails.

    Only a recovery at the assignment moves the primary: the store's part of one made while the store
    opened leaves the primary where it already reads (past the lag, if it jumped on Kafka's marker).
    """
    if not at_assignment:
        log.warning(
            "could not write the store's part of the recovery of %s (%s): the primary reads on where it is, "
            "ranges that Kafka's commit metadata names stay there, and the write is tried again (nothing lost)",
            key,
            failure,
        )
    elif degraded:
        log.warning(
            "could not persist range tokens for %s (%s): it starts at committed offset %s "
            "instead of the log end (no fast recovery, nothing lost)",
            key,
            failure,
            plan.fallback_start,
        )
    else:
        log.warning(
            "could not persist the recovery of %s (%s): it starts at its committed offset as planned, and "
            "the ranges it would have claimed or restored wait for the next recovery (nothing lost)",
            key,
            failure,
        )


def _adopt(
    store: RangeStore, plans: dict[TopicPartitionKey, PartitionPlan], inputs: dict[TopicPartitionKey, PartitionInputs]
) -> dict[TopicPartitionKey, set[int]]:
    """Adopt each partition's kept ranges of another lineage into its recovery's; returns them by partition."""
    foreign = {k: {t.id for t in plan.kept if t.lineage != inputs[k].lineage} for k, plan in plans.items()}
    by_lineage: dict[str, list[int]] = {}
    for key, taken in foreign.items():
        by_lineage.setdefault(inputs[key].lineage, []).extend(taken)
    for lineage, ids in by_lineage.items():
        if ids:
            store.adopt(ids, lineage)
    return foreign


class RecoveryWriter:
    """Writes what recovery planned, on the caller's thread, and keeps a report of each partition."""

    def __init__(self, primary: _KafkaConsumer, book: RangeBook, group: str, owner: str) -> None:
        self._primary = primary  # the application's object: its confluent_kafka methods, never overrides
        self._book = book
        self._group = group
        self._owner = owner
        self.reports: list[RecoveryReport] = []

    def execute(
        self,
        store: RangeStore | None,
        plans: dict[TopicPartitionKey, PartitionPlan],
        inputs: dict[TopicPartitionKey, PartitionInputs],
        out: Recovered,
        *,
        at_assignment: bool = True,
    ) -> dict[TopicPartitionKey, int | None]:
        """Carry the plans out: tokens of every partition in one transaction, then the start offsets.

        ``at_assignment`` false: the store's part of a recovery made while it opened, whose primary
        already reads where that recovery put it; the start offsets returned then move nothing.
        """
        persisted: dict[TopicPartitionKey, list[Token]] | None = None
        failure: Exception | None = None
        if store is not None and plans:
            try:
                with store.transaction(f"recovering {len(plans)} partition(s)"):
                    # retired first: a new range may start where a superseded one started
                    store.retire([t.id for plan in plans.values() for t in plan.retired])
                    # the ranges kept are adopted into this recovery's lineage, whatever theirs was (see recoverer)
                    foreign = _adopt(store, plans, inputs)
                    created = store.create_ranges(
                        self._group,
                        [(k.topic, k.partition, r.start, r.end) for k, plan in plans.items() for r in plan.new_ranges],
                        self._owner,
                        {(k.topic, k.partition): inputs[k].lineage for k in plans},
                    )
                    persisted = {
                        key: self._persist(store, key, plan, created, inputs[key].lineage, foreign[key])
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
                self._park_known(key, plan)
                _warn_unwritten(key, failure, plan, degraded, at_assignment)
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

    def jump_on_mirror(
        self,
        plans: dict[TopicPartitionKey, PartitionPlan],
        inputs: dict[TopicPartitionKey, PartitionInputs],
        out: Recovered,
    ) -> tuple[dict[TopicPartitionKey, int | None], dict[TopicPartitionKey, PartitionInputs]]:
        """Skip to the log end with the ranges durable in Kafka's commit metadata; the store's part follows.

        The store is still opening (SQLAlchemy's import, the connection, the schema check: about 0.4 s
        on a 2-core machine) and these lags are larger than a replay would cover sooner.  Every range of
        a plan that jumps (new, restored from the mirror) is parked in the book and committed with the
        committed offset *C* itself, in its marker's mirror, synchronously: that commit is the token.  Only
        the partitions whose commit Kafka took skip to *E*; the others start at *C* and replay, as with the
        store down.  The child reads the ranges of a partition that skipped at once (*early*, their progress
        in memory only).  A crash before the store has them leaves the marker, whose mirror the next
        recovery restores from (read again from their start: duplicates, never a skip).  Once the store is
        open, :meth:`Recoverer.recover_pending <fastrecover.recoverer.Recoverer.recover_pending>` plans each
        partition again with the store's ranges and the same *C* and *E*, persists, claims and retires what
        a recovery with the store open would have, and hands the early ranges' progress to their tokens.

        Returns the start offsets, and each partition's inputs as the store's part will need them
        (marked ``jumped`` where the primary skipped): the caller keeps them pending.
        """
        pending: dict[TopicPartitionKey, PartitionInputs] = {}
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
                # the marker is durable: the child backfills the parked ranges now, not after the store's open
                # (longer than a plain replay of a lag of this size); their progress stays in memory until then
                out.started.extend(self._book.read_early(key))
            starts[key] = start
            pending[key] = replace(inputs[key], jumped=jumped)
        return starts, pending

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

    def _park(self, key: TopicPartitionKey, plan: PartitionPlan) -> tuple[int | None, list[Held], bool]:
        """The store is down: keep the known ranges parked (the mirror keeps them) and replay the lag."""
        self._park_known(key, plan)
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
        key: TopicPartitionKey,
        plan: PartitionPlan,
        given: PartitionInputs,
        start: int | None,
        degraded: bool,
        stored: bool,
    ) -> RecoveryReport:
        if plan.new_ranges and not degraded and log.isEnabledFor(logging.INFO):
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
        foreign: set[int],
    ) -> list[Token]:
        """Persist restored and new ranges and claim open ones (inside the caller's transaction).

        ``created`` holds the tokens of the plan's new ranges, inserted for every partition at
        once; what they do not cover (a concurrent writer's range at the same start) is
        created here, one by one.  ``foreign`` are the kept ranges :func:`_adopt` took from
        another lineage.  Returns the open tokens this member now holds; the caller adds them
        to the book only once the transaction committed.
        """
        held: list[Token] = []
        retired: set[int] = set()
        for progress in plan.restored:
            log.warning(
                "restoring range [%d, %d) of %s from the commit-metadata mirror (the store had lost it)",
                progress.start,
                progress.end,
                key,
            )
        pending = [OffsetRange(p.start, p.end) for p in plan.restored] + list(plan.new_ranges)
        steps = 0
        while pending:
            steps += 1
            if steps > _MAX_START_CONFLICTS + 4 * (len(plan.restored) + len(plan.new_ranges)):
                raise StoreError(f"ranges of {key} kept meeting other ranges at their starts; not written")
            span = pending.pop(0)
            token = created.pop((key.topic, key.partition, span.start), None) or store.create_range(
                self._group, key.topic, key.partition, span.start, span.end, self._owner, lineage
            )
            if token.lineage != lineage or token.id in foreign:
                # A range of another lineage already starts here (adopted just above, or not): a fact Kafka's
                # committed offset does not vouch for (the topic re-created, the offset reset since it was
                # written).  Its done offsets excuse nothing here, so it is retired; what it still owed
                # outside ``span`` is carried, and ``span`` is written in its place.
                store.retire([token.id])
                retired.add(token.id)
                if token.is_open:
                    owed = OffsetRange(token.progress.committed, token.span.end)
                    pending.extend(piece for piece in subtract(owed, [span]) if len(piece))
                log.warning(
                    "range #%d %s of %s (lineage %s) started where this recovery writes %s: retired, its "
                    "offsets covered afresh",
                    token.id,
                    token.span,
                    key,
                    token.lineage,
                    span,
                )
                pending.insert(0, span)
                continue
            if token.span != span:
                # A range of this lineage already starts here (a concurrent writer): it covers only its own span.
                pending.extend(subtract(span, [token.span]))
            if token.owner != self._owner or not token.is_open:
                token = store.claim(token.id, self._owner)
            if token.is_open:
                held.append(token)
        backfill = [old.id for old in plan.backfill if old.id not in retired]
        if backfill:
            held.extend(t for t in store.claim_many(backfill, self._owner) if t.is_open)
        return held
