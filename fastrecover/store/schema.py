"""Schema versioning of the range store, driven by Alembic programmatically.

Why not ``metadata.create_all``: a store outlives library versions and is shared
by every consumer of a group, so its schema must evolve by explicit, ordered
migrations that an operator runs once (``fastrecover db upgrade``), never
implicitly by whichever consumer happens to start first.  The single exception
is a database with no fastrecover schema at all, which :func:`ensure_schema`
initialises so the embedded SQLite default works on first run.

The migrations live in ``migrations/`` at the repository root (editable
installs) and are force-included as ``fastrecover/_migrations`` in wheels.
Their version is kept in our own table, ``fastrecover_alembic_version``, so the
store can share a database with an application's own Alembic history.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine

from fastrecover.errors import SchemaBehindError, StoreError
from fastrecover.errors import SchemaLockTimeoutError as SchemaLockTimeoutError  # re-exported: it was defined here
from fastrecover.store.engine import BEGIN_OPTION, build_engine, mask_url, translate_errors
from fastrecover.store.models import TABLE_NAME, VERSION_TABLE

if TYPE_CHECKING:  # Alembic is imported only when a schema is created or migrated (import cost)
    from alembic.config import Config

log = logging.getLogger("fastrecover.store")

#: The revision this version of fastrecover reads and writes.
HEAD_REVISION = "0002"
#: pg_advisory_xact_lock key serializing concurrent upgrades ("fastrec" in ASCII).
_UPGRADE_LOCK_KEY = 0x66617374726563
#: How long an upgrade (or a first consumer creating the schema) waits for another one's lock.
UPGRADE_LOCK_WAIT_S = 30.0


def migrations_dir() -> Path:
    """Where the Alembic scripts are: inside the package (wheel) or the repo (editable)."""
    package = Path(__file__).resolve().parent.parent  # .../fastrecover
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise StoreError(
        f"fastrecover migrations not found (looked in {package / '_migrations'} and "
        f"{package.parent / 'migrations'}); the installation is incomplete"
    )


def alembic_config(*, url: str | None = None, connection: Connection | None = None) -> Config:
    """An in-memory Alembic Config; env.py uses ``connection`` when given, else ``url``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # ConfigParser interpolation
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade_command(url: str) -> str:
    """The exact command an operator runs to bring the store at ``url`` to head (password masked)."""
    return f"fastrecover db upgrade --store-url {shlex.quote(mask_url(url))}"


def _known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    return {rev.revision for rev in script.walk_revisions()}


def _read_revision(conn: Connection) -> str | None:
    # Read the version table directly: MigrationContext would log at INFO on every open.
    rows: list[Any] = list(conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars())
    if len(rows) > 1:
        raise StoreError(f"{VERSION_TABLE} holds several revisions {sorted(rows)}; fastrecover has one head")
    return str(rows[0]) if rows else None


def _snapshot(conn: Connection) -> Connection:
    """One snapshot for every read of the schema state.

    PostgreSQL's default READ COMMITTED gives each statement its own snapshot: a consumer creating
    the schema could commit between the two table lookups, and the reader would see the ranges
    table without the version table, an "unversioned" schema that does not exist. SQLite reads in
    one transaction see one snapshot already.
    """
    if conn.dialect.name == "postgresql":
        return conn.execution_options(isolation_level="REPEATABLE READ")
    return conn


def _state(conn: Connection) -> tuple[bool, bool, str | None]:
    """(version table exists, ranges table exists, recorded revision).

    Read it in one :func:`_snapshot`, or under the upgrade lock, which keeps creators out.
    """
    inspector = inspect(conn)
    has_version = inspector.has_table(VERSION_TABLE)
    has_table = inspector.has_table(TABLE_NAME)
    return has_version, has_table, _read_revision(conn) if has_version else None


def current_revision(engine: Engine) -> str | None:
    """The store's recorded schema revision, None when it has none."""
    with translate_errors(mask_url(engine.url), "reading the schema revision"), engine.connect() as conn:
        return _state(_snapshot(conn))[2]


def check_schema(engine: Engine, url: str) -> str | None:
    """HEAD_REVISION if the store is current, None if it has no fastrecover schema at all.

    Raises SchemaBehindError (naming the upgrade command) for an older or
    unversioned fastrecover schema, and StoreError for a revision this version
    does not know (written by a newer fastrecover), or an inconsistent one.
    """
    masked = mask_url(url)
    with translate_errors(masked, "checking the schema"), engine.connect() as conn:
        has_version, has_table, revision = _state(_snapshot(conn))
    if revision == HEAD_REVISION:
        if not has_table:
            raise StoreError(
                f"range store {masked} records schema revision {revision} but table {TABLE_NAME} "
                f"is missing; restore it, or drop {VERSION_TABLE} and run: {upgrade_command(url)}"
            )
        return revision
    if not has_version and not has_table:
        return None
    if revision is not None and revision not in _known_revisions():
        raise StoreError(
            f"range store {masked} has schema revision {revision!r}, unknown to this fastrecover "
            f"(head {HEAD_REVISION}); it was probably written by a newer "
            "fastrecover: upgrade the fastrecover package"
        )
    found = f"revision {revision}" if revision else "an unversioned fastrecover schema"
    raise SchemaBehindError(
        f"range store {masked} has {found} but this fastrecover needs revision {HEAD_REVISION}; "
        f"run: {upgrade_command(url)}"
    )


def ensure_schema(engine: Engine, url: str, *, create: bool) -> str:
    """Check the schema; initialise a database that has none when ``create`` is true."""
    revision = check_schema(engine, url)
    if revision is not None:
        return revision
    if not create:
        raise SchemaBehindError(f"range store {mask_url(url)} has no fastrecover schema; run: {upgrade_command(url)}")
    _upgrade_engine(engine, url, only_if_empty=True)
    revision = check_schema(engine, url)
    if revision is None:  # pragma: no cover - the upgrade just created it
        raise StoreError(f"range store {mask_url(url)}: schema creation did not take effect")
    return revision


def _advisory_lock(conn: Connection, masked: str, wait_s: float) -> None:
    """Take the upgrade lock, waiting at most ``wait_s``: an upgrade never blocks forever.

    pg_try_advisory_xact_lock in a loop rather than pg_advisory_xact_lock under a
    lock_timeout, so the error can say who to look for instead of a driver message.
    """
    deadline = time.monotonic() + wait_s
    while not conn.execute(text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": _UPGRADE_LOCK_KEY}).scalar_one():
        if time.monotonic() >= deadline:
            raise SchemaLockTimeoutError(
                f"range store {masked}: another schema upgrade (or consumer creating the schema) has held the "
                f"fastrecover upgrade lock (pg advisory lock {_UPGRADE_LOCK_KEY}) for more than {wait_s:g} s; "
                "wait for it to finish, or find it in pg_locks and end it, then retry"
            )
        time.sleep(0.1)


def _upgrade_engine(
    engine: Engine, url: str, *, only_if_empty: bool, lock_wait_s: float = UPGRADE_LOCK_WAIT_S
) -> str | None:
    """Run the migrations to head in one transaction, serialized against other upgraders.

    ``only_if_empty`` re-checks under the lock, so two consumers starting on a
    fresh database at once do not both try to create the table.
    """
    # imported before the write lock is taken: an import inside it would hold other openers up
    with _quiet_alembic(only_if_empty):  # importing alembic logs its plugins at INFO
        from alembic import command
        from alembic.util import CommandError

    masked = mask_url(url)
    writer = engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
    with translate_errors(masked, "upgrading the schema"), writer.begin() as conn:
        if conn.dialect.name == "postgresql":
            _advisory_lock(conn, masked, lock_wait_s)
        has_version, has_table, _ = _state(conn)
        if only_if_empty and (has_version or has_table):
            return _read_revision(conn)
        try:
            with _quiet_alembic(only_if_empty):
                command.upgrade(alembic_config(connection=conn), "head")
        except CommandError as exc:
            raise StoreError(f"cannot upgrade the schema of range store {masked}: {exc}") from exc
        revision = _read_revision(conn)
        if only_if_empty:
            log.info("created the fastrecover schema (revision %s) in range store %s", revision, masked)
        return revision


@contextlib.contextmanager
def _quiet_alembic(quiet: bool) -> Iterator[None]:
    """Alembic's INFO lines, a dozen per run, are for an operator's ``db upgrade``, not a consumer's start."""
    if not quiet:
        yield
        return
    alembic_log = logging.getLogger("alembic")
    level = alembic_log.level
    alembic_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        alembic_log.setLevel(level)


def upgrade(url: str, *, lock_wait_s: float = UPGRADE_LOCK_WAIT_S) -> str:
    """Bring the store at ``url`` to HEAD_REVISION (creating it if empty); returns the revision.

    Waits at most ``lock_wait_s`` for a concurrent upgrade (SchemaLockTimeoutError after).
    """
    engine = build_engine(url)
    try:
        revision = _upgrade_engine(engine, url, only_if_empty=False, lock_wait_s=lock_wait_s)
    finally:
        engine.dispose()
    if revision != HEAD_REVISION:
        raise StoreError(f"range store {mask_url(url)} is at revision {revision} after upgrade, not {HEAD_REVISION}")
    return revision
