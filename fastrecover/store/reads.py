"""The range store's queries: tokens read back, every row checked before it becomes a Token.

:class:`RangeReads` adds the reads to :class:`~fastrecover.store.transactions.StoreTransactions`;
:class:`~fastrecover.store.sql.RangeStore` adds the writes on top.  Every read is one
statement in its own transaction (or in the caller's :meth:`transaction` block), ordered
by group, topic, partition and start offset, so callers get ranges in offset order.  A
row that does not decode raises CorruptTokenError unless the caller asked to skip it:
recovery must not silently forget a range, a status display must not die of one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from sqlalchemy import or_, select
from sqlalchemy.sql.elements import ColumnElement

from fastrecover.errors import CorruptTokenError, TokenNotFoundError
from fastrecover.store.models import token_from_row
from fastrecover.store.transactions import StoreTransactions
from fastrecover.store.writes import TABLE, chunked
from fastrecover.tokens import Token, TokenState

log = logging.getLogger("fastrecover.store")


class RangeReads(StoreTransactions):
    """The store's reads: one token by id, a group's open ranges, the ranges recovery needs, listings."""

    def get(self, token_id: int) -> Token:
        """The token as stored now; TokenNotFoundError if no such id, CorruptTokenError if invalid."""
        with self._tx(f"reading range #{token_id}") as conn:
            row = conn.execute(select(TABLE).where(TABLE.c.id == token_id)).mappings().one_or_none()
        if row is None:
            raise TokenNotFoundError(f"range token #{token_id} does not exist in {self._url}")
        return token_from_row(row)

    def open_ranges(
        self,
        group: str,
        topic: str | None = None,
        partition: int | None = None,
        *,
        skip_corrupt: bool = False,
    ) -> list[Token]:
        """The group's open ranges, optionally of one topic / partition, in offset order.

        A corrupt row raises CorruptTokenError by default: recovery must not
        silently forget a range.  ``skip_corrupt=True`` logs it and goes on.
        """
        where: list[ColumnElement[bool]] = [TABLE.c.group_id == group, TABLE.c.state == TokenState.OPEN.value]
        if topic is not None:
            where.append(TABLE.c.topic == topic)
        if partition is not None:
            where.append(TABLE.c.partition == partition)
        return self._select(where, f"reading open ranges of group {group!r}", skip_corrupt)

    def partition_ranges(
        self, group: str, topic: str, partition: int, *, ending_after: int | None = None, skip_corrupt: bool = False
    ) -> list[Token]:
        """Every open range of one partition, and the done ones that end after ``ending_after``.

        Recovery needs the done ones too: a range someone else (a Spark job)
        finished must not be handed out again, and must not hide the offsets
        past its end from the new range.  Done ranges ending at or before the
        primary's committed offset cannot matter, so the history stays unread.
        Open ones always matter, wherever they end: after a crash the group's
        Kafka offset is past them, and the commit-metadata mirror that would
        point below it may be missing (turned off, replaced by the
        application's own metadata, or signed with another key).
        """
        key = (topic, partition)
        return self.partitions_ranges(group, {key: ending_after}, skip_corrupt=skip_corrupt)[key]

    def partitions_ranges(
        self, group: str, floors: Mapping[tuple[str, int], int | None], *, skip_corrupt: bool = False
    ) -> dict[tuple[str, int], list[Token]]:
        """:meth:`partition_ranges` of many partitions in one statement: ``floors`` maps each to its ``ending_after``.

        Every partition asked for has an entry, empty when the store has nothing for it.
        """
        out: dict[tuple[str, int], list[Token]] = {key: [] for key in floors}
        for piece in chunked(sorted(floors)):  # IN lists of at most IN_CHUNK values (old SQLite builds)
            keys = set(piece)
            where: list[ColumnElement[bool]] = [
                TABLE.c.group_id == group,
                TABLE.c.state != TokenState.SUPERSEDED.value,
                TABLE.c.topic.in_(sorted({topic for topic, _ in keys})),
                TABLE.c.partition.in_(sorted({partition for _, partition in keys})),
            ]
            if all(floors[key] is not None for key in keys):
                lowest = min(floor for key in keys if (floor := floors[key]) is not None)
                where.append(or_(TABLE.c.end_offset > lowest, TABLE.c.state == TokenState.OPEN.value))
            action = f"reading ranges of {len(floors)} partition(s) of {group!r}"
            for token in self._select(where, action, skip_corrupt):
                key = (token.topic, token.partition)
                if key not in keys:
                    continue  # the cross product of the topics and partitions asked for
                floor = floors[key]
                if floor is None or token.progress.end > floor or token.is_open:
                    out[key].append(token)
        return out

    def ranges(self, group: str | None = None, *, include_done: bool = True, skip_corrupt: bool = False) -> list[Token]:
        """All ranges (of one group, or of every group), for status displays."""
        where: list[ColumnElement[bool]] = []
        if group is not None:
            where.append(TABLE.c.group_id == group)
        if not include_done:
            where.append(TABLE.c.state == TokenState.OPEN.value)
        return self._select(where, "listing ranges", skip_corrupt)

    def _select(self, where: Sequence[ColumnElement[bool]], action: str, skip_corrupt: bool) -> list[Token]:
        stmt = (
            select(TABLE)
            .where(*where)
            .order_by(TABLE.c.group_id, TABLE.c.topic, TABLE.c.partition, TABLE.c.start_offset)
        )
        with self._tx(action) as conn:
            rows = conn.execute(stmt).mappings().all()
        tokens: list[Token] = []
        for row in rows:
            try:
                tokens.append(token_from_row(row))
            except CorruptTokenError as exc:
                if not skip_corrupt:
                    raise
                log.error("skipping corrupt range token in %s: %s", self._url, exc)
        return tokens
