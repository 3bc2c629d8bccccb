"""Persistent range tokens (the child consumer's commit log) in SQLite or PostgreSQL."""

from fastrecover.errors import InvalidValueError, StoreCorruptError, TokenNotFoundError
from fastrecover.store.engine import DEFAULT_LOCK_TIMEOUT_MS, DEFAULT_STATEMENT_TIMEOUT_MS, build_engine, mask_url
from fastrecover.store.schema import HEAD_REVISION, check_schema, current_revision, upgrade
from fastrecover.store.sql import RangeStore, open_store
from fastrecover.store.writes import CommitResult, ProgressUpdate

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
