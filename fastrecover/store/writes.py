"""The range store's write statements, run on a connection the caller's transaction holds.

:class:`~fastrecover.store.transactions.StoreTransactions` owns transactions and
thread safety, :class:`~fastrecover.store.sql.RangeStore` the public API; this
module owns what happens to the rows inside one write transaction.  Every write
that depends on what a row holds is *fenced*: it applies only while the caller's
``(owner, epoch)`` is still the row's, under the rows' locks, so a stale holder
that lost a range can never overwrite its successor's progress.  The fault points (:mod:`fastrecover.hooks`) fire here,
at the moment the locks are held and nothing is written yet.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

from sqlalchemy import bindparam, select, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from fastrecover import hooks
from fastrecover.codec import lineage_cluster
from fastrecover.completion_map import encode_completed
from fastrecover.ranges import RangeProgress
from fastrecover.store.checks import INT_MAX, check_int, check_name, check_progress
from fastrecover.store.models import LIVE, RANGES, merge_progress, token_from_row
from fastrecover.store.updates import CommitResult, ProgressUpdate
from fastrecover.tokens import Token, TokenState

#: The ranges table.
TABLE = RANGES
#: The natural key of a range (``uq_fastrecover_ranges_key``, among ranges not superseded): creating a
#: range is idempotent on it.
_KEY_COLUMNS = ("group_id", "topic", "partition", "start_offset", "cluster")
#: Values in one ``IN`` list, and keys per statement where a statement has three such lists.  SQLite
#: builds before 3.32 allow 999 bound parameters per statement (later ones 32,766, PostgreSQL
#: 65,535): without the cut, a recovery of a few hundred partitions on such a build failed, and so
#: did every later one (no fast recovery for that consumer, ever).
IN_CHUNK = 300

_T = TypeVar("_T")


def chunked(values: Sequence[_T], size: int = IN_CHUNK) -> Iterator[Sequence[_T]]:
    """``values`` in consecutive pieces of at most ``size`` (each one statement's ``IN`` list)."""
    for first in range(0, len(values), size):
        yield values[first : first + size]


def now() -> datetime:
    """The time stamp of a write (UTC: the store is shared across time zones)."""
    return datetime.now(timezone.utc)


def check_updates(updates: Sequence[ProgressUpdate]) -> None:
    """Refuse a malformed batch before its transaction starts, so nothing of it is written."""
    for u in updates:
        if not isinstance(u, ProgressUpdate) or not isinstance(u.progress, RangeProgress):
            raise ValueError(f"expected ProgressUpdate with a RangeProgress, got {u!r}")
        check_int("token id", u.token_id, 1)
        check_progress(f"range #{u.token_id}", u.progress)
        check_int(f"epoch of range #{u.token_id}", u.epoch, 0, INT_MAX)
        check_name(f"owner of range #{u.token_id}", u.owner)
        if u.skipped is not None:
            check_int(f"skipped of range #{u.token_id}", u.skipped)


def insert_ranges(
    conn: Connection,
    group: str,
    spans: Sequence[tuple[str, int, int, int]],
    owner: str | None,
    lineages: Mapping[tuple[str, int], str] | None = None,
) -> list[Mapping[Any, Any]]:
    """Insert new ranges at epoch 1 unless their keys exist; the rows as stored either way.

    Idempotent on the key so recovery can be re-run after a crash between deciding and
    recording.  An empty range (start == end) is inserted as already done.  The read back
    selects the cross product of the topics, partitions and starts asked for; the rows of
    other keys are dropped here, so each key asked for has exactly its own row.
    """
    stamp = now()
    named = lineages or {}
    rows = [
        _new_row(group, topic, partition, start, end, owner, named.get((topic, partition)), stamp)
        for topic, partition, start, end in spans
    ]
    _insert_ignore(conn, rows)
    hooks.fire("token-write")  # fault point: inserted, not yet committed
    out: list[Mapping[Any, Any]] = []
    keys = sorted({(r["topic"], r["partition"], r["start_offset"], r["cluster"]) for r in rows})
    for piece in chunked(keys):
        wanted = set(piece)
        found = conn.execute(
            select(TABLE).where(
                TABLE.c.group_id == group,
                TABLE.c.state != TokenState.SUPERSEDED.value,
                TABLE.c.topic.in_(sorted({k[0] for k in wanted})),
                TABLE.c.partition.in_(sorted({k[1] for k in wanted})),
                TABLE.c.start_offset.in_(sorted({k[2] for k in wanted})),
                TABLE.c.cluster.in_(sorted({k[3] for k in wanted})),
            )
        ).mappings()
        # the cross product may hold another piece's key: each key is taken from its own piece only
        out.extend(
            row for row in found if (row["topic"], row["partition"], row["start_offset"], row["cluster"]) in wanted
        )
    return out


def _new_row(
    group: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    owner: str | None,
    lineage: str | None,
    stamp: datetime,
) -> dict[str, Any]:
    done = start == end
    return {
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
        "created_at": stamp,
        "updated_at": stamp,
        "finished_at": stamp if done else None,
        "lineage": lineage,
        "cluster": "" if lineage is None else lineage_cluster(lineage),
    }


def _insert_ignore(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert each row unless one with the same key exists (ON CONFLICT DO NOTHING where the dialect has it)."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert  # loaded with a PostgreSQL engine anyway

        pg_stmt = pg_insert(TABLE).on_conflict_do_nothing(index_elements=list(_KEY_COLUMNS), index_where=LIVE)
        conn.execute(pg_stmt, list(rows))
    elif dialect == "sqlite":
        lite_stmt = sqlite_insert(TABLE).on_conflict_do_nothing(index_elements=list(_KEY_COLUMNS), index_where=LIVE)
        conn.execute(lite_stmt, list(rows))
    else:
        for values in rows:
            try:
                with conn.begin_nested():
                    conn.execute(TABLE.insert().values(**values))
            except IntegrityError:
                pass  # the row exists; the caller reads it back


# The statements of the hot write path, built once: building a Core expression per call cost more
# Python time than SQLite needed to run it (profiled: ~half of a progress commit's CPU).
_LOCKED_ROWS = (
    select(TABLE).where(TABLE.c.id.in_(bindparam("ids", expanding=True))).order_by(TABLE.c.id).with_for_update()
)
_WRITE_PROGRESS = (
    update(TABLE)
    .where(
        TABLE.c.id == bindparam("b_id"),
        TABLE.c.owner == bindparam("b_owner"),
        TABLE.c.epoch == bindparam("b_epoch"),
        TABLE.c.state == TokenState.OPEN.value,
    )
    .values(
        committed_offset=bindparam("b_committed"),
        completed=bindparam("b_completed"),
        skipped=bindparam("b_skipped"),
        state=bindparam("b_state"),
        updated_at=bindparam("b_updated"),
        finished_at=bindparam("b_finished"),
    )
)


def locked_rows(conn: Connection, ids: Sequence[int]) -> dict[int, Mapping[Any, Any]]:
    """The rows with these ids, locked until the transaction ends; missing ids are absent."""
    # FOR UPDATE in id order (PostgreSQL, pieces in ascending order too) so concurrent batches cannot
    # deadlock; SQLite ignores it and is already serialized by BEGIN IMMEDIATE.
    return {
        int(r["id"]): r
        for piece in chunked(sorted(set(ids)))
        for r in conn.execute(_LOCKED_ROWS, {"ids": list(piece)}).mappings()
    }


def claim_rows(conn: Connection, ids: Sequence[int], owner: str) -> tuple[list[Token], int]:
    """Bump the epoch of the open ranges among ``ids`` and make ``owner`` their holder.

    Returns the tokens as now stored (done ones unchanged, missing ids left out), in id
    order, and how many were claimed.  A corrupt row raises CorruptTokenError before
    anything is written: a corrupt range must not be handed out.
    """
    rows = locked_rows(conn, ids)
    hooks.fire("claim")  # fault point: row locks held, nothing written yet
    open_ids = [i for i in sorted(rows) if token_from_row(rows[i]).is_open]
    stamp = now()
    for piece in chunked(open_ids):
        conn.execute(
            update(TABLE)
            .where(TABLE.c.id.in_(piece), TABLE.c.state == TokenState.OPEN.value)
            .values(epoch=TABLE.c.epoch + 1, owner=owner, updated_at=stamp)
        )
    if not rows:
        return [], 0
    fresh = [
        token_from_row(r)
        for piece in chunked(sorted(rows))
        for r in conn.execute(select(TABLE).where(TABLE.c.id.in_(piece))).mappings()
    ]
    return sorted(fresh, key=lambda t: t.id), len(open_ids)


def retire_rows(conn: Connection, ids: Sequence[int]) -> int:
    """Mark the ranges ``ids`` superseded (open or done); returns how many rows changed.

    The epoch moves too, so a member still holding one of them is fenced at its next
    write, and the row stays for audit.  Superseded is final.
    """
    stamp = now()
    changed = 0
    for piece in chunked(sorted(set(ids))):
        changed += conn.execute(
            update(TABLE)
            .where(TABLE.c.id.in_(piece), TABLE.c.state != TokenState.SUPERSEDED.value)
            .values(state=TokenState.SUPERSEDED.value, epoch=TABLE.c.epoch + 1, updated_at=stamp)
        ).rowcount
    return changed


def adopt_rows(conn: Connection, ids: Sequence[int], lineage: str) -> None:
    """Make ``lineage`` vouch for the ranges ``ids`` (ranges a recovery kept from another lineage)."""
    stamp = now()
    for piece in chunked(sorted(set(ids))):
        conn.execute(
            update(TABLE)
            .where(TABLE.c.id.in_(piece), TABLE.c.state != TokenState.SUPERSEDED.value)
            .values(lineage=lineage, cluster=lineage_cluster(lineage), updated_at=stamp)
        )


def apply_progress(conn: Connection, updates: Sequence[ProgressUpdate]) -> CommitResult:
    """Write a checked batch of progress; a fenced update is reported in the result, not raised.

    The stored offset never moves backwards: a stale (re-ordered) update is merged
    into what is stored.  An update whose range does not match the stored one is a
    caller bug: ValueError, which rolls the caller's transaction back.
    """
    result = CommitResult()
    rows = locked_rows(conn, [u.token_id for u in updates])
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
        stamp = now()
        res = conn.execute(
            _WRITE_PROGRESS,
            {
                "b_id": u.token_id,
                "b_owner": u.owner,
                "b_epoch": u.epoch,
                "b_committed": merged.committed,
                "b_completed": encode_completed(merged.committed, merged.completed),
                "b_skipped": skipped,
                "b_state": after.state.value,
                "b_updated": stamp,
                "b_finished": stamp if not after.is_open else None,
            },
        )
        if res.rowcount != 1:  # only possible without row locks (other dialects)
            result.fenced.append(u.token_id)
            continue
        current[u.token_id] = after
        result.tokens.append(after)
    return result
