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
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

from sqlalchemy import Table, and_, create_engine, delete, event, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    NoSuchModuleError,
    OperationalError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.elements import ColumnElement

from fastrecover.codec import encode_completed
from fastrecover.errors import (
    ConfigError,
    CorruptTokenError,
    FencedError,
    SchemaBehindError,
    StoreError,
    StoreUnavailableError,
)
from fastrecover.ranges import RangeProgress
from fastrecover.store.models import NAME_MAX, RangeRow, merge_progress, token_from_row
from fastrecover.tokens import Token, TokenState

log = logging.getLogger("fastrecover.store")

_T = cast(Table, RangeRow.__table__)
_KEY_COLUMNS = ("group_id", "topic", "partition", "start_offset")
#: Execution option read by our SQLite "begin" hook: DEFERRED for reads, IMMEDIATE for writes.
_BEGIN_OPTION = "fastrecover_sqlite_begin"
_PG_CONNECT_TIMEOUT_S = 10
#: Default wait for a row lock (PostgreSQL lock_timeout) or the write lock (SQLite busy timeout).
#: A consumer's poll() and commit() may wait this long on the store, never forever.
DEFAULT_LOCK_TIMEOUT_MS = 5_000
#: Default cap of one statement (PostgreSQL statement_timeout). 0 disables either timeout.
DEFAULT_STATEMENT_TIMEOUT_MS = 10_000
#: Largest offset the store's BIGINT columns hold.
BIGINT_MAX = 2**63 - 1
_INT_MAX = 2**31 - 1
#: SQLite messages that mean "the file is not a usable database" (not "try again later").
_CORRUPT_MARKERS = ("file is not a database", "database disk image is malformed", "file is encrypted")


class TokenNotFoundError(StoreError, LookupError):
    """No range token has the requested id (it was never created or was deleted by hand)."""


class StoreCorruptError(StoreUnavailableError):
    """The store's file is not a usable database (corrupt, truncated, or not SQLite at all).

    A subclass of StoreUnavailableError on purpose: a consumer treats a corrupt
    store like an unreachable one (it degrades to a plain consumer and logs),
    since neither can tell it anything about its ranges; the CLI prints it as a
    one-line error.
    """


class InvalidValueError(StoreError, ValueError):
    """A value handed to the store is out of what it can hold (e.g. an offset above BIGINT)."""


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


#: Query-string keys whose values are secrets (matched case-insensitively, anywhere in the key).
_SECRET_WORDS = ("password", "passwd", "pwd", "secret", "token")
_SECRET_QUERY = re.compile(
    r"([?&;])([^=&;#]*(?:" + "|".join(_SECRET_WORDS) + r")[^=&;#]*)=([^&;#]*)",
    re.IGNORECASE,
)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://)(.*)$", re.DOTALL)
_MASK = "***"


def mask_url(url: str | URL) -> str:
    """The URL with every secret replaced by ``***``, safe for messages, logs and files.

    Works on the text, not on a parse, so a URL that SQLAlchemy would mis-parse
    (a password holding ``@`` or ``/``) or not parse at all leaks nothing: the
    user-info ends at the *last* ``@`` and everything after its first ``:`` is
    masked, and so is the value of every query parameter whose name contains
    password, secret or token (``?password=``, ``?sslpassword=``, ...).  When in
    doubt it masks too much, never too little.
    """
    text = url.render_as_string(hide_password=False) if isinstance(url, URL) else str(url)
    match = _SCHEME.match(text)
    if match is None:
        # Not a URL at all: still hide anything that looks like key=secret or user:secret@.
        # Anything after a ':' may be a password (user:secret, with or without a host after it).
        text = _SECRET_QUERY.sub(rf"\1\2={_MASK}", "?" + text)[1:]
        return text.split(":", 1)[0] + ":" + _MASK if ":" in text else text
    scheme, rest = match.groups()
    # The user-info ends at the last '@'; a URL SQLAlchemy mis-parsed (an unescaped '@' in the
    # password) renders the rest of the password with the real '@' escaped as %40, so that counts too.
    at, sep = rest.rfind("@"), "@"
    escaped = rest.upper().rfind("%40")
    if escaped > at:
        at, sep = escaped, rest[escaped : escaped + 3]
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + len(sep) :]
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":" + _MASK
        rest = userinfo + sep + rest
    return scheme + _SECRET_QUERY.sub(rf"\1\2={_MASK}", rest)


def has_secret(url: str | URL) -> bool:
    """True when :func:`mask_url` hides something: the URL must not go into argv or files."""
    text = url.render_as_string(hide_password=False) if isinstance(url, URL) else str(url)
    return mask_url(text) != text


def _reason(exc: BaseException) -> str:
    """The first line of the driver's message: enough to act on, without the driver's essay."""
    orig = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(orig).strip().splitlines() if line.strip()]
    first = lines[0] if lines else type(orig).__name__
    return first if len(first) <= 200 else first[:197] + "..."


def _driver_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [sqlite3.OperationalError]
    try:
        import psycopg

        errors.append(psycopg.OperationalError)
    except ImportError:  # psycopg is an optional extra
        pass
    return tuple(errors)


#: What "cannot talk to the database" looks like, wrapped by SQLAlchemy or raw from a pool hook.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    PoolTimeoutError,
    *_driver_errors(),
)


_TRANSLATED: tuple[type[BaseException], ...] = (*_UNAVAILABLE, DBAPIError, sqlite3.DatabaseError)


@contextlib.contextmanager
def translate_errors(masked_url: str, action: str) -> Iterator[None]:
    """Turn SQLAlchemy/driver failures into our StoreError family, keeping the cause.

    Connection-level failures (refused, timed out, file missing or locked) become
    StoreUnavailableError, which callers treat as "retry later"; anything else
    the database rejects becomes a plain StoreError.
    """
    try:
        yield
    except _TRANSLATED as exc:
        if _is_corrupt(exc):
            raise StoreCorruptError(
                f"range store {masked_url} is not a usable database while {action}: {_reason(exc)}"
            ) from exc
        if isinstance(exc, _UNAVAILABLE):
            raise StoreUnavailableError(
                f"range store {masked_url} is unavailable while {action}: {_reason(exc)}"
            ) from exc
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            raise StoreUnavailableError(
                f"range store {masked_url} lost its connection while {action}: {_reason(exc)}"
            ) from exc
        raise StoreError(f"range store {masked_url} failed while {action}: {_reason(exc)}") from exc


def _is_corrupt(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", None) or exc
    return isinstance(orig, sqlite3.DatabaseError) and any(m in str(orig) for m in _CORRUPT_MARKERS)


def _normalize_url(url: str | URL) -> URL:
    if isinstance(url, URL):
        parsed = url
    else:
        if not isinstance(url, str) or "://" not in url:
            raise ConfigError(
                f"invalid store URL {mask_url(str(url))!r}: expected an SQLAlchemy URL such as "
                "sqlite:///fastrecover.db or postgresql+psycopg://user@host/db"
            )
        try:
            parsed = make_url(url)
        except (ArgumentError, ValueError):
            # The parser's message repeats the raw URL, password included: keep it out of the chain.
            raise ConfigError(
                f"invalid store URL {mask_url(url)!r}: not of the form dialect+driver://user:password@host/database"
            ) from None
    if parsed.drivername in ("postgresql", "postgres"):
        # Plain postgresql:// would pick psycopg2, which we do not depend on.
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite_query(parsed)
    return parsed


def _check_sqlite_query(url: URL) -> None:
    """SQLite's URL parameters go to sqlite3.connect: refuse bad ones with our error, not a traceback."""
    timeout = url.query.get("timeout")
    if timeout is not None:
        value = timeout if isinstance(timeout, str) else timeout[-1]
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds <= 3600:  # also refuses nan
            raise ConfigError(
                f"invalid store URL {mask_url(url)!r}: timeout={value!r} must be a number of seconds in [0, 3600]"
            )
    for name in ("check_same_thread", "uri"):
        flag = url.query.get(name)
        if flag is not None and str(flag).lower() not in ("true", "false", "1", "0"):
            raise ConfigError(f"invalid store URL {mask_url(url)!r}: {name}={flag!r} must be true or false")


def _is_sqlite_memory(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and (
        url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"
    )


def _sqlite_file(url: URL) -> str | None:
    if url.get_backend_name() != "sqlite" or _is_sqlite_memory(url) or url.database is None:
        return None
    if url.database.startswith("file:"):  # URI filenames: leave them to sqlite
        return None
    return url.database


def _check_timeout(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 3_600_000:
        raise ConfigError(f"{name}: expected milliseconds in [0, 3600000], got {value!r}")
    return value


def build_engine(
    url: str | URL,
    *,
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
    read_only: bool = False,
) -> Engine:
    """An Engine configured for concurrent use by the consumer and the child thread.

    Every wait is bounded, so a store that hangs cannot hang ``poll()``: PostgreSQL
    gets ``lock_timeout`` and ``statement_timeout`` on every connection, SQLite a
    busy timeout of ``lock_timeout_ms`` (0 turns a timeout off).  ``read_only``
    opens a SQLite file read-only and never switches it to WAL, so a file or
    directory without write permission can still be inspected.
    """
    _check_timeout("fastrecover.store.lock.timeout.ms", lock_timeout_ms)
    _check_timeout("fastrecover.store.statement.timeout.ms", statement_timeout_ms)
    parsed = _normalize_url(url)
    backend = parsed.get_backend_name()
    memory = _is_sqlite_memory(parsed)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if backend == "sqlite":
        if memory:
            # One shared connection, else every pooled connection is a new empty database.
            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        else:
            path = _sqlite_file(parsed)
            if read_only and path is not None:
                parsed = _read_only_url(path)
            elif path is not None and not os.path.exists(path):
                _create_private_file(path, mask_url(parsed))
            kwargs["connect_args"] = {"timeout": lock_timeout_ms / 1000.0}
    elif backend == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": _PG_CONNECT_TIMEOUT_S}
    try:
        engine = create_engine(parsed, **kwargs)
    except (ArgumentError, NoSuchModuleError, ImportError, ValueError, TypeError) as exc:
        raise ConfigError(f"cannot use store URL {mask_url(parsed)}: {_reason(exc)}") from exc
    if backend == "sqlite":
        _install_sqlite_hooks(engine, memory=memory, busy_ms=lock_timeout_ms, read_only=read_only)
    elif backend == "postgresql":
        _install_pg_hooks(engine, lock_timeout_ms, statement_timeout_ms, read_only)
    return engine


def _read_only_url(path: str) -> URL:
    """A SQLite URL opening ``path`` read-only (an SQLite URI filename: ``file:...?mode=ro``).

    In a directory we may not write, SQLite cannot create the WAL index (-shm) a
    WAL-mode file needs even for reading; ``immutable=1`` then reads the file as
    it is, which is right for inspecting a store nobody can be writing to there.
    """
    absolute = os.path.abspath(path)
    directory = os.path.dirname(absolute) or "."
    query = {"mode": "ro", "uri": "true"}
    if not os.access(directory, os.W_OK) and not os.path.exists(absolute + "-shm"):
        query["immutable"] = "1"
    return URL.create("sqlite", database="file:" + absolute, query=query)


def _install_pg_hooks(engine: Engine, lock_ms: int, statement_ms: int, read_only: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # SET (not connect options) so a user's own ?options=... in the URL still applies.
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"SET lock_timeout = {int(lock_ms)}")
            cursor.execute(f"SET statement_timeout = {int(statement_ms)}")
            if read_only:
                cursor.execute("SET default_transaction_read_only = on")
        finally:
            cursor.close()
        dbapi_connection.commit()


def _set_wal(cursor: Any, busy_ms: int) -> None:
    """Switch a fresh file to WAL, retrying while another opener converts it.

    SQLite answers "database is locked" at once, without its busy handler, when
    two connections switch a new file to WAL together (several consumers starting
    on an empty store); the switch is quick, so a bounded retry is enough.  A file
    already in WAL mode is left alone: asking again would need a write.
    """
    deadline = time.monotonic() + max(busy_ms, 1_000) / 1000.0
    while True:
        try:
            mode = cursor.execute("PRAGMA journal_mode").fetchone()
            if mode is not None and str(mode[0]).lower() == "wal":
                return
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _install_sqlite_hooks(engine: Engine, *, memory: bool, busy_ms: int, read_only: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from sqlite3 (see the module docstring); emit it in _on_begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
            if not memory and not read_only:
                # WAL lets the consumer read while the child writes.
                _set_wal(cursor, busy_ms)
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


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
        self._writer = engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
        self._url = mask_url(url)
        # An in-memory SQLite database is one shared connection: serialize its users.
        self._lock: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if _is_sqlite_memory(engine.url) else contextlib.nullcontext()
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
    from fastrecover.store import schema  # schema imports this module

    parsed = _normalize_url(url)
    create = create and not read_only
    path = _sqlite_file(parsed)
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


def _create_private_file(path: str, masked_url: str) -> None:
    """Create an empty SQLite file readable by its owner only (sqlite3 would use 0644 under umask 022)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return  # another opener was first; it created it the same way
    except OSError as exc:
        # Missing directory, no permission: sqlite3 reports it as the store being unavailable.
        log.debug("range store %s: cannot pre-create %s: %s", masked_url, path, exc.strerror)
        return
    os.close(fd)


def validate_url(url: str) -> None:
    """ConfigError (secrets masked) unless ``url`` is a store URL we can use; opens nothing."""
    _normalize_url(url)


#: Environment variable through which tools hand a store URL, secrets included, to child processes.
STORE_URL_ENV = "FASTRECOVER_STORE_URL"


def url_for_child(url: str) -> tuple[str, dict[str, str]]:
    """Split ``url`` into what may go on a child's command line and what must go in its environment.

    Command lines are visible to every user of the machine (``ps``), the
    environment is not.  The returned URL has its password and secret query
    parameters removed; the environment carries the full URL (as
    ``FASTRECOVER_STORE_URL``) and, for PostgreSQL, the password as
    ``PGPASSWORD``, which libpq uses when the URL has none.  So a child that
    only reads its ``--store-url`` still authenticates with a password-only URL.
    """
    if not has_secret(url):
        return url, {}
    env = {STORE_URL_ENV: url}
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return mask_url(url), env
    if parsed.password is not None and parsed.get_backend_name() == "postgresql":
        env["PGPASSWORD"] = str(parsed.password)
    query = {k: v for k, v in parsed.query.items() if not _SECRET_QUERY.match(f"?{k}=")}
    # URL.set(password=None) keeps the old password: build the URL anew.
    safe = URL.create(
        parsed.drivername,
        username=parsed.username,
        host=parsed.host,
        port=parsed.port,
        database=parsed.database,
        query=query,
    ).render_as_string(hide_password=False)
    if has_secret(safe):  # pragma: no cover - defensive: never hand out a secret on argv
        safe = mask_url(safe)
    return safe, env
