"""The range store against real databases: a SQLite file and PostgreSQL.

Every test runs on both backends (the ``store_url`` fixture), because the
properties that matter here (one transaction per batch, fencing, row locking,
transactional schema creation) are exactly where the two differ.
"""

from __future__ import annotations

import logging
import re
import socket
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Engine, make_url

from fastrecover.completion_map import encode_completed
from fastrecover.errors import (
    CorruptTokenError,
    FencedError,
    SchemaBehindError,
    StoreError,
    StoreUnavailableError,
)
from fastrecover.ranges import RangeProgress
from fastrecover.store import (
    HEAD_REVISION,
    ProgressUpdate,
    RangeStore,
    TokenNotFoundError,
    build_engine,
    current_revision,
    open_store,
    upgrade,
)
from fastrecover.store.models import VERSION_TABLE, metadata
from fastrecover.store.schema import alembic_config, check_schema
from fastrecover.tokens import TokenState

GROUP = "g1"
TOPIC = "orders"
#: sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER (Python 3.11+; SQLite's own constant, 9)
_SQLITE_LIMIT_VARIABLE_NUMBER = getattr(sqlite3, "SQLITE_LIMIT_VARIABLE_NUMBER", 9)

_CHECKS = (
    "ck_fastrecover_ranges_start_nonneg",
    "ck_fastrecover_ranges_committed_in_range",
    "ck_fastrecover_ranges_state_known",
)


@pytest.fixture
def raw(store: RangeStore) -> Iterator[Engine]:
    """A second engine on the same database, for what the store must never do itself."""
    engine = build_engine(store.engine.url.render_as_string(hide_password=False))
    yield engine
    engine.dispose()


def _insert_raw(engine: Engine, **values: Any) -> int:
    """Insert a row bypassing the check constraints, as a hand edit or old bug could."""
    row: dict[str, Any] = {
        "group_id": GROUP,
        "topic": TOPIC,
        "partition": 0,
        "start_offset": 0,
        "end_offset": 10,
        "committed_offset": 0,
        "completed": "",
        "skipped": 0,
        "owner": "w",
        "epoch": 1,
        "state": "open",
    }
    row.update(values)
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
        else:
            for name in _CHECKS:
                conn.exec_driver_sql(f"ALTER TABLE fastrecover_ranges DROP CONSTRAINT IF EXISTS {name}")
        columns = ", ".join(f'"{c}"' for c in row)
        params = ", ".join(f":{c}" for c in row)
        return int(
            conn.execute(
                sa.text(f"INSERT INTO fastrecover_ranges ({columns}) VALUES ({params}) RETURNING id"), row
            ).scalar_one()
        )


def _raw_row(engine: Engine, token_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(
            conn.execute(sa.text("SELECT * FROM fastrecover_ranges WHERE id = :i"), {"i": token_id}).mappings().one()
        )


def _row_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM fastrecover_ranges")).scalar_one())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- schema ---------------------------------------------------------------------


def test_open_store_creates_schema_in_empty_database(store_url: str) -> None:
    with open_store(store_url) as store:
        assert current_revision(store.engine) == HEAD_REVISION
        assert store.ranges() == []
    with open_store(store_url, create=False) as again:  # already at head: no upgrade needed
        assert current_revision(again.engine) == HEAD_REVISION


def test_models_match_head_migration(store: RangeStore) -> None:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diffs = [
            d
            for d in compare_metadata(context, metadata)
            if not (d[0] == "remove_table" and d[1].name == VERSION_TABLE)
        ]
    assert diffs == []


def test_empty_database_without_create_is_refused(store_url: str) -> None:
    with pytest.raises(SchemaBehindError, match="fastrecover db upgrade --store-url"):
        open_store(store_url, create=False)


def test_unversioned_table_is_schema_behind(store_url: str) -> None:
    engine = build_engine(store_url)
    try:
        with engine.begin() as conn:
            metadata.create_all(conn)  # the table, but no fastrecover_alembic_version
    finally:
        engine.dispose()
    with pytest.raises(SchemaBehindError) as info:
        open_store(store_url)
    masked = make_url(store_url).render_as_string(hide_password=True)
    assert f"fastrecover db upgrade --store-url {masked}" in str(info.value).replace("'", "")


def test_downgraded_schema_is_behind_until_upgraded(store_url: str) -> None:
    open_store(store_url).close()
    engine = build_engine(store_url)
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(connection=conn), "base")
            conn.exec_driver_sql("CREATE TABLE unrelated_app_table (x INTEGER)")
        assert current_revision(engine) is None
    finally:
        engine.dispose()
    with pytest.raises(SchemaBehindError, match=r"run: fastrecover db upgrade --store-url"):
        open_store(store_url)
    assert upgrade(store_url) == HEAD_REVISION
    with open_store(store_url) as store:
        assert store.create_range(GROUP, TOPIC, 0, 0, 5, "w").is_open


def test_unknown_newer_revision_is_refused(store: RangeStore, raw: Engine, store_url: str) -> None:
    with raw.begin() as conn:
        conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    with pytest.raises(StoreError, match=r"9999.*newer") as info:
        open_store(store_url)
    assert not isinstance(info.value, SchemaBehindError)


def test_concurrent_first_open_creates_schema_once(store_url: str) -> None:
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def opener() -> None:
        try:
            barrier.wait()
            open_store(store_url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    engine = build_engine(store_url)
    try:
        assert current_revision(engine) == HEAD_REVISION
    finally:
        engine.dispose()


def test_a_schema_created_between_two_reads_of_the_check_is_never_seen_half_made(store_url: str) -> None:
    """CI failure: one of four concurrent first opens on PostgreSQL raised SchemaBehindError.

    The check read "version table exists?" and "ranges table exists?" in two statements; under READ
    COMMITTED another opener's creation committed between them, and the store looked unversioned.
    Here the creator's transaction commits right after the check's first statement.
    """
    creator = build_engine(store_url)
    checker = build_engine(store_url)
    conn = creator.connect()
    creation = conn.begin()
    command.upgrade(alembic_config(connection=conn), "head")  # the whole schema, not committed yet
    statements = 0

    def commit_after_the_first(*_args: Any) -> None:
        nonlocal statements
        statements += 1
        if statements == 1:
            creation.commit()

    sa.event.listen(checker, "after_cursor_execute", commit_after_the_first)
    try:
        # a consistent answer is "no schema yet" (None) or the head revision; never "behind"
        assert check_schema(checker, store_url) in (None, HEAD_REVISION)
        assert statements > 1, "the check must have read after the creation committed"
        assert check_schema(checker, store_url) == HEAD_REVISION
    finally:
        if creation.is_active:
            creation.rollback()
        conn.close()
        creator.dispose()
        checker.dispose()


# -- unavailable ----------------------------------------------------------------


def test_postgresql_closed_port_is_unavailable() -> None:
    url = f"postgresql+psycopg://fastrecover:s3cret@127.0.0.1:{_closed_port()}/postgres"
    with pytest.raises(StoreUnavailableError) as info:
        open_store(url)
    message = str(info.value)
    assert "s3cret" not in message
    assert "fastrecover:***@127.0.0.1" in message
    assert "\n" not in message
    assert info.value.__cause__ is not None


def test_sqlite_in_missing_directory_is_unavailable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'store.db'}"
    with pytest.raises(StoreUnavailableError, match="unable to open database file") as info:
        open_store(url)
    assert info.value.__cause__ is not None


def test_missing_sqlite_file_is_not_created_without_create(tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    with pytest.raises(SchemaBehindError, match=r"does not exist.*fastrecover db upgrade"):
        open_store(f"sqlite:///{path}", create=False)
    assert not path.exists()


def test_losing_the_server_mid_session_is_unavailable(pg_url: str, pg_admin_engine: Engine) -> None:
    """Any call, not only open_store, turns a lost connection into StoreUnavailableError."""
    name = f"fr_test_gone_{uuid.uuid4().hex[:12]}"
    with pg_admin_engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        store = open_store(make_url(pg_url).set(database=name).render_as_string(hide_password=False))
        token = store.create_range(GROUP, TOPIC, 0, 0, 10, "w")
        with pg_admin_engine.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            conn.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
        with pytest.raises(StoreUnavailableError) as info:
            store.get(token.id)
        assert info.value.__cause__ is not None
        with pytest.raises(StoreUnavailableError):
            store.commit_progress([ProgressUpdate(token.id, "w", 1, RangeProgress(0, 10, 5))])
        store.close()
    finally:
        with pg_admin_engine.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- create ---------------------------------------------------------------------


def test_create_range_inserts_open_token(store: RangeStore, raw: Engine) -> None:
    token = store.create_range(GROUP, TOPIC, 3, 100, 250, "worker-a")
    assert token.id > 0
    assert (token.group, token.topic, token.partition) == (GROUP, TOPIC, 3)
    assert token.progress == RangeProgress(100, 250, 100)
    assert (token.owner, token.epoch, token.state, token.skipped) == ("worker-a", 1, TokenState.OPEN, 0)
    assert store.get(token.id) == token
    row = _raw_row(raw, token.id)
    assert row["created_at"] is not None and row["finished_at"] is None


def test_create_range_is_idempotent(store: RangeStore) -> None:
    first = store.create_range(GROUP, TOPIC, 0, 10, 20, "a")
    again = store.create_range(GROUP, TOPIC, 0, 10, 20, "b")
    assert again == first  # existing row returned, owner not changed
    other = store.create_range(GROUP, TOPIC, 1, 10, 20, "a")
    assert other.id != first.id
    store.commit_one(ProgressUpdate(first.id, "a", 1, RangeProgress(10, 20, 20)))
    done = store.create_range(GROUP, TOPIC, 0, 10, 20, "a")
    assert done.id == first.id and done.state is TokenState.DONE
    assert len(store.ranges()) == 2


def test_create_empty_range_is_done(store: RangeStore) -> None:
    token = store.create_range(GROUP, TOPIC, 0, 7, 7, "a")
    assert token.state is TokenState.DONE
    assert store.open_ranges(GROUP) == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((GROUP, TOPIC, 0, 20, 10, "a"), "end 10 < start 20"),
        ((GROUP, TOPIC, 0, -1, 10, "a"), "start must be an integer >= 0, got -1"),
        ((GROUP, TOPIC, -2, 0, 10, "a"), "partition must be an integer >= 0, got -2"),
        (("", TOPIC, 0, 0, 10, "a"), "group must be a non-empty string"),
        ((GROUP, "t" * 256, 0, 0, 10, "a"), "topic must be a non-empty string"),
    ],
)
def test_create_range_rejects_bad_input(store: RangeStore, raw: Engine, args: tuple[Any, ...], needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        store.create_range(*args)
    assert _row_count(raw) == 0


# -- claim / release ------------------------------------------------------------


def test_claim_bumps_epoch_and_fences_previous_holder(store: RangeStore) -> None:
    token = store.create_range(GROUP, TOPIC, 0, 0, 100, "a")
    b = store.claim(token.id, "b")
    assert (b.owner, b.epoch) == ("b", 2)
    c = store.claim(token.id, "c")
    assert (c.owner, c.epoch) == ("c", 3)
    result = store.commit_progress([ProgressUpdate(token.id, "b", 2, RangeProgress(0, 100, 50))])
    assert result.fenced == [token.id] and result.tokens == []
    assert store.get(token.id) == c


def test_claim_of_done_token_returns_it_unchanged(store: RangeStore) -> None:
    token = store.create_range(GROUP, TOPIC, 0, 0, 10, "a")
    done = store.commit_one(ProgressUpdate(token.id, "a", 1, RangeProgress(0, 10, 10)))
    assert store.claim(token.id, "b") == done
    assert store.get(token.id).owner == "a"


def test_claim_of_missing_token(store: RangeStore) -> None:
    with pytest.raises(TokenNotFoundError, match="#4242"):
        store.claim(4242, "a")
    with pytest.raises(TokenNotFoundError):
        store.get(4242)


def test_release_only_by_current_holder(store: RangeStore) -> None:
    token = store.create_range(GROUP, TOPIC, 0, 0, 10, "a")
    assert store.release(token.id, "a", 2) is False
    assert store.release(token.id, "b", 1) is False
    assert store.get(token.id).owner == "a"
    assert store.release(token.id, "a", 1) is True
    released = store.get(token.id)
    assert released.owner is None and released.epoch == 1 and released.is_open
    fenced = store.commit_progress([ProgressUpdate(token.id, "a", 1, RangeProgress(0, 10, 5))])
    assert fenced.fenced == [token.id]
    assert store.claim(token.id, "b").epoch == 2


# -- commit ---------------------------------------------------------------------


def test_commit_progress_batch(store: RangeStore) -> None:
    t1 = store.create_range(GROUP, TOPIC, 0, 0, 100, "a")
    t2 = store.create_range(GROUP, TOPIC, 1, 50, 60, "a")
    p1 = RangeProgress(0, 100, 40, frozenset({42, 43, 90}))
    p2 = RangeProgress(50, 60, 55)
    result = store.commit_progress([ProgressUpdate(t1.id, "a", 1, p1), ProgressUpdate(t2.id, "a", 1, p2, skipped=3)])
    assert result.fenced == []
    assert [t.progress for t in result.tokens] == [p1, p2]
    assert store.get(t1.id).progress == p1
    assert store.get(t2.id).progress == p2 and store.get(t2.id).skipped == 3
    assert store.commit_progress([]).tokens == []


def test_commit_batch_is_one_transaction(store: RangeStore) -> None:
    good = store.create_range(GROUP, TOPIC, 0, 0, 100, "a")
    other = store.create_range(GROUP, TOPIC, 1, 0, 100, "a")
    with pytest.raises(ValueError, match=rf"range #{other.id} covers \[0, 50\).*stored range is \[0, 100\)"):
        store.commit_progress(
            [
                ProgressUpdate(good.id, "a", 1, RangeProgress(0, 100, 60)),
                ProgressUpdate(other.id, "a", 1, RangeProgress(0, 50, 10)),
            ]
        )
    assert store.get(good.id) == good  # the first update was rolled back with the batch
    assert store.get(other.id) == other


def test_fenced_updates_do_not_abort_the_batch(store: RangeStore) -> None:
    mine = store.create_range(GROUP, TOPIC, 0, 0, 100, "a")
    lost = store.create_range(GROUP, TOPIC, 1, 0, 100, "a")
    taken = store.claim(lost.id, "b")
    result = store.commit_progress(
        [
            ProgressUpdate(lost.id, "a", 1, RangeProgress(0, 100, 70)),
            ProgressUpdate(mine.id, "a", 1, RangeProgress(0, 100, 30)),
            ProgressUpdate(999_999, "a", 1, RangeProgress(0, 100, 30)),
        ]
    )
    assert result.fenced == [lost.id, 999_999]
    assert [t.id for t in result.tokens] == [mine.id]
    assert store.get(mine.id).progress.committed == 30
    assert store.get(lost.id) == taken


def test_commit_one_raises_fenced_naming_both_holders(store: RangeStore) -> None:
    token = store.create_range(GROUP, TOPIC, 0, 0, 100, "a")
    store.claim(token.id, "b")
    before = store.get(token.id)
    with pytest.raises(FencedError) as info:
        store.commit_one(ProgressUpdate(token.id, "a", 1, RangeProgress(0, 100, 99)))
    message = str(info.value)
    assert f"#{token.id}" in message
    assert "owner='a' epoch=1" in message and "owner='b' epoch=2" in message
    assert store.get(token.id) == before


def test_committed_never_moves_backwards(store: RangeStore) -> None:
    token = store.create_range(GROUP, TOPIC, 0, 0, 100, "a")
    store.commit_one(ProgressUpdate(token.id, "a", 1, RangeProgress(0, 100, 50, frozenset({60}))))
    stale = store.commit_one(ProgressUpdate(token.id, "a", 1, RangeProgress(0, 100, 20, frozenset({70}))))
    assert stale.progress == RangeProgress(0, 100, 50, frozenset({60, 70}))
    assert store.get(token.id).progress == stale.progress
    lower_skip = store.commit_one(ProgressUpdate(token.id, "a", 1, RangeProgress(0, 100, 50), skipped=0))
    assert lower_skip.skipped == 0
    store.commit_one(ProgressUpdate(token.id, "a", 1, RangeProgress(0, 100, 55), skipped=4))
    kept = store.commit_one(ProgressUpdate(token.id, "a", 1, RangeProgress(0, 100, 56), skipped=None))
    assert kept.skipped == 4
    assert store.commit_one(ProgressUpdate(token.id, "a", 1, RangeProgress(0, 100, 57), skipped=1)).skipped == 4


def test_done_transition(store: RangeStore, raw: Engine) -> None:
    token = store.create_range(GROUP, TOPIC, 0, 10, 20, "a")
    other = store.create_range(GROUP, TOPIC, 0, 30, 40, "a")
    done = store.commit_one(ProgressUpdate(token.id, "a", 1, RangeProgress(10, 20, 20)))
    assert done.state is TokenState.DONE and done.progress.done
    assert _raw_row(raw, token.id)["finished_at"] is not None
    assert [t.id for t in store.open_ranges(GROUP)] == [other.id]
    assert [t.id for t in store.ranges(GROUP, include_done=False)] == [other.id]
    assert {t.id for t in store.ranges()} == {token.id, other.id}
    again = store.commit_progress([ProgressUpdate(token.id, "a", 1, RangeProgress(10, 20, 20))])
    assert again.fenced == [token.id]


@pytest.mark.parametrize(
    ("update", "needle"),
    [
        (ProgressUpdate(1, "a", -1, RangeProgress(0, 10, 5)), "epoch of range #1"),
        (ProgressUpdate(1, "", 1, RangeProgress(0, 10, 5)), "owner of range #1"),
        (ProgressUpdate(1, "a", 1, RangeProgress(0, 10, 5), skipped=-3), "skipped of range #1"),
    ],
)
def test_commit_rejects_bad_input(store: RangeStore, update: ProgressUpdate, needle: str) -> None:
    token = store.create_range(GROUP, TOPIC, 0, 0, 10, "a")
    assert token.id == 1
    with pytest.raises(ValueError, match=needle):
        store.commit_progress([ProgressUpdate(token.id, "a", 1, RangeProgress(0, 10, 3)), update])
    assert store.get(token.id) == token


def test_open_ranges_filters(store: RangeStore) -> None:
    a = store.create_range(GROUP, TOPIC, 0, 100, 200, "a")
    b = store.create_range(GROUP, TOPIC, 0, 0, 50, "a")
    c = store.create_range(GROUP, TOPIC, 1, 0, 50, "a")
    d = store.create_range(GROUP, "other", 0, 0, 50, "a")
    store.create_range("g2", TOPIC, 0, 0, 50, "a")
    assert [t.id for t in store.open_ranges(GROUP)] == [b.id, a.id, c.id, d.id]  # orders < other
    assert [t.id for t in store.open_ranges(GROUP, TOPIC)] == [b.id, a.id, c.id]
    assert [t.id for t in store.open_ranges(GROUP, TOPIC, 0)] == [b.id, a.id]
    assert len(store.ranges()) == 5 and len(store.ranges("g2")) == 1


# -- corrupt rows -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "field", "value"),
    [
        ({"start_offset": 50, "end_offset": 10, "committed_offset": 10}, "end_offset", "10"),
        ({"committed_offset": 11}, "committed_offset", "11"),
        ({"start_offset": 5, "committed_offset": 4}, "committed_offset", "4"),
        ({"completed": "1bnot-base64!!"}, "completed", "'1bnot-base64!!'"),
        ({"completed": encode_completed(0, [30])}, "completed", "'"),  # offset 30 beyond end 10
        ({"state": "zombie"}, "state", "'zombie'"),
    ],
    ids=[
        "end-below-start",
        "committed-above-end",
        "committed-below-start",
        "garbage-map",
        "map-past-end",
        "unknown-state",
    ],
)
def test_corrupt_rows_are_refused_by_name(
    store: RangeStore,
    raw: Engine,
    caplog: pytest.LogCaptureFixture,
    values: dict[str, Any],
    field: str,
    value: str,
) -> None:
    good = store.create_range(GROUP, TOPIC, 1, 0, 100, "a")
    bad_id = _insert_raw(raw, **values)
    with pytest.raises(CorruptTokenError) as info:
        store.get(bad_id)
    message = str(info.value)
    assert f"row id={bad_id}" in message and f"field {field}={value}" in message
    with pytest.raises(CorruptTokenError, match=f"row id={bad_id}"):
        store.ranges(GROUP)
    if values.get("state", "open") == "open":
        with pytest.raises(CorruptTokenError, match=f"row id={bad_id}"):
            store.open_ranges(GROUP)
    with pytest.raises(CorruptTokenError):
        store.claim(bad_id, "b")
    with pytest.raises(CorruptTokenError):
        store.commit_progress(
            [
                ProgressUpdate(good.id, "a", 1, RangeProgress(0, 100, 10)),
                ProgressUpdate(bad_id, "w", 1, RangeProgress(0, 10, 5)),
            ]
        )
    assert store.get(good.id) == good  # nothing of that batch was written
    with caplog.at_level(logging.ERROR, logger="fastrecover.store"):
        assert store.open_ranges(GROUP, skip_corrupt=True) == [good]
        assert store.ranges(GROUP, skip_corrupt=True) == [good]
    assert any(f"row id={bad_id}" in r.getMessage() for r in caplog.records)
    assert _raw_row(raw, bad_id)["epoch"] == 1  # the refused claim did not touch it


# -- threads ------------------------------------------------------------------------


def test_concurrent_commits_from_two_threads(store: RangeStore) -> None:
    size = 120
    tokens = [store.create_range(GROUP, TOPIC, p, 0, size, f"w{p}") for p in range(2)]
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        token = tokens[index]
        try:
            barrier.wait()
            progress = token.progress
            for offset in range(size):
                progress = progress.mark_done([offset])
                result = store.commit_progress([ProgressUpdate(token.id, token.owner or "", 1, progress)])
                assert result.fenced == []
                store.open_ranges(GROUP)  # readers interleave with the other thread's writes
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert all(store.get(t.id).state is TokenState.DONE for t in tokens)


def test_racing_claims_leave_exactly_one_holder(store: RangeStore) -> None:
    token = store.create_range(GROUP, TOPIC, 0, 0, 100, "origin")
    claimed = threading.Barrier(2)
    outcomes: dict[str, tuple[int, list[int]]] = {}
    errors: list[BaseException] = []

    def contender(name: str) -> None:
        try:
            mine = store.claim(token.id, name)
            claimed.wait()  # both claims are in before either commits
            result = store.commit_progress([ProgressUpdate(token.id, name, mine.epoch, RangeProgress(0, 100, 10))])
            outcomes[name] = (mine.epoch, result.fenced)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=contender, args=(n,)) for n in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(epoch for epoch, _ in outcomes.values()) == [2, 3]
    winner = next(n for n, (epoch, _) in outcomes.items() if epoch == 3)
    loser = next(n for n in outcomes if n != winner)
    assert outcomes[winner][1] == [] and outcomes[loser][1] == [token.id]
    final = store.get(token.id)
    assert (final.owner, final.epoch, final.progress.committed) == (winner, 3, 10)


def test_partition_ranges_returns_open_and_done_ranges_of_one_partition(store: RangeStore) -> None:
    done = store.create_range("g", "t", 0, 0, 10, "me")
    store.commit_one(ProgressUpdate(done.id, "me", done.epoch, RangeProgress(0, 10, 10)))
    store.create_range("g", "t", 0, 10, 20, "me")
    store.create_range("g", "t", 0, 30, 40, "me")
    store.create_range("g", "t", 1, 0, 50, "me")
    store.create_range("other", "t", 0, 0, 50, "me")
    every = store.partition_ranges("g", "t", 0)
    assert [(t.span.start, t.span.end, t.is_open) for t in every] == [(0, 10, False), (10, 20, True), (30, 40, True)]
    later = store.partition_ranges("g", "t", 0, ending_after=10)
    assert [(t.span.start, t.span.end) for t in later] == [(10, 20), (30, 40)]


# -- the batched calls of recovery --------------------------------------------------


def test_create_ranges_is_create_range_for_many_keys_in_one_call(store: RangeStore, raw: Engine) -> None:
    existing = store.create_range(GROUP, TOPIC, 1, 10, 99, "other")  # a concurrent writer's range, other end
    spans = [(TOPIC, 0, 10, 20), (TOPIC, 1, 10, 20), (TOPIC, 1, 30, 30), ("payments", 0, 10, 15)]
    made = store.create_ranges(GROUP, spans, "me")
    assert sorted(made) == sorted((t, p, s) for t, p, s, _ in spans)
    assert made[(TOPIC, 1, 10)] == existing  # kept, as create_range keeps it
    assert made[(TOPIC, 0, 10)].progress == RangeProgress(10, 20, 10) and made[(TOPIC, 0, 10)].owner == "me"
    assert made[(TOPIC, 1, 30)].state is TokenState.DONE  # empty: done at once
    assert made[("payments", 0, 10)].progress.end == 15
    # the cross product of what was asked (payments[1], orders[0] at 30, ...) is not invented
    assert _row_count(raw) == 4
    assert store.create_ranges(GROUP, spans, "someone-else") == made  # idempotent: the stored rows again
    for token in made.values():
        same_key = (GROUP, token.topic, token.partition, token.progress.start, token.progress.end + 1, None)
        assert store.create_range(*same_key) == token  # one row per key, whichever call made it
    assert store.create_ranges(GROUP, [], "me") == {}


@pytest.mark.parametrize(
    ("spans", "needle"),
    [
        ([(TOPIC, 0, 0, 10), (TOPIC, 1, 20, 10)], "end 10 < start 20"),
        ([(TOPIC, 0, -1, 10)], "start must be an integer >= 0, got -1"),
        ([(TOPIC, -2, 0, 10)], "partition must be an integer >= 0, got -2"),
        ([("t" * 256, 0, 0, 10)], "topic must be a non-empty string"),
    ],
)
def test_create_ranges_rejects_a_bad_span_and_writes_none(
    store: RangeStore, raw: Engine, spans: list[tuple[Any, ...]], needle: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        store.create_ranges(GROUP, spans, "me")
    assert _row_count(raw) == 0


def test_partitions_ranges_reads_each_partition_with_its_own_floor(store: RangeStore) -> None:
    done = store.create_range("g", "t", 0, 0, 10, "me")
    store.commit_one(ProgressUpdate(done.id, "me", done.epoch, RangeProgress(0, 10, 10)))
    store.create_range("g", "t", 0, 10, 20, "me")
    store.create_range("g", "t", 0, 30, 40, "me")
    low = store.create_range("g", "t", 1, 0, 5, "me")  # open below its partition's floor: still returned
    old = store.create_range("g", "t", 1, 5, 8, "me")
    store.commit_one(ProgressUpdate(old.id, "me", old.epoch, RangeProgress(5, 8, 8)))
    store.create_range("g", "u", 0, 0, 50, "me")
    store.create_range("g", "u", 1, 0, 50, "me")  # u[1] is not asked for (cross product of topics and partitions)
    store.create_range("other", "t", 0, 0, 50, "me")
    cases: list[tuple[dict[tuple[str, int], int | None], dict[tuple[str, int], list[tuple[int, int]]]]] = [
        (
            {("t", 0): 10, ("t", 1): 20, ("u", 0): 0},
            {("t", 0): [(10, 20), (30, 40)], ("t", 1): [(0, 5)], ("u", 0): [(0, 50)]},
        ),
        (
            {("t", 0): None, ("t", 1): 6, ("u", 0): 60},
            {("t", 0): [(0, 10), (10, 20), (30, 40)], ("t", 1): [(0, 5), (5, 8)], ("u", 0): [(0, 50)]},
        ),
        ({("t", 0): 0, ("t", 2): 0}, {("t", 0): [(0, 10), (10, 20), (30, 40)], ("t", 2): []}),
    ]
    for floors, expected in cases:
        answer = store.partitions_ranges("g", floors)
        assert {key: [(t.span.start, t.span.end) for t in tokens] for key, tokens in answer.items()} == expected
        assert all(t.group == "g" for tokens in answer.values() for t in tokens)
    assert low in store.partitions_ranges("g", {("t", 1): 20})[("t", 1)]
    assert store.partitions_ranges("g", {}) == {}


def test_many_partitions_fit_the_bound_parameter_limit_of_old_sqlite_builds(store: RangeStore) -> None:
    """SQLite builds before 3.32 allow 999 bound parameters per statement (Python linked to an old
    system SQLite has them).  Recovery reads and writes every partition it was given in a few
    statements, so their IN lists are cut into pieces: 1,350 partitions of three topics (450 each, so
    pieces straddle topics and the topic x partition cross product of one piece names keys of another)
    go through every statement with a list of ids or keys, on SQLite with that old limit in force."""
    if store.engine.dialect.name == "sqlite":

        @sa.event.listens_for(store.engine, "connect")
        def _old_limit(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.setlimit(_SQLITE_LIMIT_VARIABLE_NUMBER, 999)

        store.engine.dispose()  # every connection from here on has the old limit
        with store.engine.connect() as conn, pytest.raises(sa.exc.OperationalError, match="too many SQL variables"):
            conn.execute(
                sa.text("SELECT 1 WHERE 1 IN (" + ",".join(f":p{i}" for i in range(1000)) + ")"),
                {f"p{i}": i for i in range(1000)},
            )
    keys = [(f"t{t}", p) for t in range(3) for p in range(450)]
    spans = [(topic, partition, 10 * partition, 10 * partition + 5) for topic, partition in keys]
    created = store.create_ranges(GROUP, spans, "a")
    assert sorted(created) == sorted((topic, partition, start) for topic, partition, start, _ in spans)
    assert all(t.progress.end == t.progress.start + 5 and t.is_open for t in created.values())

    floors = {key: (None if key[1] % 2 else 0) for key in keys}
    found = store.partitions_ranges(GROUP, floors)
    assert sorted(found) == sorted(keys)
    assert all([t.id for t in found[key]] == [created[(key[0], key[1], 10 * key[1])].id] for key in keys)

    ids = sorted(t.id for t in created.values())
    claimed = store.claim_many(ids, "b")
    assert [t.id for t in claimed] == ids
    assert all(t.owner == "b" and t.epoch == 2 for t in claimed)

    result = store.commit_progress(
        [
            ProgressUpdate(t.id, "b", 2, RangeProgress(t.progress.start, t.progress.end, t.progress.start + 2))
            for t in claimed
        ]
    )
    assert result.fenced == [] and len(result.tokens) == len(ids)
    assert all(t.progress.committed == t.progress.start + 2 for t in result.tokens)

    assert store.delete_open(GROUP, ids) == len(ids)
    assert store.open_ranges(GROUP) == []
