"""The range-token store: the child's commit log of KIP-333, kept in SQL.

The store is written from two threads (the consumer thread creates and claims
ranges, the backfill child commits their progress), so every call takes its own
connection and transaction from the engine's pool; nothing is shared but the
thread-safe Engine.  Every write that depends on what a row holds is *fenced*:
it only applies while the caller's ``(owner, epoch)`` is still the row's, so a
stale holder that lost a range can never overwrite its successor's progress.

SQLite (the embedded default) and PostgreSQL are supported.  On SQLite we take
over BEGIN from the ``sqlite3`` module: its legacy mode would not start a
transaction for our SELECT-then-UPDATE sequences, and writes use ``BEGIN
IMMEDIATE`` so two writers queue on the busy timeout instead of one failing
with "database is locked" half-way through.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

from sqlalchemy import Table, and_, delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import (
    IntegrityError,
)
from sqlalchemy.sql.elements import ColumnElement

from fastrecover import hooks
from fastrecover.codec import encode_completed
from fastrecover.errors import (
    CorruptTokenError,
    FencedError,
    SchemaBehindError,
    StoreError,
)
from fastrecover.errors import InvalidValueError as InvalidValueError  # re-exported: it was defined here
from fastrecover.errors import StoreCorruptError as StoreCorruptError  # re-exported: it was defined here
from fastrecover.errors import TokenNotFoundError as TokenNotFoundError  # re-exported: it was defined here
from fastrecover.ranges import RangeProgress
from fastrecover.store import schema
from fastrecover.store.engine import (
    BEGIN_OPTION as BEGIN_OPTION,
)
from fastrecover.store.engine import (
    DEFAULT_LOCK_TIMEOUT_MS as DEFAULT_LOCK_TIMEOUT_MS,
)
from fastrecover.store.engine import (
    DEFAULT_STATEMENT_TIMEOUT_MS as DEFAULT_STATEMENT_TIMEOUT_MS,
)
from fastrecover.store.engine import (
    STORE_URL_ENV as STORE_URL_ENV,
)
from fastrecover.store.engine import (
    build_engine as build_engine,
)
from fastrecover.store.engine import (
    has_secret as has_secret,
)
from fastrecover.store.engine import (
    is_sqlite_memory as is_sqlite_memory,
)
from fastrecover.store.engine import (
    mask_url as mask_url,
)
from fastrecover.store.engine import (
    normalize_url as normalize_url,
)
from fastrecover.store.engine import (
    sqlite_file as sqlite_file,
)
from fastrecover.store.engine import (
    translate_errors as translate_errors,
)
from fastrecover.store.engine import (
    url_for_child as url_for_child,
)
from fastrecover.store.engine import (
    validate_url as validate_url,
)
from fastrecover.store.models import NAME_MAX, RangeRow, merge_progress, token_from_row
from fastrecover.tokens import Token, TokenState

log = logging.getLogger("fastrecover.store")

_T = cast(Table, RangeRow.__table__)
_KEY_COLUMNS = ("group_id", "topic", "partition", "start_offset")
#: Largest offset the store's BIGINT columns hold.
BIGINT_MAX = 2**63 - 1
_INT_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ProgressUpdate:
    """One range's new progress, written only if ``(owner, epoch)`` still holds it.

    ``skipped`` is the range's total of records lost to retention (not a delta);
    None leaves the stored count unchanged.
    """

    token_id: int
    owner: str
    epoch: int
    progress: RangeProgress
    skipped: int | None = None


@dataclass(frozen=True, slots=True)
class CommitResult:
    """Outcome of a batch: the tokens as now stored, and the ids whose holder was fenced."""

    tokens: list[Token] = field(default_factory=list)
    fenced: list[int] = field(default_factory=list)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > NAME_MAX:
        shown = value if not isinstance(value, str) or len(value) <= 80 else value[:80] + "..."
        raise InvalidValueError(
            f"{what} must be a non-empty string of at most {NAME_MAX} characters, got {shown!r}"
            + (f" ({len(value)} characters)" if isinstance(value, str) else "")
        )
    return value


def _check_int(what: str, value: object, minimum: int = 0, maximum: int = BIGINT_MAX) -> int:
    """Refuse what the columns cannot hold before the driver sees it (it would raise OverflowError)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    if value > maximum:
        raise InvalidValueError(f"{what} must be an integer <= {maximum} (what the store can hold), got {value!r}")
    return value


def _check_progress(what: str, progress: RangeProgress) -> None:
    for name, value in (("start", progress.start), ("end", progress.end), ("committed", progress.committed)):
        _check_int(f"{name} offset of {what}", value)


class RangeStore:
    """Persistent range tokens in a SQL database; safe to share between threads.

    Obtain one with :func:`open_store`, which also checks the schema.
    """

    def __init__(self, engine: Engine, url: str) -> None:
        self._engine = engine
        self._writer = engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
        self._url = mask_url(url)
        # An in-memory SQLite database is one shared connection: serialize its users.
        self._lock: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if is_sqlite_memory(engine.url) else contextlib.nullcontext()
        )
        self._closed = False

    @property
    def url(self) -> str:
        """The store URL with the password masked."""
        return self._url

    @property
    def engine(self) -> Engine:
        return self._engine

    def __repr__(self) -> str:
        return f"RangeStore({self._url})"

    def __enter__(self) -> RangeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release pooled connections (and the SQLite file handles)."""
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    @contextlib.contextmanager
    def _tx(self, action: str, *, write: bool = False) -> Iterator[Connection]:
        if self._closed:
            raise StoreError(f"range store {self._url} is closed")
        engine = self._writer if write else self._engine
        with self._lock, translate_errors(self._url, action), engine.begin() as conn:
            yield conn

    # -- creating -------------------------------------------------------------

    def create_range(self, group: str, topic: str, partition: int, start: int, end: int, owner: str | None) -> Token:
        """Record a new range to backfill, owned by ``owner`` at epoch 1.

        Idempotent on (group, topic, partition, start) so recovery can be re-run
        after a crash between deciding and recording: the existing token is
        returned whatever its state.  An empty range (start == end) is recorded
        as already done.
        """
        _check_name("group", group)
        _check_name("topic", topic)
        if owner is not None:
            _check_name("owner", owner)
        _check_int("partition", partition, 0, _INT_MAX)
        for what, value in (("start", start), ("end", end)):
            _check_int(what, value)
        if end < start:
            raise ValueError(
                f"cannot create range [{start}, {end}) for {group}/{topic}[{partition}]: end {end} < start {start}"
            )
        now = _now()
        done = start == end
        values: dict[str, Any] = {
            "group_id": group,
            "topic": topic,
            "partition": partition,
            "start_offset": start,
            "end_offset": end,
            "committed_offset": start,
            "completed": "",
            "skipped": 0,
            "owner": owner,
            "epoch": 1,
            "state": (TokenState.DONE if done else TokenState.OPEN).value,
            "created_at": now,
            "updated_at": now,
            "finished_at": now if done else None,
        }
        with self._tx("creating a range", write=True) as conn:
            self._insert_ignore(conn, values)
            hooks.fire("token-write")  # fault point: inserted, not yet committed
            row = conn.execute(select(_T).where(and_(*(_T.c[k] == values[k] for k in _KEY_COLUMNS)))).mappings().one()
        token = token_from_row(row)
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
        return token

    @staticmethod
    def _insert_ignore(conn: Connection, values: Mapping[str, Any]) -> None:
        dialect = conn.dialect.name
        if dialect == "postgresql":
            conn.execute(pg_insert(_T).values(**values).on_conflict_do_nothing(constraint="uq_fastrecover_ranges_key"))
        elif dialect == "sqlite":
            conn.execute(sqlite_insert(_T).values(**values).on_conflict_do_nothing(index_elements=list(_KEY_COLUMNS)))
        else:
            try:
                with conn.begin_nested():
                    conn.execute(_T.insert().values(**values))
            except IntegrityError:
                pass  # the row exists; the caller reads it back

    # -- reading --------------------------------------------------------------

    def get(self, token_id: int) -> Token:
        """The token as stored now; TokenNotFoundError if no such id, CorruptTokenError if invalid."""
        with self._tx(f"reading range #{token_id}") as conn:
            row = conn.execute(select(_T).where(_T.c.id == token_id)).mappings().one_or_none()
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
        where: list[ColumnElement[bool]] = [_T.c.group_id == group, _T.c.state == TokenState.OPEN.value]
        if topic is not None:
            where.append(_T.c.topic == topic)
        if partition is not None:
            where.append(_T.c.partition == partition)
        return self._select(where, f"reading open ranges of group {group!r}", skip_corrupt)

    def partition_ranges(
        self, group: str, topic: str, partition: int, *, ending_after: int | None = None, skip_corrupt: bool = False
    ) -> list[Token]:
        """Every range of one partition, open and done, that ends after ``ending_after``.

        Recovery needs the done ones too: a range someone else (a Spark job)
        finished must not be handed out again, and must not hide the offsets
        past its end from the new range.  Ranges ending at or before the
        primary's committed offset cannot matter, so the history stays unread.
        """
        where: list[ColumnElement[bool]] = [
            _T.c.group_id == group,
            _T.c.topic == topic,
            _T.c.partition == partition,
        ]
        if ending_after is not None:
            where.append(_T.c.end_offset > ending_after)
        return self._select(where, f"reading ranges of {group!r}/{topic}[{partition}]", skip_corrupt)

    def ranges(self, group: str | None = None, *, include_done: bool = True, skip_corrupt: bool = False) -> list[Token]:
        """All ranges (of one group, or of every group), for status displays."""
        where: list[ColumnElement[bool]] = []
        if group is not None:
            where.append(_T.c.group_id == group)
        if not include_done:
            where.append(_T.c.state == TokenState.OPEN.value)
        return self._select(where, "listing ranges", skip_corrupt)

    def _select(self, where: Sequence[ColumnElement[bool]], action: str, skip_corrupt: bool) -> list[Token]:
        stmt = select(_T).where(*where).order_by(_T.c.group_id, _T.c.topic, _T.c.partition, _T.c.start_offset)
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

    # -- fenced writes --------------------------------------------------------

    def claim(self, token_id: int, owner: str) -> Token:
        """Take over an open range: bump its epoch so the previous holder is fenced.

        A done range is returned unchanged (there is nothing left to hold).
        """
        _check_name("owner", owner)
        with self._tx(f"claiming range #{token_id}", write=True) as conn:
            row = self._locked_rows(conn, [token_id]).get(token_id)
            hooks.fire("claim")  # fault point: row lock held, nothing written yet
            if row is None:
                raise TokenNotFoundError(f"range token #{token_id} does not exist in {self._url}")
            token = token_from_row(row)  # refuse to hand out a corrupt range
            if not token.is_open:
                return token
            conn.execute(
                update(_T)
                .where(_T.c.id == token_id, _T.c.state == TokenState.OPEN.value)
                .values(epoch=_T.c.epoch + 1, owner=owner, updated_at=_now())
            )
            row = conn.execute(select(_T).where(_T.c.id == token_id)).mappings().one()
        claimed = token_from_row(row)
        log.info("claimed %s", claimed.describe())
        return claimed

    def claim_many(self, token_ids: Sequence[int], owner: str) -> list[Token]:
        """Claim several ranges in one transaction, as :meth:`claim` does each (missing ids are skipped).

        Recovery resumes every open range of a partition at once; one transaction per range made
        a recovery over hundreds of small ranges take seconds.
        """
        _check_name("owner", owner)
        ids = sorted(set(token_ids))
        if not ids:
            return []
        with self._tx(f"claiming {len(ids)} range(s)", write=True) as conn:
            rows = self._locked_rows(conn, ids)
            hooks.fire("claim")  # fault point: row locks held, nothing written yet
            open_ids = [i for i in ids if i in rows and token_from_row(rows[i]).is_open]
            if open_ids:
                conn.execute(
                    update(_T)
                    .where(_T.c.id.in_(open_ids), _T.c.state == TokenState.OPEN.value)
                    .values(epoch=_T.c.epoch + 1, owner=owner, updated_at=_now())
                )
            fresh = conn.execute(select(_T).where(_T.c.id.in_(ids))).mappings().all()
        claimed = sorted((token_from_row(r) for r in fresh), key=lambda t: t.id)
        log.info("claimed %d range(s) for %s", len(open_ids), owner)
        return claimed

    @staticmethod
    def _locked_rows(conn: Connection, ids: Sequence[int]) -> dict[int, Mapping[Any, Any]]:
        # FOR UPDATE in id order (PostgreSQL) so concurrent batches cannot deadlock;
        # SQLite ignores it and is already serialized by BEGIN IMMEDIATE.
        stmt = select(_T).where(_T.c.id.in_(sorted(set(ids)))).order_by(_T.c.id).with_for_update()
        return {int(r["id"]): r for r in conn.execute(stmt).mappings()}

    def commit_progress(self, updates: Sequence[ProgressUpdate]) -> CommitResult:
        """Write a batch of progress in ONE transaction; fenced updates are reported, not raised.

        The stored offset never moves backwards: a stale (re-ordered) commit is
        merged into what is stored rather than overwriting it.  An update whose
        range does not match the stored one is a caller bug: ValueError, and
        nothing of the batch is written.
        """
        for u in updates:
            if not isinstance(u, ProgressUpdate) or not isinstance(u.progress, RangeProgress):
                raise ValueError(f"expected ProgressUpdate with a RangeProgress, got {u!r}")
            _check_int("token id", u.token_id, 1)
            _check_progress(f"range #{u.token_id}", u.progress)
            _check_int(f"epoch of range #{u.token_id}", u.epoch, 0, _INT_MAX)
            _check_name(f"owner of range #{u.token_id}", u.owner)
            if u.skipped is not None:
                _check_int(f"skipped of range #{u.token_id}", u.skipped)
        if not updates:
            return CommitResult()
        result = CommitResult()
        with self._tx(f"committing progress of {len(updates)} range(s)", write=True) as conn:
            rows = self._locked_rows(conn, [u.token_id for u in updates])
            hooks.fire("store-commit")  # fault point: row locks held, nothing written yet
            current: dict[int, Token] = {}
            for u in updates:
                if u.token_id not in rows:
                    result.fenced.append(u.token_id)
                    continue
                token = current.get(u.token_id) or token_from_row(rows[u.token_id])
                stored, new = token.progress, u.progress
                if (new.start, new.end) != (stored.start, stored.end):
                    raise ValueError(
                        f"progress for range #{u.token_id} covers [{new.start}, {new.end}) "
                        f"but the stored range is [{stored.start}, {stored.end})"
                    )
                if (token.owner, token.epoch) != (u.owner, u.epoch) or not token.is_open:
                    result.fenced.append(u.token_id)
                    continue
                merged = merge_progress(stored, new)
                skipped = token.skipped if u.skipped is None else max(token.skipped, u.skipped)
                after = token.with_progress(merged, skipped)
                now = _now()
                res = conn.execute(
                    update(_T)
                    .where(
                        _T.c.id == u.token_id,
                        _T.c.owner == u.owner,
                        _T.c.epoch == u.epoch,
                        _T.c.state == TokenState.OPEN.value,
                    )
                    .values(
                        committed_offset=merged.committed,
                        completed=encode_completed(merged.committed, merged.completed),
                        skipped=skipped,
                        state=after.state.value,
                        updated_at=now,
                        finished_at=now if not after.is_open else None,
                    )
                )
                if res.rowcount != 1:  # only possible without row locks (other dialects)
                    result.fenced.append(u.token_id)
                    continue
                current[u.token_id] = after
                result.tokens.append(after)
        for token_id in result.fenced:
            log.warning("commit to range #%d was fenced (stale owner/epoch or range done)", token_id)
        return result

    def commit_one(self, update: ProgressUpdate) -> Token:
        """Commit one range; FencedError (naming both holders) if the caller lost it."""
        result = self.commit_progress([update])
        if result.tokens:
            return result.tokens[0]
        try:
            now = self.get(update.token_id)
            holder = f"owner={now.owner!r} epoch={now.epoch} state={now.state.value}"
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
                update(_T)
                .where(_T.c.id == token_id, _T.c.owner == owner, _T.c.epoch == epoch)
                .values(owner=None, updated_at=_now())
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
        _check_name("group", group)
        ids = sorted({_check_int("token id", i, 1) for i in token_ids})
        if not ids:
            return 0
        with self._tx(f"deleting {len(ids)} open range(s) of group {group!r}", write=True) as conn:
            res = conn.execute(
                delete(_T).where(_T.c.id.in_(ids), _T.c.group_id == group, _T.c.state == TokenState.OPEN.value)
            )
            return int(res.rowcount)


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
