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
"""

from __future__ import annotations

import itertools
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
) -> Verdict:
    """Compare what was produced with what was finished; see the module docstring.

    ``owners`` maps a token's owner id to the incarnation that wrote it and ``assigned`` an
    incarnation to the partitions it was ever assigned: with both, every finished range must have
    been finished by an incarnation that owned its partition.
    """
    v = Verdict(malformed_lines=malformed_lines, require_ranges_finished=require_ranges_finished)
    lows = dict(low_watermarks or {})
    v.produced = len(produced)
    v.ledger_lines = len(ledger)

    first_done: dict[tuple[str, int, int], int] = {}
    counts: dict[tuple[str, int, int], int] = defaultdict(int)
    for e in ledger:
        k = (e.topic, e.partition, e.offset)
        counts[k] += 1
        if k not in first_done or e.done_ms < first_done[k]:
            first_done[k] = e.done_ms
    v.finished_unique = len(counts)
    v.duplicates = len(ledger) - len(counts)

    acked = {(p.topic, p.partition, p.offset): p for p in produced}
    v.foreign_records = sum(1 for k in counts if k not in acked)
    present_set = set(present) if present is not None else None

    spans: dict[TP, list[tuple[int, int]]] = defaultdict(list)
    skipped_by_tp: dict[TP, int] = defaultdict(int)
    for t in tokens:
        spans[(t.topic, t.partition)].append((t.span.start, t.span.end))
        skipped_by_tp[(t.topic, t.partition)] += t.skipped
    deleted_in_range: dict[TP, int] = defaultdict(int)
    deleted_outside: dict[TP, int] = defaultdict(int)
    lost: list[tuple[str, int, int]] = []
    waits: list[float] = []
    for k, p in acked.items():
        done = first_done.get(k)
        if done is not None:
            waits.append(max(0, done - p.produced_ms))
            continue
        tp = (p.topic, p.partition)
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

    _incarnation_stats(v, ledger, incarnations)
    _range_stats(v, ledger, tokens)
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


def _range_stats(v: Verdict, ledger: Sequence[LedgerEntry], tokens: Sequence[Token]) -> None:
    v.ranges_opened = len(tokens)
    v.ranges_open = sum(1 for t in tokens if t.is_open)
    v.ranges_finished = v.ranges_opened - v.ranges_open
    v.range_claims = sum(max(0, t.epoch - 1) for t in tokens)
    holders: dict[tuple[int, int], set[str]] = defaultdict(set)
    windows: dict[int, dict[str, list[int]]] = defaultdict(dict)
    for e in ledger:
        if e.token is None:
            continue
        v.backfilled_records += 1
        holders[(e.token, e.epoch or 0)].add(e.incarnation)
        w = windows[e.token].get(e.incarnation)
        if w is None:
            windows[e.token][e.incarnation] = [e.done_ms, e.done_ms]
        else:
            w[0] = min(w[0], e.done_ms)
            w[1] = max(w[1], e.done_ms)
    v.ranges_handed_over = ranges_handed_over(ledger)
    for (token, epoch), incs in sorted(holders.items()):
        if len(incs) > 1:
            v.epoch_conflicts += 1
            v.fencing_sample.append(f"range #{token} epoch {epoch} held by {sorted(incs)}")
    for token, by_inc in sorted(windows.items()):
        ordered = sorted(by_inc.items(), key=lambda kv: kv[1][0])
        for (a, wa), (b, wb) in itertools.pairwise(ordered):
            if wb[0] < wa[1]:
                v.concurrent_backfills += 1
                v.fencing_sample.append(f"range #{token}: {b} delivered from {wb[0]} while {a} still did until {wa[1]}")
                break


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
