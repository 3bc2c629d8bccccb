"""Persistent range tokens (the child consumer's commit log) in SQLite or PostgreSQL.

Importing this package does not import SQLAlchemy (about a quarter of a second
here): a consumer with the mode off, and the data path's value types
(:mod:`fastrecover.store.updates`), never need it.  The names that do load on
first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fastrecover.errors import InvalidValueError, StoreCorruptError, TokenNotFoundError
from fastrecover.store.updates import CommitResult, ProgressUpdate

if TYPE_CHECKING:
    from fastrecover.store.engine import (
        DEFAULT_LOCK_TIMEOUT_MS,
        DEFAULT_STATEMENT_TIMEOUT_MS,
        build_engine,
        mask_url,
    )
    from fastrecover.store.schema import HEAD_REVISION, check_schema, current_revision, upgrade
    from fastrecover.store.sql import RangeStore, open_store

__all__ = [
    "DEFAULT_LOCK_TIMEOUT_MS",
    "DEFAULT_STATEMENT_TIMEOUT_MS",
    "HEAD_REVISION",
    "CommitResult",
    "InvalidValueError",
    "ProgressUpdate",
    "RangeStore",
    "StoreCorruptError",
    "TokenNotFoundError",
    "build_engine",
    "check_schema",
    "current_revision",
    "mask_url",
    "open_store",
    "upgrade",
]

#: Where each lazily loaded name lives.
_LAZY = {
    "DEFAULT_LOCK_TIMEOUT_MS": "engine",
    "DEFAULT_STATEMENT_TIMEOUT_MS": "engine",
    "build_engine": "engine",
    "mask_url": "engine",
    "HEAD_REVISION": "schema",
    "check_schema": "schema",
    "current_revision": "schema",
    "upgrade": "schema",
    "RangeStore": "sql",
    "open_store": "sql",
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value  # later lookups skip this function
    return value
