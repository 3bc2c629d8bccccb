"""The recovery decision: what to do with a partition the primary was just given.

Pure: it sees the group's committed offset, the partition's watermarks, the
ranges the store knows and the ranges mirrored into the commit metadata, and
returns a plan.  The consumer carries the plan out in a fixed order that keeps
at-least-once: first persist every new or restored range, and only when that
succeeded start the primary at the log end (``fallback_start`` otherwise).

**Which ranges may be believed.**  A range token is a fact about offsets of one
log at one time.  Kafka's committed offset is the source of truth: when someone
other than fastrecover moved it (an operator's reset, a topic deleted and
re-created, a group deleted and its name reused, a plain member), ranges at or
above it describe offsets that are no longer what they were, and a *done* range
there would skip records for ever.  So a range counts only while the offset is
*vouched* for it: fastrecover writes a marker (:func:`fastrecover.codec.mark`)
with every offset it commits for a partition with ranges, naming the partition's
*lineage* (the cluster id and a nonce, drawn anew by every recovery and hand-back
that writes ranges, which stamp every range they keep with it) and the offset
itself: a marker vouches only for ranges written before it was committed.
:func:`trust_of` reads that marker against the offset; :func:`plan_partition` then

* believes ranges of the vouched lineage, as before;
* *retires* every other range that reaches to or above the committed offset
  (or every range, when there is no committed offset at all): it is marked
  superseded, kept for audit and never used again, and the new range covers
  its offsets afresh;
* still reads an open range of another lineage that lies wholly below the
  committed offset (records owed by a member that crashed before a plain member
  moved the offset past them): re-reading is a duplicate, never a loss;
* *carries over* the unfinished part below the committed offset of an open range
  it retires: an operator who moves the offset back into a range (``--shift-by
  -50``) asks for more records, never fewer, so the records that range still owed
  below the new offset become a new range (:func:`_carry`).

Ranges of another Kafka cluster sharing the store are not this partition's at
all (:func:`this_cluster`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fastrecover.codec import Marker, lineage_cluster
from fastrecover.ranges import OffsetRange, RangeProgress, subtract
from fastrecover.tokens import Token
from fastrecover.values import value


@value
class Trust:
    """The ranges Kafka's committed offset vouches for.

    Those of ``lineage``, and, if ``legacy``, those written before lineages existed.
    """

    lineage: str | None = None
    legacy: bool = False

    def vouches(self, token: Token) -> bool:
        if token.lineage is None:
            return self.legacy
        return token.lineage == self.lineage

    @property
    def any(self) -> bool:
        return self.legacy or self.lineage is not None


#: the committed offset vouches for no range (moved by someone else, or absent)
UNTRUSTED = Trust()
#: an older version's mirror: it vouches for the ranges written before lineages existed
LEGACY = Trust(legacy=True)


def trust_of(committed: int | None, marker: Marker | None, cluster: str) -> Trust:
    """What the metadata committed with ``committed`` vouches for, on the cluster labelled ``cluster``.

    A marker vouches for its lineage only if it was committed with this very offset
    (anyone who moves the offset and keeps the metadata moves it without us) and names
    this cluster.  An older version's ``fr1`` mirror has neither and vouches for the
    ranges written before lineages existed: that is what an upgrade finds.
    """
    if committed is None or committed < 0 or marker is None:
        return UNTRUSTED
    if marker.lineage is None:
        return LEGACY
    if marker.offset != committed or lineage_cluster(marker.lineage) != cluster:
        return UNTRUSTED
    return Trust(lineage=marker.lineage)


def owing_cluster(marker: Marker | None) -> str | None:
    """The cluster of a marker that lists unfinished ranges; None for any other metadata."""
    if marker is None or marker.lineage is None or not marker.ranges:
        return None
    return lineage_cluster(marker.lineage)


def synced_from_elsewhere(marker: Marker | None, cluster: str) -> bool:
    """The committed offset carries another cluster's marker, which lists ranges unfinished there.

    Only a copy puts it on this cluster: MirrorMaker 2's offset sync (the offset translated, the
    metadata as committed), or a cluster's group offsets restored into a new cluster.  The source
    group's child had not finished those ranges, and their records lie below the offset at positions
    this cluster's offsets cannot be matched to: nothing below the offset may be taken as read.
    """
    source = owing_cluster(marker)
    return source is not None and source != cluster


def this_cluster(tokens: Iterable[Token], cluster: str) -> list[Token]:
    """The tokens of the cluster labelled ``cluster`` (and those older than lineages, which name none)."""
    return [t for t in tokens if t.lineage is None or lineage_cluster(t.lineage) == cluster]


@value
class PartitionPlan:
    """What recovery does for one partition.

    ``primary_start`` None means "leave the primary where Kafka puts it" (the
    committed offset, or auto.offset.reset when there is none).
    """

    primary_start: int | None
    new_ranges: tuple[OffsetRange, ...] = ()
    restored: tuple[RangeProgress, ...] = ()
    backfill: tuple[Token, ...] = ()
    fallback_start: int | None = None
    #: ranges whose facts Kafka's committed offset no longer vouches for: marked superseded first
    retired: tuple[Token, ...] = ()
    #: the store's ranges that still count (every one not retired): the recovery's lineage adopts them
    kept: tuple[Token, ...] = ()

    @property
    def lag(self) -> int:
        return sum(len(r) for r in self.new_ranges)


def plan_partition(
    *,
    committed: int | None,
    log_end: int,
    min_offsets: int,
    store_tokens: Sequence[Token] = (),
    mirrored: Sequence[RangeProgress] = (),
    trust: Trust,
) -> PartitionPlan:
    """Decide how the primary starts on a partition and which ranges to backfill.

    ``store_tokens`` are every token the store has for the partition (of this
    cluster), open and done: a done token tells us a mirrored range needs no
    restoring.  ``trust`` says which of them the committed offset vouches for
    (:func:`trust_of`); the others that reach to or above it are retired (see
    the module docstring).  ``mirrored`` comes from the commit metadata and is
    untrusted: see :func:`_restore` for why it can add re-reads but never
    remove any; it is used only when the offset vouches for something.

    Invariant (property-tested): every offset in ``[committed, log_end)`` is read
    by the primary (at or above ``primary_start``), lies in a new, restored or
    resumed (open store) range, or lies in a done store range the offset vouches for.
    """
    if not store_tokens and not (mirrored and trust.any):
        return _plan_without_ranges(committed, log_end, min_offsets)
    live = [t for t in store_tokens if not t.is_superseded]
    floor = committed if committed is not None and committed >= 0 else None

    def outdated(t: Token) -> bool:
        """Not vouched for, and reaching to or above the committed offset (or there is none)."""
        return not trust.vouches(t) and (floor is None or t.span.end > floor or t.span.start >= floor)

    retired = tuple(t for t in live if outdated(t))
    kept = [t for t in live if not outdated(t)]
    open_tokens = tuple(t for t in kept if t.is_open)
    known_spans = [t.span for t in kept]
    # Below the committed offset only what the offset vouches for may excuse a record the mirror or a retired
    # range still owes: a range kept there only for lying below it (another lineage, a store restored from an
    # older backup) says the records were delivered before whoever moved the offset asked for them again.
    vouched = [t.span for t in kept if trust.vouches(t)]
    restored = tuple(_restore(mirrored if trust.any else (), vouched, max(log_end, 0)))
    # done ranges count as covered too: their records are finished (by the child or a Spark job)
    covered = known_spans + [r.span for r in restored]
    carried = tuple(_carry(retired, floor, vouched + [r.span for r in restored]))

    if committed is None or committed < 0 or log_end - committed < min_offsets:
        return PartitionPlan(
            primary_start=None,
            new_ranges=carried,
            restored=restored,
            backfill=open_tokens,
            retired=retired,
            kept=tuple(kept),
        )

    new_ranges = carried + tuple(subtract(OffsetRange(committed, log_end), covered))
    return PartitionPlan(
        primary_start=log_end,
        new_ranges=new_ranges,
        restored=restored,
        backfill=open_tokens,
        fallback_start=committed,
        retired=retired,
        kept=tuple(kept),
    )


#: about what the store's open takes when the caller's thread waits for it (SQLite, a 2-core machine).
#: Left to its thread beside an application thread that holds the GIL (records that cost CPU to process),
#: the open gets the GIL back only at the interpreter's switch interval after each of its many small reads:
#: its 0.15 s took seconds, and a late jump's replay went on all that while.
LATE_OPEN_S = 0.15


def replay_outlasts_open(committed: int, log_end: int, position: int | None, elapsed: float, min_offsets: int) -> bool:
    """Whether a replay from ``committed`` to ``log_end``, at ``position`` after ``elapsed`` seconds, would at
    its pace so far still run when a store's open waited for now ends (:data:`LATE_OPEN_S`): its late jump
    then waits for the open.  A replay that has returned nothing has no pace, and waits; one that will be
    within ``min_offsets`` of the end sooner replays to the end, as a plain consumer would."""
    at = committed if position is None else max(committed, position)
    left, read = log_end - at, at - committed
    return left >= min_offsets and (read <= 0 or left * elapsed > LATE_OPEN_S * read)


def late_jump(plan: PartitionPlan, position: int, min_offsets: int) -> PartitionPlan | None:
    """The jump of a partition that replayed while the store opened, made from where its replay got to.

    ``plan`` is the partition's plan with the jump (planned from the recovery's committed offset *C*
    and log end *E*); ``position`` is the primary's next offset: the application has been handed
    every record below it, so the new ranges start there.  None when the rest of the lag is too
    small to split (the replay reads it), when the plan has no jump, or when it retires ranges: their
    owed pieces may lie anywhere, and trimming them at ``position`` could drop a record (the replay
    goes on then, as a plain consumer's would).  Everything the plan restores or resumes is kept.
    """
    if plan.primary_start is None or plan.retired:
        return None
    trimmed = tuple(OffsetRange(max(r.start, position), r.end) for r in plan.new_ranges if r.end > position)
    if sum(len(r) for r in trimmed) < min_offsets:
        return None
    return PartitionPlan(
        primary_start=plan.primary_start,
        new_ranges=trimmed,
        restored=plan.restored,
        backfill=plan.backfill,
        fallback_start=plan.fallback_start,
        kept=plan.kept,
    )


def store_floor(committed: int | None, mirrored: Sequence[RangeProgress]) -> int | None:
    """Done ranges ending at or below this cannot matter to a recovery: its store read starts there."""
    if committed is None:
        return None
    return min([committed, *(m.start for m in mirrored)])


def needs_cluster(
    committed: int | None, marker: Marker | None, tokens: Sequence[Token], log_end: int, min_offsets: int
) -> bool:
    """Whether planning a partition needs the cluster id: a lineage to compare, or new ranges to name.

    A partition with no marker, no range in the store and a lag too small to split (the usual
    first start, or a replay while the store opens) needs none, and costs no metadata request.
    """
    if marker is not None or tokens:
        return True
    return committed is not None and log_end - committed >= min_offsets


#: the plan of a partition with no range to keep, retire or restore whose lag the primary reads
_REPLAY = PartitionPlan(primary_start=None)


def _plan_without_ranges(committed: int | None, log_end: int, min_offsets: int) -> PartitionPlan:
    """:func:`plan_partition` where no range is known: neither in the store nor in a mirror that counts.

    The common case (a first start, a restart of a partition that had no lag to split, a replay
    while the store opens), and the one a recovery meets once per partition of a large assignment:
    the general path costs tens of microseconds per partition, this one about one.  The same
    answer (property-tested against the general path): replay, or one new range [C, E).
    """
    if committed is None or committed < 0 or log_end - committed < min_offsets:
        return _REPLAY
    return PartitionPlan(
        primary_start=log_end,
        new_ranges=tuple(subtract(OffsetRange(committed, log_end), ())),
        fallback_start=committed,
    )


def _carry(retired: Sequence[Token], floor: int | None, covered: Sequence[OffsetRange]) -> list[OffsetRange]:
    """What the open ranges being retired still owe below the committed offset ``floor``.

    Retiring a range drops its facts above the committed offset, which is read again from
    there; below it, its unfinished records were never delivered, and whoever moved the
    offset (an operator's ``--shift-by -N``, ``--to-offset``) meant to deliver more, not
    fewer.  Each piece starts at the range's own committed offset: the store's progress is
    the child's own commit log, so what it says is finished was delivered.  Its completion
    map is dropped, which costs re-reads only.  With no committed offset at all (a group or
    topic deleted) nothing is carried: ``auto.offset.reset`` decides, as for a plain client.
    """
    if floor is None:
        return []
    owed = _union(
        OffsetRange(t.progress.committed, min(t.span.end, floor))
        for t in retired
        if t.is_open and t.progress.committed < min(t.span.end, floor)
    )
    return [piece for span in owed for piece in subtract(span, covered)]


def _restore(mirrored: Sequence[RangeProgress], known: Sequence[OffsetRange], log_end: int) -> list[RangeProgress]:
    """Mirrored ranges the store has no record of (it was wiped or replaced), started fresh.

    The mirror is untrusted (anyone who may commit for the group writes it), so
    only its *spans* are used, and only as a hint of what to re-read:

    * each span is clipped to the log end (a range past it would swallow the
      primary's commits and could never finish);
    * overlapping or duplicate spans are merged into one;
    * any part a range the committed offset vouches for covers (open or done) is
      dropped: the store is the authority there.  A range the store keeps
      without that (another lineage below the offset, a store restored from an
      older backup) drops nothing: re-reading its span costs duplicates, while
      believing it could skip records someone asked for again;
    * every restored piece starts fresh at its start.  The mirror's committed
      offset and completion map are ignored, so a forged "almost done" row
      costs duplicates, never a skipped record.

    A row that claims to be done restores nothing: ignoring it is what a consumer
    without a mirror would do.
    """
    spans = _union(
        OffsetRange(entry.start, min(entry.end, log_end))
        for entry in mirrored
        if not entry.done and entry.start < min(entry.end, log_end)
    )
    restored: list[RangeProgress] = []
    for span in spans:
        for piece in subtract(span, known):
            restored.append(RangeProgress.fresh(piece.start, piece.end))
    return restored


def _union(spans: Iterable[OffsetRange]) -> list[OffsetRange]:
    """Sorted, disjoint spans covering exactly the offsets of ``spans``."""
    out: list[OffsetRange] = []
    for span in sorted(spans, key=lambda r: r.start):
        if out and span.start <= out[-1].end:
            if span.end > out[-1].end:
                out[-1] = OffsetRange(out[-1].start, span.end)
        else:
            out.append(span)
    return out
