"""The range book: the ranges this member holds and how far each has got.

Kept on the primary's thread only.  For every held range it keeps two views of
progress: ``durable`` (what the store has, the child's commit log) and
``pending`` (durable plus offsets finished since the last store commit).  A
commit writes pending to the store and, once that succeeded, makes it durable;
the Kafka commit-metadata mirror is always built from durable progress so that
it never claims more than the store does.  A third view, ``stored``, adds the
offsets that were only *stored* (auto offset store, ``store_offsets``): like
librdkafka's offset store they are committed by the next offset-less commit()
or auto-commit, while ``commit(message=...)`` commits exactly its message.  No
I/O happens here: the committer writes what the book says, the child reads what
:meth:`RangeBook.works` orders.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastrecover.codec import MARKED_MIRROR_LIMIT, Marker, encode_mirror_full, mark, sign_mirror
from fastrecover.ranges import OffsetRange, RangeProgress
from fastrecover.tokens import Token, TopicPartitionKey
from fastrecover.values import record


@record
class RangeWork:
    """A read order for the child: deliver ``[next_offset, end)`` of a range, except ``skip``.

    The child moves ``next_offset`` (its delivery cursor) and the two fetch fields.
    """

    token_id: int
    key: TopicPartitionKey
    start: int
    next_offset: int
    end: int
    skip: frozenset[int] = frozenset()
    #: offset the fetcher is expected to return next (>= next_offset while records are buffered)
    fetch_next: int = -1
    #: the fetcher went past ``end``: once the buffer holds none of it, the range is read
    fetched_all: bool = False


@record
class Held:
    """One range this member holds (or keeps parked while the store is down or still opening).

    A parked range is not in the store: its token id is negative and the commit-metadata mirror
    is its only durable record.  An *early* one (parked when the primary jumped while the store
    opened) is read by the child all the same: its progress stays in memory, never written, until
    the store's part of the recovery takes it over (:meth:`RangeBook.take_over`).  A crash before
    then reads it again from the mirror, from its start: duplicates, never a skip.
    """

    token: Token
    pending: RangeProgress
    stored: RangeProgress
    parked: bool = False
    skipped: int = 0
    early: bool = False

    @property
    def readable(self) -> bool:
        """Whether the child reads it and commits are routed to it: claimed in the store, or early."""
        return not self.parked or self.early

    @property
    def durable(self) -> RangeProgress:
        return self.token.progress

    @property
    def dirty(self) -> bool:
        return self.pending != self.token.progress or self.skipped != self.token.skipped


def mirror_context(group: str, key: TopicPartitionKey) -> str:
    """What a signed mirror is bound to: it is valid for this group's partition only."""
    return f"{group}/{key.topic}/{key.partition}"


class RangeBook:
    """Held ranges by id and by partition, with cached commit-metadata mirrors."""

    def __init__(self, group: str = "", mirror_key: bytes | None = None) -> None:
        self._group = group
        self._mirror_key = mirror_key
        self._by_id: dict[int, Held] = {}
        #: held token ids per partition; read directly (never written) by the hot commit paths
        self.by_key: dict[TopicPartitionKey, list[int]] = {}
        self._mirror: dict[TopicPartitionKey, str] = {}
        #: the lineage each partition's ranges belong to (set by recovery; see fastrecover.recovery)
        self._lineage: dict[TopicPartitionKey, str] = {}
        self._spans: dict[TopicPartitionKey, list[tuple[int, OffsetRange]]] = {}
        self._next_parked_id = -1
        #: ids of the early ranges held (read before the store has them): asked at every synchronous commit
        self._early: set[int] = set()
        #: early (parked) token ids taken over by store tokens: what the child read under the old id lands on the new
        self._alias: dict[int, int] = {}
        #: mirrors that had to leave out completion maps or merge ranges (re-delivery on a fallback)
        self.mirror_degradations = 0

    def __len__(self) -> int:
        return len(self._by_id)

    @property
    def has_work(self) -> bool:
        return any(h.readable for h in self._by_id.values())

    @property
    def has_early(self) -> bool:
        """Whether a range is read before the store has it (a synchronous commit waits for the store first)."""
        return bool(self._early)

    def add(self, token: Token) -> Held:
        held = Held(token, token.progress, token.progress, skipped=token.skipped)
        self._insert(held)
        return held

    def park(self, key: TopicPartitionKey, group: str, progress: RangeProgress) -> Held:
        """Keep a mirrored range we could not claim (store down) so the mirror keeps it alive."""
        token = Token(self._next_parked_id, group, key.topic, key.partition, progress)
        self._next_parked_id -= 1
        held = Held(token, progress, progress, parked=True)
        self._insert(held)
        return held

    def keep_marker(self, key: TopicPartitionKey, group: str, marker: Marker | None) -> None:
        """A partition that starts unplanned at its committed offset keeps what its marker owes, parked.

        Those ranges may be in the commit metadata alone (the last recovery jumped on it and its
        process died before the store had them): the primary's next commit, without them, would
        erase them.  Parked, every commit mirrors them until a recovery can plan the partition.
        """
        if marker is None or not marker.ranges:
            return
        self.remove_partitions([key])
        if marker.lineage is not None:
            self.set_lineage(key, marker.lineage)
        for entry in marker.ranges:
            self.park(key, group, RangeProgress.fresh(entry.start, entry.end))

    def read_early(self, key: TopicPartitionKey) -> list[int]:
        """The primary jumped past ``key``'s parked ranges (their marker is durable): the child reads them now."""
        ids = []
        for held in self.held(key):
            if held.parked:
                held.early = True
                self._early.add(held.token.id)
                ids.append(held.token.id)
        self._spans.pop(key, None)
        return ids

    def reinstate(self, helds: Iterable[Held]) -> None:
        """Put early ranges back as they were (same ids, progress kept): the store could not take them yet."""
        for held in helds:
            self._insert(held)

    def take_over(self, early: Held, token_id: int) -> bool:
        """Store token ``token_id`` (same span) takes over early range ``early``: its progress, and its id.

        What the application finished while the range was early is a fact about the same offsets
        of the same log (same committed offset, log end and lineage), so it is merged into the
        token's progress, to be written with the next range commit.  Calls still naming the old
        id (records handed out, events, deferred commits) reach the token through an alias.
        """
        held = self._by_id.get(token_id)
        if held is None or held.token.span != early.token.span or held.token.key != early.token.key:
            return False
        held.pending = held.pending.commit_upto(early.pending.committed).mark_done(sorted(early.pending.completed))
        held.stored = held.stored.commit_upto(early.stored.committed).mark_done(sorted(early.stored.completed))
        held.skipped = max(held.skipped, early.skipped)
        self._alias[early.token.id] = token_id
        return True

    def _held(self, token_id: int) -> Held | None:
        held = self._by_id.get(token_id)
        if held is None and token_id < 0 and self._alias:
            alias = self._alias.get(token_id)
            if alias is not None:
                held = self._by_id.get(alias)
        return held

    def _insert(self, held: Held) -> None:
        # Adding a token id the book already holds replaces it: a second entry in
        # _by_key would outlive remove() and make held()/spans() raise KeyError.
        self.remove(held.token.id)
        self._by_id[held.token.id] = held
        if held.early:
            self._early.add(held.token.id)
        self.by_key.setdefault(held.token.key, []).append(held.token.id)
        self._mirror.pop(held.token.key, None)
        self._spans.pop(held.token.key, None)

    def get(self, token_id: int) -> Held | None:
        return self._held(token_id)

    def held(self, key: TopicPartitionKey | None = None) -> list[Held]:
        if key is None:
            return list(self._by_id.values())
        return [self._by_id[i] for i in self.by_key.get(key, ())]

    def keys(self) -> list[TopicPartitionKey]:
        return list(self.by_key)

    def spans(self, key: TopicPartitionKey) -> list[tuple[int, OffsetRange]]:
        """Open, claimed ranges of a partition, for commit routing (cached: every commit asks)."""
        spans = self._spans.get(key)
        if spans is None:
            spans = [(i, self._by_id[i].token.span) for i in self.by_key.get(key, ()) if self._by_id[i].readable]
            self._spans[key] = spans
        return spans

    def holds(self, key: TopicPartitionKey) -> bool:
        """Whether any range of ``key`` is held, parked ones included."""
        return key in self.by_key

    def parks(self, key: TopicPartitionKey) -> bool:
        """Whether ``key`` holds a parked range (early ones too): one the commit metadata alone keeps."""
        return any(self._by_id[i].parked for i in self.by_key.get(key, ()))

    def routes(self) -> set[TopicPartitionKey]:
        """Partitions with at least one claimed (or early) range: only their commits need routing."""
        return {k for k in self.by_key if self.spans(k)}

    def remove(self, token_id: int) -> Held | None:
        held = self._by_id.pop(token_id, None)
        if held is not None:
            self._early.discard(token_id)
            if self._alias:  # only after an early backfill: a few entries
                self._alias = {old: new for old, new in self._alias.items() if new != token_id}
            ids = self.by_key.get(held.token.key, [])
            if token_id in ids:
                ids.remove(token_id)
            if not ids:
                self.by_key.pop(held.token.key, None)
            self._mirror.pop(held.token.key, None)
            self._spans.pop(held.token.key, None)
        return held

    def remove_partitions(self, keys: Iterable[TopicPartitionKey]) -> list[Held]:
        """Forget every range of ``keys`` (and their lineages); the ranges removed are returned."""
        removed: list[Held] = []
        for key in list(keys):
            self._lineage.pop(key, None)
            for token_id in list(self.by_key.get(key, ())):
                held = self.remove(token_id)
                if held is not None:
                    removed.append(held)
        return removed

    def mark_done(self, token_id: int, offsets: Iterable[int]) -> None:
        """Offsets to commit with the next commit of this range (explicit commit, gaps)."""
        held = self._held(token_id)
        if held is not None:
            done = list(offsets)
            held.pending = held.pending.mark_done(done)
            held.stored = held.stored.mark_done(done)

    def mark_stored(self, token_id: int, offsets: Iterable[int]) -> None:
        """Offsets the offset store holds: committed by the next offset-less commit."""
        held = self._held(token_id)
        if held is not None:
            held.stored = held.stored.mark_done(offsets)

    def commit_upto(self, token_id: int, next_offset: int) -> None:
        held = self._held(token_id)
        if held is not None:
            held.pending = held.pending.commit_upto(next_offset)
            held.stored = held.stored.commit_upto(next_offset)

    def store_upto(self, token_id: int, next_offset: int) -> None:
        held = self._held(token_id)
        if held is not None:
            held.stored = held.stored.commit_upto(next_offset)

    def promote_stored(self, keys: Iterable[TopicPartitionKey] | None = None) -> None:
        """An offset-less commit takes everything stored so far."""
        pool = self._pool(keys)
        for held in pool:
            held.pending = held.stored

    def skip_to(self, token_id: int, low: int) -> int:
        held = self._held(token_id)
        if held is None:
            return 0
        # Count from the stored view: a record the application already processed
        # (stored, not yet committed) was backfilled, not lost.
        held.stored, lost = held.stored.skip_to(low)
        held.pending, _ = held.pending.skip_to(low)
        held.skipped += lost
        return lost

    def dirty(self, keys: Iterable[TopicPartitionKey] | None = None) -> list[Held]:
        return [h for h in self._pool(keys) if h.dirty and not h.parked]

    def early_dirty(self, keys: Iterable[TopicPartitionKey] | None = None) -> list[Held]:
        """Early ranges with progress the store cannot take yet (it is not theirs until the store's recovery)."""
        return [h for h in self._pool(keys) if h.early and h.dirty]

    def _pool(self, keys: Iterable[TopicPartitionKey] | None) -> list[Held]:
        """Held ranges of ``keys`` (all when None), each once even if a key is named twice."""
        if keys is None:
            return list(self._by_id.values())
        return [h for k in dict.fromkeys(keys) for h in self.held(k)]

    def settle(self, token: Token) -> None:
        """The store accepted ``token``: it is the new durable state; drop it once done."""
        held = self._by_id.get(token.id)
        if held is None:
            return
        held.token = token
        # a write-behind flush settles an older snapshot: what arrived since stays pending
        held.pending = held.pending.commit_upto(token.progress.committed).mark_done(token.progress.completed)
        held.stored = held.stored.commit_upto(token.progress.committed).mark_done(token.progress.completed)
        # never fewer skipped than the store counts, or the range would stay dirty forever
        held.skipped = max(held.skipped, token.skipped)
        self._mirror.pop(token.key, None)
        if token.progress.done:
            self.remove(token.id)

    def open_durable(self, key: TopicPartitionKey) -> list[RangeProgress]:
        return [h.durable for h in self.held(key)]

    def mirror(self, key: TopicPartitionKey) -> str:
        """The unsigned ``fr1`` text of a partition's open ranges (cached until they change).

        Sized to fit behind a marker's header and signature (:func:`metadata`).
        """
        text = self._mirror.get(key)
        if text is None:
            ranges = self.open_durable(key)
            text, whole = encode_mirror_full(ranges, limit=MARKED_MIRROR_LIMIT)
            self._mirror[key] = text
            if not whole:
                self.mirror_degradations += 1
        return text

    def set_lineage(self, key: TopicPartitionKey, lineage: str) -> None:
        """The lineage that vouches for ``key``'s ranges from now on (recovery decided it)."""
        self._lineage[key] = lineage

    def lineage(self, key: TopicPartitionKey) -> str | None:
        return self._lineage.get(key)

    def metadata(self, key: TopicPartitionKey, offset: int) -> str:
        """What a commit of ``offset`` for ``key`` carries: the marker with the mirror, signed with the mirror key.

        Without a lineage (none was decided: the book was filled by hand) it is the plain mirror.
        """
        mirror = self.mirror(key)
        context = mirror_context(self._group, key)
        lineage = self._lineage.get(key)
        if lineage is None:
            return sign_mirror(mirror, self._mirror_key, context)
        return mark(mirror, lineage, offset, key=self._mirror_key, context=context)

    def works(self, ids: Iterable[int] | None = None) -> list[RangeWork]:
        """Read orders for the child: resume each range (of ``ids``, default all) from its progress."""
        pool = self._by_id.values() if ids is None else [h for i in ids if (h := self._by_id.get(i)) is not None]
        return [
            RangeWork(h.token.id, h.token.key, h.token.span.start, h.stored.committed, h.stored.end, h.stored.completed)
            for h in pool
            if h.readable and not h.stored.done
        ]
