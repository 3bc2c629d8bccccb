"""Recovery carried out: the plan of :mod:`fastrecover.recovery` against the broker and the store.

For each partition the primary was just given (with no start offset of the
application's choosing) it reads the group's committed offset and the log end,
decodes the commit-metadata mirror, asks the pure planner what to do, and then
persists every new or restored range **before** the primary is moved to the log
end.  If the store cannot take the tokens, the partition starts at its committed
offset like a plain consumer: slower, never lossy.  Anything unexpected while
planning one partition (hostile metadata, a planner error) degrades that
partition the same way and is logged once.  A partition left unplanned keeps the
unfinished ranges its marker names, parked, so that its commits do not erase them.
A recovery that comes before the store is open replays, and a large lag then jumps late,
from where the replay got to, once the store has its range (:meth:`Recoverer.recover_pending`).

This module decides; :mod:`fastrecover.recovery_reads` asks the broker and the
store, :mod:`fastrecover.recovery_writes` carries the plans out and keeps the
reports.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import OFFSET_INVALID, OFFSET_STORED, TopicPartition
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover.book import Held, RangeBook
from fastrecover.codec import Marker, lineage_cluster, new_lineage
from fastrecover.committer import StoreLink
from fastrecover.config import Settings
from fastrecover.errors import CodecError
from fastrecover.recovery import (
    PartitionPlan,
    late_jump,
    needs_cluster,
    plan_partition,
    replay_outlasts_open,
    store_floor,
    this_cluster,
    trust_of,
)
from fastrecover.recovery_reads import PartitionInputs, RecoveryReads
from fastrecover.recovery_writes import Recovered, RecoveryReport, RecoveryWriter
from fastrecover.tokens import Token, TopicPartitionKey
from fastrecover.values import replace

__all__ = ["Recovered", "Recoverer", "RecoveryReport"]

log = logging.getLogger("fastrecover.recovery")

#: start offsets that leave the choice to the group's committed offset: only these are recovered
_UNCHOSEN = (OFFSET_INVALID, OFFSET_STORED)
#: a backfill.min.offsets no lag reaches: the primary starts at the committed offset
_NO_JUMP = 2**63
#: random bytes of a lineage's nonce
_NONCE_BYTES = 8
#: how long a late replay runs before its pace is judged (replay_outlasts_open)
_LATE_PACE_S = 0.03


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
        self._book = book
        self._link = link
        self._settings = settings
        self._group = group
        #: what recovery reads from the broker and the store, and where it writes what it decided
        self._reads = RecoveryReads(primary, settings, group, cluster_of, reset_earliest=reset_earliest)
        self._writer = RecoveryWriter(primary, book, group, owner)
        #: partitions that replayed while the store opened, with what their recovery read (recover_pending)
        self.pending: dict[TopicPartitionKey, PartitionInputs] = {}
        self._pending_after = 0.0
        #: when the last recovery that will jump late began its replay (monotonic)
        self._late_since: float | None = None

    @property
    def reports(self) -> list[RecoveryReport]:
        """What recovery did for each partition, in order (the writer's list: it appends the reports)."""
        return self._writer.reports

    @property
    def cluster_known(self) -> bool:
        return self._reads.cluster_known

    def learn_cluster(self, wait: float) -> None:
        """Take the cluster id from the primary's client between waits of a join (RecoveryReads.learn_cluster)."""
        self._reads.learn_cluster(wait)

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
        points = self._reads.start_points(keys)
        if points is None:
            return out
        read, log_ends, unplanned, rewound = points
        for tp in todo:  # read again from the log start, whatever the plan: see RecoveryReads._rewind_synced
            tp.offset = rewound.get(TopicPartitionKey(tp.topic, tp.partition), tp.offset)
        for key, marker in unplanned.items():
            self._book.keep_marker(key, self._group, marker)
        for key in read:
            self.pending.pop(key, None)  # recovered anew
        # ranges a marker mirrors as unfinished may be in the commit metadata alone (their recovery jumped
        # on the mirror and the process died before the store had them): this recovery waits for the
        # store and writes them there, so that no commit, offset reset or failed recovery can erase them
        # (a marker's ranges are its unfinished ones: decoding drops finished rows)
        owed = any(m is not None and m.ranges for _, m in read.values())
        opening = not owed and self._settings.replay_max_offsets > 0 and self._link.opening
        replay = opening and self._replays_first(read, log_ends)
        on_mirror = opening and not replay and self._jumps_on_mirror()
        # a larger lag is replayed too while the store is not open: once it is (opened as for a replay, or at
        # once when the replay's pace says it would outlast the open: late_due), the primary jumps from where
        # its replay got to (recover_pending), the tokens written first
        late = opening and not replay and not on_mirror
        if late:
            self._late_since = time.monotonic()
            replay = True
        store = None if replay or on_mirror else self._link.get()
        stored = (
            self._reads.stored_tokens(
                store, {k: store_floor(c, m.ranges if m is not None else ()) for k, (c, m) in read.items()}
            )
            if store is not None
            else None
        )
        if stored is None:
            store = None
        cluster = ""
        jump_from = _NO_JUMP if replay else self._settings.backfill_min_offsets
        if any(needs_cluster(c, m, (stored or {}).get(k, ()), log_ends[k], jump_from) for k, (c, m) in read.items()):
            found = self._reads.cluster_label(keys[0].topic)
            if found is None:
                for key, (_, marker) in read.items():
                    self._book.keep_marker(key, self._group, marker)
                return out
            cluster = found
        inputs: dict[TopicPartitionKey, PartitionInputs] = {}
        # Every recovery starts a lineage of its own, drawn after the log ends were read, and adopts into it
        # the ranges it keeps: a marker then vouches only for ranges written before it was committed.  A
        # committed offset restored with its old marker (a Kafka snapshot restored, a topic and its group's
        # offsets restored from a backup) names an older lineage, and the ranges written since, which may
        # cover offsets that now hold records produced after the restore, are retired, never believed.
        # One draw for all partitions: os.urandom lets go of the GIL, and any other thread may take it then.
        lineage = new_lineage(cluster, os.urandom(_NONCE_BYTES))
        for key, (offset, marker) in read.items():
            try:
                trust = trust_of(offset, marker, cluster)
                mirrored = list(marker.ranges) if marker is not None and self._settings.commit_mirror else []
                inputs[key] = PartitionInputs(offset, log_ends[key], mirrored, trust, lineage)
            except (CodecError, ValueError, OverflowError, TypeError) as exc:
                self._give_up(key, exc)
        plans = self._plans(inputs, stored or {}, cluster, _NO_JUMP if replay else self._settings.backfill_min_offsets)
        if on_mirror:
            starts, jumped = self._writer.jump_on_mirror(plans, inputs, out)
            self.pending.update(jumped)
        else:
            starts = self._writer.execute(store, plans, inputs, out)
        if replay:
            # the primary replays from the committed offsets; what the store holds for these partitions
            # (ranges owed, to retire, to restore) is taken up by recover_pending once it is open
            self.pending.update((k, replace(inputs[k], late=late)) for k in plans)
        for tp in todo:
            start = starts.get(TopicPartitionKey(tp.topic, tp.partition))
            if start is not None:
                tp.offset = start
        return out

    def _plans(
        self,
        inputs: dict[TopicPartitionKey, PartitionInputs],
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
        """A replay of every lag here (the store still opening) comes sooner than the store (see config).

        A larger lag is replayed too, until its pace says the replay would outlast the store's open (about
        0.15 s, SQLAlchemy's import mostly), then skipped from where the replay got to (a late jump).
        Waiting for the open at once made the first fresh record of a 100k-lag restart come 2.1x later
        than plain's on a 2-core machine, where plain reads that lag in about 0.1 s.
        """
        limit = self._settings.replay_max_offsets
        return bool(read) and all(c is None or log_ends[k] - c <= limit for k, (c, _) in read.items())

    @property
    def late(self) -> list[TopicPartitionKey]:
        """Partitions replaying until the store opens, whose primary then jumps (their positions are asked)."""
        return [k for k, g in self.pending.items() if g.late]

    def late_due(self, now: float, positions: Mapping[tuple[str, int], int]) -> bool:
        """A late partition's replay, at its pace so far, would outlast the store's open: wait for the open now.

        ``positions`` are the primary's next offsets (what it returned); a replay that returned nothing
        in a tick's time has no pace, and waits.  One that will catch up sooner replays to the end.
        """
        since = self._late_since
        if since is None or now - since < _LATE_PACE_S:
            return False
        return any(
            replay_outlasts_open(
                g.committed, g.log_end, positions.get(k), now - since, self._settings.backfill_min_offsets
            )
            for k, g in self.pending.items()
            if g.late and g.committed is not None
        )

    def app_seeked(self, key: TopicPartitionKey) -> None:
        """The application moved the primary of ``key`` itself: its replay reads where it was told, no jump."""
        given = self.pending.get(key)
        if given is not None and given.late:
            self.pending[key] = replace(given, late=False)

    def _jumps_on_mirror(self) -> bool:
        """The application allowed ranges to live in Kafka's commit metadata alone until the store opens.

        Off by default (``fastrecover.recovery.jump.on.mirror``): the marker is then their only record,
        and an operator's offset reset (or a recovery that cannot read the committed offsets) after a
        crash in that window would erase it.  Without the mirror there is nowhere to make a range durable.
        """
        return self._settings.jump_on_mirror and self._settings.commit_mirror

    def replayed(self, positions: Mapping[tuple[str, int], int]) -> bool:
        """Every partition replaying while the store opens has been read up to the log end its recovery saw.

        ``positions`` are the primary's next offsets (what it returned, per partition).
        """
        return all(
            given.jumped
            or (given.committed is not None and given.committed >= given.log_end)
            or positions.get(key, -1) >= given.log_end
            for key, given in self.pending.items()
        )

    def forget(self, keys: Iterable[TopicPartitionKey]) -> None:
        """Partitions that left this member: no store part of their recovery is owed any more."""
        for key in keys:
            self.pending.pop(key, None)

    def recover_pending(
        self, assigned: set[TopicPartitionKey], positions: Mapping[tuple[str, int], int] | None = None
    ) -> Recovered | None:
        """The store's part of the recoveries that replayed while it opened; None until it can be done.

        Planned from what those recoveries read (committed offset, marker, log end, lineage): ranges owed
        below the committed offset claimed, mirrored ones the store lost restored, outdated ones retired.
        A ``late`` partition jumps from ``positions`` (the primary's next offsets: every record below was
        handed out), its range written first; the caller moves its primary (:attr:`Recovered.moved`).
        """
        for key in [k for k in self.pending if k not in assigned]:
            del self.pending[key]
        if not self.pending or self._link.opening or time.monotonic() < self._pending_after:
            return None
        store = self._link.get()
        inputs = self.pending
        stored = self._reads.stored_tokens(store, {k: store_floor(g.committed, g.mirrored) for k, g in inputs.items()})
        if store is None or stored is None:  # down: tried again after a back-off (the parked mirror keeps the ranges)
            self._pending_after = time.monotonic() + self._settings.retry_backoff_s
            return None
        cluster = ""
        if any(stored.values()) or any(g.mirrored or g.late for g in inputs.values()):
            found = self._reads.cluster_label(next(iter(inputs)).topic)
            if found is None:  # the broker cannot say yet: tried again after the back-off
                self._pending_after = time.monotonic() + self._settings.retry_backoff_s
                return None
            cluster = found
            # a lineage drawn before the cluster was asked names none: the ranges claimed, restored or
            # adopted now must carry this cluster's, or its own later recoveries would take them for
            # another cluster's and never read them
            renewed = new_lineage(cluster, os.urandom(_NONCE_BYTES))
            inputs = {
                k: g if lineage_cluster(g.lineage) == cluster else replace(g, lineage=renewed)
                for k, g in inputs.items()
            }
        self.pending = {}
        out = Recovered([], [], [], {})
        before = len(self.reports)
        # a partition that jumped on the mirror is planned as at its assignment, jump included (same C and E):
        # its new ranges are the ones its marker holds, now written to the store
        jumped = {k: g for k, g in inputs.items() if g.jumped}
        # the primary is past their lag: what they hold parked (the marker's mirror, read early by the child)
        # stays, progress and all, until the store has it
        early = {k: self._book.held(k) for k in jumped}
        # a late partition that jumps now is not planned again as a replay
        moving = self._late_jumps(inputs, stored, cluster, positions or {})
        rest = {k: g for k, g in inputs.items() if not g.jumped and k not in moving}
        plans = self._plans(rest, stored, cluster, _NO_JUMP)
        plans.update(self._plans(jumped, stored, cluster, self._settings.backfill_min_offsets))
        plans.update(moving)
        starts = self._writer.execute(store, plans, inputs, out, at_assignment=False)
        failed = any(not r.stored for r in self.reports[before:])
        if failed:
            self.pending.update(inputs)  # the transaction rolled back: tried again after the back-off
            self._link.failed()
            for key in moving:
                out.floors.pop(key, None)  # the primary stays where its replay is
        else:
            out.moved.update((k, start) for k in moving if (start := starts.get(k)) is not None)
        for key in jumped:
            out.floors.pop(key, None)  # set at the jump; a floor the primary's own commits dropped since stays dropped
            if failed or key not in plans:  # not written (or not plannable): parked again, exactly as before
                self._book.remove_partitions([key])
                self._book.set_lineage(key, jumped[key].lineage)
                self._book.reinstate(early[key])
            else:
                self._take_over(key, early[key], out)
        out.to_mirror.clear()  # the primary commits the mirror with its own offset; this one is old
        return out

    def _late_jumps(
        self,
        inputs: dict[TopicPartitionKey, PartitionInputs],
        stored: dict[TopicPartitionKey, list[Token]],
        cluster: str,
        positions: Mapping[tuple[str, int], int],
    ) -> dict[TopicPartitionKey, PartitionPlan]:
        """The jumps of the ``late`` partitions whose replay is still far from the log end its recovery saw
        (from the committed offset where the primary has handed out nothing yet: its replay started there)."""
        late = {k: g for k, g in inputs.items() if g.late and g.committed is not None}
        if not late:
            return {}
        min_offsets = self._settings.backfill_min_offsets
        jumps = self._plans(late, stored, cluster, min_offsets)
        out: dict[TopicPartitionKey, PartitionPlan] = {}
        for key, plan in jumps.items():
            committed = late[key].committed
            assert committed is not None
            moved = late_jump(plan, max(committed, positions.get(key, committed)), min_offsets)
            if moved is not None:
                out[key] = moved
        return out

    def _take_over(self, key: TopicPartitionKey, early: list[Held], out: Recovered) -> None:
        """The store's tokens of ``key`` take over the ranges the child has read early, span for span.

        A range the store planned otherwise (it had part of the span, or all of it done) has no
        token of the same span: the child stops reading it, and the store's own ranges are read from
        their committed offsets (what the early range delivered is read again: duplicates, never a skip).
        """
        tokens = {h.token.span: h.token.id for h in self._book.held(key) if not h.parked}
        for held in early:
            if not held.early:
                continue
            token_id = tokens.get(held.token.span)
            if token_id is not None and self._book.take_over(held, token_id):
                out.renamed[held.token.id] = token_id
            else:
                out.dropped.append(held.token.id)

    def _give_up(self, key: TopicPartitionKey, exc: BaseException) -> None:
        log.warning("no recovery for %s (%r); it starts at its committed offset like a plain consumer", key, exc)
        self._book.remove_partitions([key])
