"""The checker: did the consumers finish every record the producer got acknowledged?

Pure analysis; the I/O that collects its inputs lives in the ``read_*`` helpers
at the bottom (and :func:`read_topic`, which needs a broker).  Its inputs:

* the producer's log: every record the broker acknowledged, with its
  per-partition sequence number and produce time (:class:`Produced`);
* the consumers' ledger: every record a consumer *finished*, written before
  it was committed, by which incarnation, and through which backfill range
  (:class:`LedgerEntry`);
* the incarnations the driver started and killed (:class:`Incarnation`);
* the range store's tokens of the group at the end;
* the topic at the end: its low watermarks (what retention deleted) and which
  offsets it still holds.

A record is **lost** when it was acknowledged, still exists in the topic, and
no consumer ever finished it.  A record retention deleted before anyone
finished it is not "lost" silently either: it must be counted on the token of
the range it belonged to (``skipped``); whatever is not counted is reported as
*unaccounted*, which fails the verdict like a loss.

Fencing: each (range, epoch) must be held by exactly one incarnation, and two
incarnations must never deliver a range's records at the same time (the
earlier holder's last backfilled record comes before the next holder's first).
A store restored from a backup starts a new *era* of epochs (the members were
stopped; nobody is left to fence).

Operator actions (:class:`OperatorLog`) change what "delivered" means:

* an offset reset or a deleted group (:class:`Reread`) obliges the group to
  finish every record at or after the new position *again*, after the reset;
* a reset forward (:class:`Skipped`) excuses the records it moved past;
* a topic deleted and re-created (:class:`Recreated`) starts a new *generation*
  of its offsets: records are told apart by their produce time, and those of a
  deleted generation nobody finished went with it.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fastrecover.tokens import Token

TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Produced:
    """A record the broker acknowledged."""

    topic: str
    partition: int
    offset: int
    seq: int
    produced_ms: int


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A record a consumer finished (before committing it)."""

    topic: str
    partition: int
    offset: int
    done_ms: int
    produced_ms: int
    incarnation: str
    token: int | None = None
    epoch: int | None = None

    @property
    def member(self) -> str:
        """The member an incarnation belongs to: ``m2#7`` -> ``m2``."""
        return self.incarnation.split("#", 1)[0]


@dataclass(frozen=True, slots=True)
class Incarnation:
    """One consumer process the driver started."""

    name: str
    started_ms: int
    ended_ms: int | None = None
    end: str = "running"  # killed | stalled:<point> | stopped | exited:<code> | running

    @property
    def member(self) -> str:
        return self.name.split("#", 1)[0]


@dataclass(frozen=True, slots=True)
class Reread:
    """An operator moved the group to ``start``: every record of [start, end) must be finished again after ``at_ms``."""

    topic: str
    partition: int
    start: int
    end: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class Skipped:
    """An operator moved the group forward over [start, end) at ``at_ms``: those records may stay unfinished."""

    topic: str
    partition: int
    start: int
    end: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class Recreated:
    """``topic`` was deleted and created again at ``at_ms``: its offsets start over."""

    topic: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class StoreRestored:
    """The range store was restored from a backup at ``at_ms`` (with every member stopped)."""

    at_ms: int


Effect = Reread | Skipped | Recreated | StoreRestored
Key = tuple[str, int, int]


class OperatorLog:
    """What the operator's actions oblige and excuse: pure, shared by the drain and the verdict."""

    def __init__(self, effects: Iterable[Effect] = ()) -> None:
        self.effects = list(effects)
        self._births: dict[str, list[int]] = defaultdict(list)
        for e in self.effects:
            if isinstance(e, Recreated):
                self._births[e.topic].append(e.at_ms)
        for births in self._births.values():
            births.sort()
        self.restores = sorted(e.at_ms for e in self.effects if isinstance(e, StoreRestored))
        self._skips: dict[TP, list[Skipped]] = defaultdict(list)
        for e in self.effects:
            if isinstance(e, Skipped):
                self._skips[(e.topic, e.partition)].append(e)

    def generation(self, topic: str, at_ms: int) -> int:
        """How often ``topic`` had been re-created by ``at_ms``."""
        return bisect.bisect_right(self._births.get(topic, []), at_ms)

    def final_generation(self, topic: str) -> int:
        return len(self._births.get(topic, []))

    @staticmethod
    def _named(topic: str, gen: int) -> str:
        """``topic`` for its first generation, ``topic~N`` for the N-th re-creation: keys that never collide."""
        return topic if gen == 0 else f"{topic}~{gen}"

    def name(self, topic: str, at_ms: int) -> str:
        return self._named(topic, self.generation(topic, at_ms))

    def final_name(self, topic: str) -> str:
        return self._named(topic, self.final_generation(topic))

    def ended(self, topic: str, produced_ms: int) -> bool:
        """The record's generation of ``topic`` was deleted later."""
        return self.generation(topic, produced_ms) < self.final_generation(topic)

    def skipped(self, topic: str, partition: int, offset: int, produced_ms: int, after_ms: int = -1) -> bool:
        """An operator moved the group over this record (after ``after_ms``), in the record's generation.

        Every record of the span counts, whenever it was written: the new offset is at most the log end
        the operator read, so each one was in the log when the group was moved past it.
        """
        gen = self.generation(topic, produced_ms)
        return any(
            s.start <= offset < s.end and s.at_ms > after_ms and self.generation(topic, s.at_ms) == gen
            for s in self._skips.get((topic, partition), ())
        )

    def era(self, at_ms: int) -> int:
        """How many store restores happened by ``at_ms``: range epochs start over with each."""
        return bisect.bisect_right(self.restores, at_ms)

    def rereads(self) -> list[Reread]:
        return [e for e in self.effects if isinstance(e, Reread)]


def not_reread(
    acked: Mapping[Key, Produced], last_done: Mapping[Key, int], ops: OperatorLog, lows: Mapping[TP, int]
) -> dict[Key, int]:
    """Keys (generation-named) an operator's reset obliged to be finished again and that were not.

    Each maps to the time after which it must be finished.  Excused: records of a generation
    deleted since, records a later reset forward skipped, and records retention deleted (below
    ``lows``, keyed by generation-named topic).
    """
    out: dict[Key, int] = {}
    for r in ops.rereads():
        name = ops.name(r.topic, r.at_ms)
        low = lows.get((name, r.partition), 0)
        for offset in range(max(r.start, low), r.end):
            key = (name, r.partition, offset)
            p = acked.get(key)
            if p is None or last_done.get(key, -1) >= r.at_ms or out.get(key, -1) >= r.at_ms:
                continue
            if ops.ended(r.topic, p.produced_ms) or ops.skipped(r.topic, r.partition, offset, p.produced_ms, r.at_ms):
                continue
            out[key] = r.at_ms
    return out


@dataclass(frozen=True, slots=True)
class Stats:
    """Summary of a list of durations in milliseconds."""

    count: int = 0
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Iterable[float]) -> Stats:
        data = sorted(values)
        if not data:
            return cls()
        return cls(len(data), _pct(data, 50), _pct(data, 95), _pct(data, 99), data[-1])


def _pct(data: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of sorted data."""
    rank = max(1, math.ceil(p / 100.0 * len(data)))
    return data[min(rank, len(data)) - 1]


@dataclass
class Verdict:
    """Everything the checker found; :attr:`ok` is the pass/fail."""

    produced: int = 0
    finished_unique: int = 0
    ledger_lines: int = 0
    malformed_lines: int = 0
    lost: int = 0
    lost_sample: list[tuple[str, int, int]] = field(default_factory=list)
    duplicates: int = 0
    retention_deleted_unfinished: int = 0
    skipped_recorded: int = 0
    unaccounted: int = 0
    topic_missing: int = 0
    foreign_records: int = 0
    not_reread: int = 0
    not_reread_sample: list[tuple[str, int, int]] = field(default_factory=list)
    operator_skipped: int = 0
    deleted_with_topic: int = 0
    wait_ms: Stats = field(default_factory=Stats)
    time_to_fresh_ms: Stats = field(default_factory=Stats)
    time_to_fresh_each: list[tuple[str, int]] = field(default_factory=list)
    incarnations: int = 0
    kills: int = 0
    never_fresh: int = 0
    ranges_opened: int = 0
    ranges_finished: int = 0
    ranges_open: int = 0
    range_claims: int = 0
    ranges_handed_over: int = 0
    backfilled_records: int = 0
    epoch_conflicts: int = 0
    concurrent_backfills: int = 0
    #: records a frozen incarnation delivered after its thaw from a range at an epoch it held before the freeze
    #: (buffered, as its primary's records are): duplicates, no concurrency of owners; reported, not a failure
    zombie_deliveries: int = 0
    finished_by_non_owner: int = 0
    fencing_sample: list[str] = field(default_factory=list)
    require_ranges_finished: bool = True

    @property
    def duplicate_rate(self) -> float:
        return self.duplicates / self.finished_unique if self.finished_unique else 0.0

    @property
    def failures(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{self.lost} records lost (e.g. {self.lost_sample[:5]})")
        if self.not_reread:
            out.append(
                f"{self.not_reread} records not delivered again after an operator moved the group back "
                f"(e.g. {self.not_reread_sample[:5]})"
            )
        if self.unaccounted:
            out.append(f"{self.unaccounted} records deleted by retention without being counted as skipped")
        if self.topic_missing:
            out.append(f"{self.topic_missing} acknowledged records are missing from the topic")
        if self.epoch_conflicts:
            out.append(f"{self.epoch_conflicts} range epochs held by two incarnations")
        if self.concurrent_backfills:
            out.append(f"{self.concurrent_backfills} ranges backfilled by two incarnations at once")
        if self.finished_by_non_owner:
            out.append(f"{self.finished_by_non_owner} ranges finished by a member not assigned their partition")
        if self.require_ranges_finished and self.ranges_open:
            out.append(f"{self.ranges_open} ranges still open at the end")
        if self.produced == 0:
            out.append("nothing was produced")
        return out

    @property
    def ok(self) -> bool:
        return not self.failures


def analyze(
    produced: Sequence[Produced],
    ledger: Sequence[LedgerEntry],
    *,
    incarnations: Sequence[Incarnation] = (),
    tokens: Sequence[Token] = (),
    low_watermarks: Mapping[TP, int] | None = None,
    present: Iterable[tuple[str, int, int]] | None = None,
    malformed_lines: int = 0,
    require_ranges_finished: bool = True,
    owners: Mapping[str, str] | None = None,
    assigned: Mapping[str, set[TP]] | None = None,
    operator: OperatorLog | None = None,
    frozen: Mapping[str, Sequence[tuple[int, int]]] | None = None,
) -> Verdict:
    """Compare what was produced with what was finished; see the module docstring.

    ``owners`` maps a token's owner id to the incarnation that wrote it and ``assigned`` an
    incarnation to the partitions it was ever assigned: with both, every finished range must have
    been finished by an incarnation that owned its partition.  ``low_watermarks`` and ``present``
    describe the topics as they are at the end (their last generation).  ``frozen`` maps an
    incarnation to its freezes, ``(stopped_ms, let go on_ms)``: what it delivered after one from a
    range epoch it held before it is a zombie's, not a second owner's (see :func:`_range_stats`).
    """
    ops = operator or OperatorLog()
    v = Verdict(malformed_lines=malformed_lines, require_ranges_finished=require_ranges_finished)
    lows = {(ops.final_name(t), p): low for (t, p), low in (low_watermarks or {}).items()}
    v.produced = len(produced)
    v.ledger_lines = len(ledger)

    first_done: dict[Key, int] = {}
    last_done: dict[Key, int] = {}
    counts: dict[Key, int] = defaultdict(int)
    for e in ledger:
        k = (ops.name(e.topic, e.produced_ms), e.partition, e.offset)
        counts[k] += 1
        if k not in first_done or e.done_ms < first_done[k]:
            first_done[k] = e.done_ms
        if e.done_ms > last_done.get(k, -1):
            last_done[k] = e.done_ms
    v.finished_unique = len(counts)
    v.duplicates = len(ledger) - len(counts)

    acked = {(ops.name(p.topic, p.produced_ms), p.partition, p.offset): p for p in produced}
    v.foreign_records = sum(1 for k in counts if k not in acked)
    present_set = {(ops.final_name(t), p, o) for t, p, o in present} if present is not None else None

    spans: dict[TP, list[tuple[int, int]]] = defaultdict(list)
    skipped_by_tp: dict[TP, int] = defaultdict(int)
    for t in tokens:
        if t.is_superseded:
            continue  # a retired range's records were read again: it accounts for none of them
        tp = (ops.final_name(t.topic), t.partition)
        spans[tp].append((t.span.start, t.span.end))
        skipped_by_tp[tp] += t.skipped
    deleted_in_range: dict[TP, int] = defaultdict(int)
    deleted_outside: dict[TP, int] = defaultdict(int)
    lost: list[tuple[str, int, int]] = []
    waits: list[float] = []
    for k, p in acked.items():
        done = first_done.get(k)
        if done is not None:
            waits.append(max(0, done - p.produced_ms))
            continue
        if ops.ended(p.topic, p.produced_ms):
            v.deleted_with_topic += 1
            continue
        if ops.skipped(p.topic, p.partition, p.offset, p.produced_ms):
            v.operator_skipped += 1
            continue
        tp = (k[0], p.partition)
        if p.offset < lows.get(tp, 0):
            if any(s <= p.offset < e for s, e in spans.get(tp, ())):
                deleted_in_range[tp] += 1
            else:
                deleted_outside[tp] += 1
            continue
        lost.append(k)
        if present_set is not None and k not in present_set:
            v.topic_missing += 1
    lost.sort()
    v.lost = len(lost)
    v.lost_sample = lost[:20]
    v.wait_ms = Stats.of(waits)
    v.retention_deleted_unfinished = sum(deleted_in_range.values()) + sum(deleted_outside.values())
    v.skipped_recorded = sum(skipped_by_tp.values())
    v.unaccounted = sum(deleted_outside.values()) + sum(
        max(0, n - skipped_by_tp.get(tp, 0)) for tp, n in deleted_in_range.items()
    )

    missing = not_reread(acked, last_done, ops, lows)
    v.not_reread = len(missing)
    v.not_reread_sample = sorted(missing)[:20]

    _incarnation_stats(v, ledger, incarnations)
    _range_stats(v, ledger, tokens, ops, frozen or {})
    if owners is not None and assigned is not None:
        for t in tokens:
            if t.is_open or t.owner is None:
                continue
            inc = owners.get(t.owner)
            if inc is None or (t.topic, t.partition) not in assigned.get(inc, set()):
                v.finished_by_non_owner += 1
                v.fencing_sample.append(f"range #{t.id} of {t.key} finished by {t.owner} ({inc or 'unknown'})")
    return v


def _incarnation_stats(v: Verdict, ledger: Sequence[LedgerEntry], incarnations: Sequence[Incarnation]) -> None:
    v.incarnations = len(incarnations)
    v.kills = sum(1 for i in incarnations if i.end == "killed" or i.end.startswith("stalled"))
    first_fresh: dict[str, int] = {}
    started = {i.name: i.started_ms for i in incarnations}
    for e in ledger:
        start = started.get(e.incarnation)
        if start is None or e.produced_ms < start:
            continue
        prev = first_fresh.get(e.incarnation)
        if prev is None or e.done_ms < prev:
            first_fresh[e.incarnation] = e.done_ms
    v.time_to_fresh_each = [(i.name, first_fresh[i.name] - i.started_ms) for i in incarnations if i.name in first_fresh]
    ttf = [ms for _name, ms in v.time_to_fresh_each]
    v.time_to_fresh_ms = Stats.of(ttf)
    v.never_fresh = len(incarnations) - len(ttf)


def ranges_handed_over(ledger: Iterable[LedgerEntry]) -> int:
    """Ranges whose backfilled records were finished by more than one member (not incarnation)."""
    members: dict[int, set[str]] = defaultdict(set)
    for e in ledger:
        if e.token is not None:
            members[e.token].add(e.member)
    return sum(1 for m in members.values() if len(m) > 1)


def _zombie_entries(ledger: Sequence[LedgerEntry], frozen: Mapping[str, Sequence[tuple[int, int]]]) -> set[int]:
    """Indexes of the ledger entries a frozen incarnation wrote after being let go on, from a range at an
    epoch another incarnation had already superseded (delivered from a higher epoch of it, earlier).

    Such an incarnation was a zombie when it wrote them: the group had moved its partitions while it was
    stopped, and it handed out records it had fetched before it learnt so.  A killed member cannot do
    that, a frozen one always can (Kafka's own consumer does the same with a partition it lost); what must
    hold is that its range writes are fenced, which the epoch checks show.
    """
    superseded_at: dict[tuple[int, int], int] = {}  # (token, epoch): when a higher epoch was first delivered
    first: dict[tuple[int, int], int] = {}
    for e in ledger:
        if e.token is not None:
            key = (e.token, e.epoch or 0)
            first[key] = min(first.get(key, e.done_ms), e.done_ms)
    for (token, epoch), at in first.items():
        for lower in range(epoch):
            key = (token, lower)
            superseded_at[key] = min(superseded_at.get(key, at), at)
    thawed = {inc: min(let_go for _, let_go in windows) for inc, windows in frozen.items() if windows}
    return {
        i
        for i, e in enumerate(ledger)
        if e.token is not None
        and e.incarnation in thawed
        and e.done_ms >= thawed[e.incarnation]
        and superseded_at.get((e.token, e.epoch or 0), e.done_ms + 1) <= e.done_ms
    }


def _range_stats(
    v: Verdict,
    ledger: Sequence[LedgerEntry],
    tokens: Sequence[Token],
    ops: OperatorLog,
    frozen: Mapping[str, Sequence[tuple[int, int]]],
) -> None:
    v.ranges_opened = len(tokens)
    v.ranges_open = sum(1 for t in tokens if t.is_open)
    v.ranges_finished = v.ranges_opened - v.ranges_open
    v.range_claims = sum(max(0, t.epoch - 1) for t in tokens)
    holders: dict[tuple[int, int, int], set[str]] = defaultdict(set)
    # One window per claim (incarnation, epoch): an incarnation that claims a range again after
    # another's claim (its partition came back) owns a new epoch, and its two windows are two claims.
    windows: dict[tuple[int, int], dict[tuple[str, int], list[int]]] = defaultdict(dict)
    zombie = _zombie_entries(ledger, frozen) if frozen else set()
    v.zombie_deliveries = len(zombie)
    for i, e in enumerate(ledger):
        if e.token is None:
            continue
        v.backfilled_records += 1
        era = ops.era(e.done_ms)
        holders[(e.token, e.epoch or 0, era)].add(e.incarnation)
        if i in zombie:
            continue  # its epoch is counted above; its time is no second owner's backfill
        claim = (e.incarnation, e.epoch or 0)
        w = windows[(e.token, era)].get(claim)
        if w is None:
            windows[(e.token, era)][claim] = [e.done_ms, e.done_ms]
        else:
            w[0] = min(w[0], e.done_ms)
            w[1] = max(w[1], e.done_ms)
    v.ranges_handed_over = ranges_handed_over(ledger)
    for (token, epoch, _era), incs in sorted(holders.items()):
        if len(incs) > 1:
            v.epoch_conflicts += 1
            v.fencing_sample.append(f"range #{token} epoch {epoch} held by {sorted(incs)}")
    for (token, _era), by_claim in sorted(windows.items()):
        found = _first_overlap(by_claim)
        if found is not None:
            (a, ea, wa), (b, eb, wb) = found
            v.concurrent_backfills += 1
            v.fencing_sample.append(
                f"range #{token}: {b} (epoch {eb}) delivered from {wb[0]} while {a} (epoch {ea}) still did "
                f"until {wa[1]}"
            )


def _first_overlap(
    by_claim: Mapping[tuple[str, int], list[int]],
) -> tuple[tuple[str, int, list[int]], tuple[str, int, list[int]]] | None:
    """The first two claims of different incarnations whose delivery windows overlap, in start order.

    Every earlier window is compared, not only the previous one: an incarnation's short later claim
    between them must not hide another incarnation's overlap with its long earlier one.
    """
    ordered = sorted(by_claim.items(), key=lambda kv: kv[1][0])
    for j, ((b, eb), wb) in enumerate(ordered):
        for (a, ea), wa in ordered[:j]:
            if a != b and wb[0] < wa[1]:
                return (a, ea, wa), (b, eb, wb)
    return None


# ---- reading the inputs ------------------------------------------------------------------------


def parse_ledger_line(line: str) -> LedgerEntry | None:
    """``topic partition offset done_ms produced_ms incarnation token epoch``; None when malformed."""
    parts = line.split()
    if len(parts) != 8:
        return None
    try:
        token = None if parts[6] == "-" else int(parts[6])
        epoch = None if parts[7] == "-" else int(parts[7])
        return LedgerEntry(parts[0], int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4]), parts[5], token, epoch)
    except ValueError:
        return None


def parse_produced_line(line: str) -> Produced | None:
    """``topic partition offset seq produced_ms``; None when malformed."""
    parts = line.split()
    if len(parts) != 5:
        return None
    try:
        return Produced(parts[0], int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4]))
    except ValueError:
        return None


def read_ledgers(paths: Iterable[Path]) -> tuple[list[LedgerEntry], int]:
    """All entries of the ledger files, and how many lines were malformed (a write cut by SIGKILL)."""
    entries: list[LedgerEntry] = []
    bad = 0
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                e = parse_ledger_line(line) if line.endswith("\n") else None
                if e is None:
                    bad += 1
                else:
                    entries.append(e)
    return entries, bad


def read_produced(path: Path) -> list[Produced]:
    with open(path, encoding="utf-8") as f:
        return [p for line in f if (p := parse_produced_line(line)) is not None]
