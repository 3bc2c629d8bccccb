"""Engines for the range store: URLs, their secrets, timeouts, SQLite's BEGIN and driver errors.

Split from :mod:`fastrecover.store.sql` so the schema module (migrations) and the
Spark state store can build and guard engines without importing the store
itself: ``schema`` uses this module, ``sql`` uses both, and none imports back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import sys
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    InterfaceError,
    NoSuchModuleError,
    OperationalError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.pool import StaticPool

from fastrecover import secrets
from fastrecover.errors import ConfigError, StoreCorruptError, StoreError, StoreUnavailableError

log = logging.getLogger("fastrecover.store")

#: Execution option read by our SQLite "begin" hook: DEFERRED for reads, IMMEDIATE for writes.
BEGIN_OPTION = "fastrecover_sqlite_begin"
_PG_CONNECT_TIMEOUT_S = 10
#: Default wait for a row lock (PostgreSQL lock_timeout) or the write lock (SQLite busy timeout).
#: A consumer's poll() and commit() may wait this long on the store, never forever.
DEFAULT_LOCK_TIMEOUT_MS = 5_000
#: Default cap of one statement (PostgreSQL statement_timeout). 0 disables either timeout.
DEFAULT_STATEMENT_TIMEOUT_MS = 10_000
#: SQLite messages that mean "the file is not a usable database" (not "try again later").
_CORRUPT_MARKERS = ("file is not a database", "database disk image is malformed", "file is encrypted")


def mask_url(url: str | URL) -> str:
    """The URL with every secret replaced by ``***``, safe for messages, logs and files.

    The rules are :func:`fastrecover.secrets.mask_url`'s, shared with the
    configuration, Spark and the tools; this adds SQLAlchemy's ``URL`` objects,
    rendered with their password so that the one masker sees the real text.
    """
    text = url.render_as_string(hide_password=False) if isinstance(url, URL) else str(url)
    return secrets.mask_url(text)


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
    """The drivers' own "cannot connect" errors (raised raw from pool hooks).

    psycopg is looked up, never imported: SQLAlchemy loads it with a PostgreSQL
    engine, and a store on SQLite should not pay its import (~0.15 s).
    """
    psycopg = sys.modules.get("psycopg")
    if psycopg is None:
        return (sqlite3.OperationalError,)
    return (sqlite3.OperationalError, psycopg.OperationalError)


#: What "cannot talk to the database" looks like, wrapped by SQLAlchemy (plus :func:`_driver_errors`).
_UNAVAILABLE: tuple[type[BaseException], ...] = (OperationalError, InterfaceError, PoolTimeoutError)


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
    except Exception as exc:
        drivers = _driver_errors()
        if not isinstance(exc, _TRANSLATED + drivers):
            raise
        if _is_corrupt(exc):
            raise StoreCorruptError(
                f"range store {masked_url} is not a usable database while {action}: {_reason(exc)}"
            ) from exc
        if isinstance(exc, _UNAVAILABLE + drivers):
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


def normalize_url(url: str | URL) -> URL:
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


def is_sqlite_memory(url: URL) -> bool:
    return url.get_backend_name() == "sqlite" and (
        url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"
    )


def sqlite_file(url: URL) -> str | None:
    if url.get_backend_name() != "sqlite" or is_sqlite_memory(url) or url.database is None:
        return None
    if url.database.startswith("file:"):  # URI filenames: leave them to sqlite
        return None
    return url.database


def _uri_file(url: URL) -> str | None:
    """The file a SQLite URI filename (``file:/path?uri=true``) opens read-write; None for memory or read-only."""
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or not database.startswith("file:"):
        return None
    parts = urllib.parse.urlsplit(database)
    mode = urllib.parse.parse_qs(parts.query).get("mode", ["rwc"])[-1]
    if parts.netloc not in ("", "localhost") or mode not in ("rw", "rwc") or not parts.path:
        return None
    return urllib.parse.unquote(parts.path)


def _check_timeout(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 3_600_000:
        raise ConfigError(f"{name}: expected milliseconds in [0, 3600000], got {value!r}")
    return value


def _pg_socket_args(lock_timeout_ms: int, statement_timeout_ms: int) -> dict[str, int]:
    """libpq's own bounds on a network that stops answering (the server's timeouts never see it).

    TCP keepalives find a dead peer of an idle connection; ``tcp_user_timeout`` ends a connection
    whose sent bytes go unacknowledged for longer than a healthy transaction may take.
    """
    healthy_ms = lock_timeout_ms + (statement_timeout_ms or 30_000) + _PG_CONNECT_TIMEOUT_S * 1000
    return {
        "connect_timeout": _PG_CONNECT_TIMEOUT_S,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 3,
        "keepalives_count": 3,
        "tcp_user_timeout": int(healthy_ms),
    }


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
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    memory = is_sqlite_memory(parsed)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if backend == "sqlite":
        if memory:
            # One shared connection, else every pooled connection is a new empty database.
            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        else:
            path = sqlite_file(parsed)
            if read_only and path is not None:
                parsed = _read_only_url(path)
            elif path is not None and not os.path.exists(path):
                _create_private_file(path, mask_url(parsed))
            elif path is None and (uri_path := _uri_file(parsed)) is not None and not os.path.exists(uri_path):
                _create_private_file(uri_path, mask_url(parsed))  # a URI filename gets the same 0600 file
            kwargs["connect_args"] = {"timeout": lock_timeout_ms / 1000.0}
    elif backend == "postgresql":
        kwargs["connect_args"] = _pg_socket_args(lock_timeout_ms, statement_timeout_ms)
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
        mode = conn.get_execution_options().get(BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


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
    normalize_url(url)


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
    query = {k: v for k, v in parsed.query.items() if not secrets.is_secret_param(k)}
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
