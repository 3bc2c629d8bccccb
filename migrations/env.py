"""Alembic environment of the fastrecover range store.

Run programmatically by ``fastrecover.store.schema`` (which passes an open
connection in ``config.attributes["connection"]`` so the migration shares its
transaction and lock), or by developers with ``alembic upgrade head`` using the
URL from alembic.ini, ``-x url=...`` or ``$FASTRECOVER_STORE_URL``.
"""

from __future__ import annotations

import os
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection

from fastrecover.store.models import VERSION_TABLE, metadata

config = context.config
target_metadata = metadata


def _options() -> dict[str, Any]:
    # Batch mode lets future migrations ALTER tables on SQLite (by copy-and-move).
    return {
        "target_metadata": target_metadata,
        "version_table": VERSION_TABLE,
        "render_as_batch": True,
        "compare_type": True,
    }


def _url() -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or config.get_main_option("sqlalchemy.url")
        or os.environ.get("FASTRECOVER_STORE_URL")
    )
    if not url:
        raise RuntimeError("no store URL: pass -x url=..., set sqlalchemy.url in alembic.ini or $FASTRECOVER_STORE_URL")
    return url


def _run(connection: Connection) -> None:
    context.configure(connection=connection, **_options())
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"}, **_options())
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from fastrecover.store.sql import build_engine  # same SQLite pragmas / driver choice as the store

    engine = build_engine(_url())
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
