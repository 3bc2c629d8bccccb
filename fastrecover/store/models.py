"""The persisted shape of a range token, and the checks applied when reading one.

The table is the child's "second commit log" of KIP-333: one row per backfill
range.  The schema itself is owned by the Alembic migrations under
``migrations/``; this table definition must stay identical to what the head
migration creates (the integration tests compare them).  Rows are validated on
every read because a store can be edited by hand or by a buggy older version,
and a silently wrong range could make the child skip records.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)

from fastrecover.codec import check_lineage
from fastrecover.completion_map import decode_completed
from fastrecover.errors import CodecError, CorruptTokenError
from fastrecover.ranges import RangeProgress
from fastrecover.tokens import Token, TokenState

TABLE_NAME = "fastrecover_ranges"
#: Our own Alembic version table, so the store can share a database with an
#: application that runs its own Alembic migrations.
VERSION_TABLE = "fastrecover_alembic_version"
NAME_MAX = 255

#: Deterministic constraint names keep migrations portable across dialects.
NAMING_CONVENTION: dict[str, str] = {
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "pk": "pk_%(table_name)s",
}

#: The rows the natural key is unique among: every range but the superseded ones.
LIVE = text("state <> 'superseded'")

#: SQLite only auto-increments an ``INTEGER PRIMARY KEY``; BIGINT there would not.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")

#: SQLAlchemy Core only: the ORM would add ~0.13 s to every consumer's start (its import), and the
#: store never maps rows to objects (rows become :class:`~fastrecover.tokens.Token` in ``token_from_row``).
metadata = MetaData(naming_convention=NAMING_CONVENTION)

#: One backfill range of one partition of one consumer group.
RANGES = Table(
    TABLE_NAME,
    metadata,
    Column("id", BigIntPK, primary_key=True, autoincrement=True),
    Column("group_id", String(NAME_MAX), nullable=False),
    Column("topic", String(NAME_MAX), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("start_offset", BigInteger, nullable=False),
    Column("end_offset", BigInteger, nullable=False),
    Column("committed_offset", BigInteger, nullable=False),
    Column("completed", Text, nullable=False, default="", server_default=""),
    Column("skipped", BigInteger, nullable=False, default=0, server_default="0"),
    Column("owner", String(NAME_MAX), nullable=True),
    Column("epoch", Integer, nullable=False, default=0, server_default="0"),
    Column("state", String(16), nullable=False, default="open", server_default="open"),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=text("CURRENT_TIMESTAMP")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=text("CURRENT_TIMESTAMP")),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("lineage", String(NAME_MAX), nullable=True),
    # the cluster of the lineage ('' for ranges written before lineages, or by Spark's query groups)
    Column("cluster", String(NAME_MAX), nullable=False, default="", server_default=""),
    Index("ix_fastrecover_ranges_group_state", "group_id", "state"),
    # A superseded range keeps its row for audit, and a new range may start where it started; two
    # clusters sharing the store (same group and topic names) each keep their own ranges.
    Index(
        "uq_fastrecover_ranges_key",
        "group_id",
        "topic",
        "partition",
        "start_offset",
        "cluster",
        unique=True,
        sqlite_where=LIVE,
        postgresql_where=LIVE,
    ),
    CheckConstraint("start_offset >= 0", name="start_nonneg"),
    CheckConstraint("start_offset <= committed_offset AND committed_offset <= end_offset", name="committed_in_range"),
    CheckConstraint("state IN ('open', 'done', 'superseded')", name="state_known"),
)


def _corrupt(row_id: object, field: str, value: object, why: str) -> CorruptTokenError:
    return CorruptTokenError(f"range token row id={row_id}: field {field}={value!r} is invalid: {why}")


def token_from_row(row: Mapping[Any, Any]) -> Token:
    """Turn a ``fastrecover_ranges`` row mapping into a Token, or refuse loudly.

    Raises CorruptTokenError naming the row id, the field and the value, so an
    operator can find and repair exactly that row; the codec's own error is kept
    as the cause.
    """
    row_id = row["id"]
    for name in ("group_id", "topic"):
        if not isinstance(row[name], str) or not row[name]:
            raise _corrupt(row_id, name, row[name], "must be a non-empty string")
    ints = ("partition", "start_offset", "end_offset", "committed_offset", "skipped", "epoch")
    for name in ints:
        if not isinstance(row[name], int) or isinstance(row[name], bool):
            raise _corrupt(row_id, name, row[name], "must be an integer")
    start, end, committed = row["start_offset"], row["end_offset"], row["committed_offset"]
    try:
        state = TokenState(row["state"])
    except ValueError:
        raise _corrupt(row_id, "state", row["state"], "must be 'open', 'done' or 'superseded'") from None
    if row["partition"] < 0:
        raise _corrupt(row_id, "partition", row["partition"], "must be >= 0")
    if start < 0:
        raise _corrupt(row_id, "start_offset", start, "must be >= 0")
    if end < start:
        raise _corrupt(row_id, "end_offset", end, f"is below start_offset {start}")
    if not start <= committed <= end:
        raise _corrupt(row_id, "committed_offset", committed, f"is outside [{start}, {end}]")
    if state is TokenState.DONE and committed != end:
        raise _corrupt(row_id, "state", state.value, f"is done but committed_offset {committed} < {end}")
    for name in ("skipped", "epoch"):
        if row[name] < 0:
            raise _corrupt(row_id, name, row[name], "must be >= 0")
    text_value = row["completed"]
    if text_value is None:
        text_value = ""
    if not isinstance(text_value, str):
        raise _corrupt(row_id, "completed", text_value, "must be text")
    try:
        completed = decode_completed(committed, text_value, end=end)
        progress = RangeProgress(start, end, committed, completed)
    except CodecError as exc:
        raise _corrupt(row_id, "completed", _clip(text_value), str(exc)) from exc
    except ValueError as exc:
        raise _corrupt(row_id, "completed", _clip(text_value), str(exc)) from exc
    owner = row["owner"]
    if owner is not None and not isinstance(owner, str):
        raise _corrupt(row_id, "owner", owner, "must be text or NULL")
    lineage = row.get("lineage")
    if lineage is not None:
        try:
            check_lineage(lineage)
        except (ValueError, TypeError, AttributeError):
            raise _corrupt(row_id, "lineage", lineage, "must be NULL or <cluster id>/<16 hex digits>") from None
    return Token(
        id=int(row_id),
        group=row["group_id"],
        topic=row["topic"],
        partition=row["partition"],
        progress=progress,
        skipped=row["skipped"],
        owner=owner,
        epoch=row["epoch"],
        state=state,
        lineage=lineage,
    )


def _clip(value: str, limit: int = 48) -> str:
    return value if len(value) <= limit else value[:limit] + "..."


def merge_progress(stored: RangeProgress, new: RangeProgress) -> RangeProgress:
    """Combine a stored progress with an incoming one without ever losing ground.

    The one with the higher committed offset wins, and the out-of-order
    completions of the other are kept too (a finished offset stays finished);
    so a re-ordered, stale commit can only add information, never move the
    committed offset backwards.  Both must describe the same range.
    """
    if (stored.start, stored.end) != (new.start, new.end):
        raise ValueError(f"cannot merge progress of [{new.start}, {new.end}) into range [{stored.start}, {stored.end})")
    ahead, behind = (new, stored) if new.committed >= stored.committed else (stored, new)
    return ahead.mark_done(behind.completed)
