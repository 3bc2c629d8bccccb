"""Persistent range tokens (the child consumer's commit log) in SQLite or PostgreSQL."""

from fastrecover.store.schema import HEAD_REVISION, check_schema, current_revision, upgrade
from fastrecover.store.sql import (
    CommitResult,
    ProgressUpdate,
    RangeStore,
    TokenNotFoundError,
    build_engine,
    mask_url,
    open_store,
)

__all__ = [
    "HEAD_REVISION",
    "CommitResult",
    "ProgressUpdate",
    "RangeStore",
    "TokenNotFoundError",
    "build_engine",
    "check_schema",
    "current_revision",
    "mask_url",
    "open_store",
    "upgrade",
]
