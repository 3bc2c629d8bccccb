"""What a mode-on consumer keeps per assigned partition, in one registry.

Every partition this member holds has one :class:`PartitionState`; removing it is one call
(:meth:`Partitions.remove`), so a partition that leaves the member leaves nothing behind, however
many paths wrote to it.  The ranges themselves stay in :class:`~fastrecover.book.RangeBook`
(they outlive an assignment in the store), the primary's offsets in
:class:`~fastrecover.primary.PrimaryOffsets`, the child's work in its reader and a recovery's
unfinished store part in the recoverer: each of those units keeps its own maps, and
:meth:`Partitions.remove` is the one call that empties all of them, in an order fixed at
construction, so no path can forget one.  The registry answers the one question every
commit path asks first, :meth:`Partitions.owns`: is this partition ours (a range, a mirror or a
floor), or can plain confluent_kafka handle it?

Who calls what: the hand-over adds partitions on assignment (:meth:`assign`), sets the floors a
recovery decided (:meth:`set_floors`) and removes partitions when they leave (:meth:`remove`, from
its ``let_go`` only: what a partition owes Kafka and the store is settled first); the
commit router reads and drops floors and keeps the application's metadata of routed commits; the
merge holds a partition's EOF while the child still reads it.  Everything runs on the caller's thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from fastrecover.book import Held, RangeBook
from fastrecover.tokens import TopicPartitionKey

if TYPE_CHECKING:
    from confluent_kafka import Message


class PartitionState:
    """One assigned partition's own state (its ranges are the book's)."""

    __slots__ = ("floor", "held_eof", "user_meta")

    def __init__(self) -> None:
        #: the offset Kafka's committed offset moves to once the partition's ranges finish while the
        #: primary committed nothing (so that committed() is never stale); None: no floor
        self.floor: int | None = None
        #: the metadata the application gave with a commit the store took (committed() returns it)
        self.user_meta: str | None = None
        #: an EOF event held back while the child still reads the partition's backlog
        self.held_eof: Message | None = None


class Partitions:
    """The assigned partitions' states, and which partitions are ours.

    ``routes`` (partitions with a claimed range: their commits are routed) and ``owned`` (a
    range, a parked mirror or a floor: plain's own calls would lose something) are sets read
    directly, never written, by the per-record commit paths; :meth:`refresh` recomputes them
    whenever the book's partitions or the floors change.
    """

    def __init__(self, book: RangeBook, holders: Sequence[Callable[[list[TopicPartitionKey]], object]] = ()) -> None:
        """``holders``: the other units' removals of a partition (the child's first: it stops reading)."""
        self._book = book
        self._holders = tuple(holders)
        self._states: dict[TopicPartitionKey, PartitionState] = {}
        self._floors = 0  # states with a floor: most of the time none, and then no loop looks for one
        self._held_eofs = 0
        self.routes: set[TopicPartitionKey] = set()
        self.owned: set[TopicPartitionKey] = set()

    # ---- membership (the hand-over) ------------------------------------------------------------

    @property
    def assigned(self) -> set[TopicPartitionKey]:
        """The partitions assigned to this member (a copy)."""
        return set(self._states)

    def __contains__(self, key: object) -> bool:
        return key in self._states

    def __len__(self) -> int:
        return len(self._states)

    def assign(self, keys: Iterable[TopicPartitionKey]) -> None:
        """Partitions join this member (those that leave go through :meth:`remove`, never through here)."""
        for key in keys:
            if key not in self._states:
                self._states[key] = PartitionState()

    def remove(self, keys: Iterable[TopicPartitionKey]) -> list[Held]:
        """Partitions leave this member: everything any unit kept for them goes; the book's ranges are returned.

        Also for keys the registry does not hold: a recovery may have parked ranges, or handed the child
        work, for a partition whose assignment then failed.
        """
        gone = list(dict.fromkeys(keys))
        if not gone:
            return []
        for drop in self._holders:
            drop(gone)
        released = self._book.remove_partitions(gone)
        for key in gone:
            state = self._states.pop(key, None)
            if state is None:
                continue
            self._floors -= state.floor is not None
            self._held_eofs -= state.held_eof is not None
        self.refresh()
        return released

    def refresh(self) -> None:
        """The book's partitions or the floors changed: recompute ``routes`` and ``owned``."""
        self.routes = self._book.routes()
        owned = set(self._book.by_key)
        if self._floors:
            owned.update(k for k, s in self._states.items() if s.floor is not None)
        self.owned = owned

    def owns(self, key: object) -> bool:
        """Whether a commit or store of ``key`` needs the mode: it has a range, a mirror or a floor."""
        return key in self.owned

    # ---- floors (recovery sets them, the commit paths drop them) ---------------------------------

    def set_floors(self, floors: Mapping[TopicPartitionKey, int]) -> None:
        """Floors a recovery decided, for partitions still assigned (:meth:`refresh` follows)."""
        for key, offset in floors.items():
            state = self._states.get(key)
            if state is not None:
                self._floors += state.floor is None
                state.floor = offset

    def floor(self, key: TopicPartitionKey) -> int | None:
        state = self._states.get(key)
        return None if state is None else state.floor

    def drop_floors(self, keys: Iterable[tuple[str, int]]) -> None:
        """The primary handed its own offsets of ``keys`` to librdkafka: their floors must never follow."""
        if not self._floors:
            return
        dropped = False
        for key in keys:
            state = self._states.get(key)  # type: ignore[call-overload]
            if state is not None and state.floor is not None:
                state.floor = None
                self._floors -= 1
                dropped = True
        if dropped:
            self.refresh()

    # ---- the application's metadata of routed commits --------------------------------------------

    def keep_meta(self, key: TopicPartitionKey, meta: str) -> None:
        state = self._states.get(key)
        if state is not None:
            state.user_meta = meta

    def meta(self, key: TopicPartitionKey) -> str | None:
        state = self._states.get(key)
        return None if state is None else state.user_meta

    # ---- EOF events held while the child reads (the merge) ---------------------------------------

    @property
    def holds_eof(self) -> bool:
        return self._held_eofs > 0

    def hold_eof(self, key: TopicPartitionKey, msg: Message) -> bool:
        """Keep ``msg`` (an EOF of ``key``) until the child is done with ``key``; False: not assigned."""
        state = self._states.get(key)
        if state is None:
            return False
        self._held_eofs += state.held_eof is None
        state.held_eof = msg
        return True

    def release_eof(self, key: TopicPartitionKey) -> Message | None:
        state = self._states.get(key)
        if state is None or state.held_eof is None:
            return None
        msg, state.held_eof = state.held_eof, None
        self._held_eofs -= 1
        return msg
