"""The range-token store: the child's commit log of KIP-333, kept in SQL.

:class:`RangeStore` is the public API: it creates ranges and makes the fenced
writes, on top of :class:`~fastrecover.store.reads.RangeReads` (the queries),
itself on top of :class:`~fastrecover.store.transactions.StoreTransactions` (the
connection and transaction of each call, shared safely between the consumer
thread and the backfill child).  Every write that depends on what a row holds is
*fenced*: it only applies while the caller's ``(owner, epoch)`` is still the
row's, so a stale holder that lost a range can never overwrite its successor's
progress.  The statements a write runs inside its transaction are in
:mod:`fastrecover.store.writes`, the checks of caller values in
:mod:`fastrecover.store.checks`.  :func:`open_store` builds the engine and checks
the schema.

SQLite (the embedded default) and PostgreSQL are supported.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from sqlalchemy import delete, update

from fastrecover.codec import check_lineage
from fastrecover.errors import FencedError, SchemaBehindError, TokenNotFoundError
from fastrecover.store import schema
from fastrecover.store.checks import INT_MAX, check_int, check_name
from fastrecover.store.engine import (
    DEFAULT_LOCK_TIMEOUT_MS,
    DEFAULT_STATEMENT_TIMEOUT_MS,
    build_engine,
    normalize_url,
    sqlite_file,
)

# Re-exported: the CLI and the tools' demo import these three from here.
from fastrecover.store.engine import mask_url as mask_url
from fastrecover.store.engine import url_for_child as url_for_child
from fastrecover.store.engine import validate_url as validate_url
from fastrecover.store.models import token_from_row
from fastrecover.store.reads import RangeReads
from fastrecover.store.updates import CommitResult, ProgressUpdate
from fastrecover.store.writes import (
    TABLE,
    adopt_rows,
    apply_progress,
    check_updates,
    chunked,
    claim_rows,
    insert_ranges,
    now,
    retire_rows,
)
from fastrecover.tokens import Token, TokenState

log = logging.getLogger("fastrecover.store")


class RangeStore(RangeReads):
    """Persistent range tokens in a SQL database; safe to share between threads.

    Obtain one with :func:`open_store`, which also checks the schema.
    """

    def __repr__(self) -> str:
        return f"RangeStore({self._url})"

    def __enter__(self) -> RangeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- creating -------------------------------------------------------------

    def create_range(
        self,
        group: str,
        topic: str,
        partition: int,
        start: int,
        end: int,
        owner: str | None,
        lineage: str | None = None,
    ) -> Token:
        """Record a new range to backfill, owned by ``owner`` at epoch 1.

        Idempotent on (group, topic, partition, start) so recovery can be re-run
        after a crash between deciding and recording: the existing token is
        returned whatever its state.  An empty range (start == end) is recorded
        as already done.
        """
        lineages = None if lineage is None else {(topic, partition): lineage}
        return self.create_ranges(group, [(topic, partition, start, end)], owner, lineages)[(topic, partition, start)]

    def create_ranges(
        self,
        group: str,
        spans: Sequence[tuple[str, int, int, int]],
        owner: str | None,
        lineages: Mapping[tuple[str, int], str] | None = None,
    ) -> dict[tuple[str, int, int], Token]:
        """:meth:`create_range` for many ``(topic, partition, start, end)`` at once: one insert, one read back.

        Recovery records the new range of every partition it was given; one statement per
        partition made a recovery of many partitions pay a round trip each.  Returns the
        stored token of each ``(topic, partition, start)`` key, whatever created it (an
        existing range at a key is kept, as :meth:`create_range` keeps it).  ``lineages``
        names the lineage of each partition's new ranges (none: no lineage).
        """
        check_name("group", group)
        if owner is not None:
            check_name("owner", owner)
        for lineage in (lineages or {}).values():
            check_name("lineage", check_lineage(lineage))
        for topic, partition, start, end in spans:
            check_name("topic", topic)
            check_int("partition", partition, 0, INT_MAX)
            for what, value in (("start", start), ("end", end)):
                check_int(what, value)
            if end < start:
                raise ValueError(
                    f"cannot create range [{start}, {end}) for {group}/{topic}[{partition}]: end {end} < start {start}"
                )
        if not spans:
            return {}
        with self._tx(f"creating {len(spans)} range(s)", write=True) as conn:
            rows = insert_ranges(conn, group, spans, owner, lineages)
        tokens = {(t.topic, t.partition, t.progress.start): t for t in map(token_from_row, rows)}
        for topic, partition, start, end in spans:
            token = tokens[(topic, partition, start)]
            if token.progress.end != end:
                log.warning(
                    "range %s/%s[%d] starting at %d already exists as #%d ending at %d (asked for %d); "
                    "keeping the existing one",
                    group,
                    topic,
                    partition,
                    start,
                    token.id,
                    token.progress.end,
                    end,
                )
        return tokens

    # -- fenced writes --------------------------------------------------------

    def claim(self, token_id: int, owner: str) -> Token:
        """Take over an open range: bump its epoch so the previous holder is fenced.

        A done range is returned unchanged (there is nothing left to hold).
        """
        check_name("owner", owner)
        with self._tx(f"claiming range #{token_id}", write=True) as conn:
            tokens, claimed = claim_rows(conn, [token_id], owner)
            if not tokens:
                raise TokenNotFoundError(f"range token #{token_id} does not exist in {self._url}")
        if claimed:
            log.info("claimed %s", tokens[0].describe())
        return tokens[0]

    def claim_many(self, token_ids: Sequence[int], owner: str) -> list[Token]:
        """Claim several ranges in one transaction, as :meth:`claim` does each (missing ids are skipped).

        Recovery resumes every open range of a partition at once; one transaction per range made
        a recovery over hundreds of small ranges take seconds.
        """
        check_name("owner", owner)
        ids = sorted(set(token_ids))
        if not ids:
            return []
        with self._tx(f"claiming {len(ids)} range(s)", write=True) as conn:
            tokens, claimed = claim_rows(conn, ids, owner)
        log.info("claimed %d range(s) for %s", claimed, owner)
        return tokens

    def retire(self, token_ids: Sequence[int]) -> int:
        """Mark ranges superseded: kept for audit, never read or used to skip again (see ``fastrecover.recovery``).

        Returns how many were retired now (an id already superseded, or missing, counts nothing).
        """
        ids = sorted(set(token_ids))
        if not ids:
            return 0
        for token_id in ids:
            check_int("token id", token_id, 1)
        with self._tx(f"retiring {len(ids)} range(s)", write=True) as conn:
            return retire_rows(conn, ids)

    def adopt(self, token_ids: Sequence[int], lineage: str) -> None:
        """Record that ``lineage`` vouches for these ranges from now on (recovery keeps them)."""
        check_name("lineage", check_lineage(lineage))
        ids = sorted(set(token_ids))
        if ids:
            with self._tx(f"adopting {len(ids)} range(s)", write=True) as conn:
                adopt_rows(conn, ids, lineage)

    def commit_progress(self, updates: Sequence[ProgressUpdate]) -> CommitResult:
        """Write a batch of progress in ONE transaction; fenced updates are reported, not raised.

        The stored offset never moves backwards: a stale (re-ordered) commit is
        merged into what is stored rather than overwriting it.  An update whose
        range does not match the stored one is a caller bug: ValueError, and
        nothing of the batch is written.
        """
        check_updates(updates)
        if not updates:
            return CommitResult()
        with self._tx(f"committing progress of {len(updates)} range(s)", write=True) as conn:
            result = apply_progress(conn, updates)
        for token_id in result.fenced:
            log.warning("commit to range #%d was fenced (stale owner/epoch or range done)", token_id)
        return result

    def commit_one(self, update: ProgressUpdate) -> Token:
        """Commit one range; FencedError (naming both holders) if the caller lost it."""
        result = self.commit_progress([update])
        if result.tokens:
            return result.tokens[0]
        try:
            stored = self.get(update.token_id)
            holder = f"owner={stored.owner!r} epoch={stored.epoch} state={stored.state.value}"
        except TokenNotFoundError:
            holder = "no such token"
        raise FencedError(
            f"commit to range #{update.token_id} fenced: caller owner={update.owner!r} "
            f"epoch={update.epoch}, store has {holder}"
        )

    def release(self, token_id: int, owner: str, epoch: int) -> bool:
        """Give a range up (owner=NULL) if the caller still holds it; False if it did not."""
        with self._tx(f"releasing range #{token_id}", write=True) as conn:
            res = conn.execute(
                update(TABLE)
                .where(TABLE.c.id == token_id, TABLE.c.owner == owner, TABLE.c.epoch == epoch)
                .values(owner=None, updated_at=now())
            )
            released = bool(res.rowcount == 1)
        if not released:
            log.info("release of range #%d by owner=%r epoch=%d ignored: no longer held", token_id, owner, epoch)
        return released

    def delete_open(self, group: str, token_ids: Sequence[int]) -> int:
        """Delete the group's ranges with these ids that are still open; returns how many.

        For ``fastrecover rollback`` only: once Kafka's offset is moved back below
        a range, the range is Kafka's business again.  Done ranges are never
        deleted here (they record finished work), nor is a range that finished
        or changed group since the caller read it.
        """
        check_name("group", group)
        ids = sorted({check_int("token id", i, 1) for i in token_ids})
        if not ids:
            return 0
        deleted = 0
        with self._tx(f"deleting {len(ids)} open range(s) of group {group!r}", write=True) as conn:
            for piece in chunked(ids):
                res = conn.execute(
                    delete(TABLE).where(
                        TABLE.c.id.in_(piece), TABLE.c.group_id == group, TABLE.c.state == TokenState.OPEN.value
                    )
                )
                deleted += int(res.rowcount)
        return deleted


def open_store(
    url: str,
    *,
    create: bool = True,
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
    read_only: bool = False,
) -> RangeStore:
    """Open (and on first use create) the range store at ``url``.

    A database without any fastrecover schema is initialised when ``create`` is
    true, which is what makes the embedded SQLite default work on first run.  A
    schema that is behind this library is never upgraded implicitly (other
    consumers may still run the old version): SchemaBehindError names the
    ``fastrecover db upgrade`` command to run.

    A new SQLite file is created with mode 0600: it holds the group's progress
    and nobody else needs to read it.  ``read_only`` (implies ``create=False``)
    writes nothing at all, for inspecting a store one may not write.  A file
    that is not a usable database raises StoreCorruptError, a
    StoreUnavailableError, so a consumer degrades exactly as for an unreachable
    store.
    """
    parsed = normalize_url(url)
    create = create and not read_only
    path = sqlite_file(parsed)
    if path is not None and not os.path.exists(path) and not create:
        # Do not let sqlite3 create an empty file as a side effect (e.g. of `status` on a typo).
        raise SchemaBehindError(
            f"range store {mask_url(parsed)}: SQLite file {path} does not exist; "
            f"to create it, run: {schema.upgrade_command(url)}"
        )
    engine = build_engine(
        parsed, lock_timeout_ms=lock_timeout_ms, statement_timeout_ms=statement_timeout_ms, read_only=read_only
    )
    try:
        schema.ensure_schema(engine, url, create=create)
    except BaseException:
        engine.dispose()
        raise
    return RangeStore(engine, url)
