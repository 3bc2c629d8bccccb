"""The store under a careless operator or a hostile peer: timeouts, file modes, read-only, corruption, BIGINT."""

from __future__ import annotations

import hashlib
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from fastrecover import Consumer
from fastrecover.cli import main
from fastrecover.errors import ConfigError, InvalidValueError, StoreCorruptError, StoreError, StoreUnavailableError
from fastrecover.ranges import RangeProgress
from fastrecover.store import ProgressUpdate, open_store, upgrade
from fastrecover.store.checks import BIGINT_MAX
from fastrecover.store.schema import _UPGRADE_LOCK_KEY, SchemaLockTimeoutError
from fastrecover_tools.testing.broker import produce
from tests.integration.helpers import parallel_config


def _cli(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---- SQLite files -------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["open_store", "db upgrade"])
def test_sqlite_files_are_private(tmp_path: Path, how: str) -> None:
    path = tmp_path / "ranges.db"
    url = f"sqlite:///{path}"
    if how == "open_store":
        with open_store(url) as store:
            store.create_range("g", "t", 0, 0, 10, "o")
    else:
        assert _cli(["db", "upgrade", "--store-url", url]) == 0
    for candidate in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if candidate.exists():
            assert _mode(candidate) & 0o077 == 0, f"{candidate.name} is {oct(_mode(candidate))}"


def test_status_is_read_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """status must not write: not the WAL switch, not a byte of the file."""
    path = tmp_path / "ranges.db"
    with open_store(f"sqlite:///{path}") as store:
        store.create_range("g\x1b[2J", "t", 0, 0, 10, "own\x07er")
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    assert _cli(["status", "--store-url", f"sqlite:///{path}", "--all"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "g\\x1b[2J" in out and "own\\x07er" in out
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert not Path(f"{path}-wal").exists()


def test_read_only_store_cannot_be_written(tmp_path: Path) -> None:
    path = tmp_path / "ranges.db"
    open_store(f"sqlite:///{path}").close()
    with open_store(f"sqlite:///{path}", read_only=True) as store:
        assert store.ranges() == []
        with pytest.raises(StoreError):
            store.create_range("g", "t", 0, 0, 10, "o")


def test_corrupt_sqlite_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ranges.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreCorruptError) as info:
        open_store(f"sqlite:///{path}")
    assert isinstance(info.value, StoreUnavailableError)  # the consumer degrades, as for an unreachable store
    assert _cli(["status", "--store-url", f"sqlite:///{path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastrecover: error:") and "not a usable database" in err
    assert len(err.strip().splitlines()) == 1


def test_consumer_on_a_corrupt_store_degrades_and_skips_nothing(
    bootstrap: str, topic_factory: Any, unique_group: str, tmp_path: Path
) -> None:
    path = tmp_path / "ranges.db"
    path.write_bytes(b"\x00garbage" * 500)
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(500)], partition=0)
    consumer = Consumer(parallel_config(bootstrap, unique_group, f"sqlite:///{path}"))
    got: set[int] = set()
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while got != set(range(500)) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.add(msg.offset() or 0)
    finally:
        consumer.close()
    assert got == set(range(500))


@pytest.mark.parametrize("query", ["timeout=abc", "timeout=-1", "timeout=nan", "check_same_thread=maybe"])
def test_bad_sqlite_url_parameters(tmp_path: Path, query: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}?{query}"
    with pytest.raises(ConfigError, match=query.split("=")[0]):
        open_store(url)
    assert _cli(["status", "--store-url", url]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and query.split("=")[0] in err


#: PostgreSQL-only behaviour (row locks, statement_timeout, advisory locks): its store_url only.
ONLY_PG = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)


# ---- bounded waits ------------------------------------------------------------------------------


def test_sqlite_busy_wait_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "ranges.db"
    with open_store(f"sqlite:///{path}") as store:
        token = store.create_range("g", "t", 0, 0, 10, "o")
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with open_store(f"sqlite:///{path}", lock_timeout_ms=300) as store:
            began = time.monotonic()
            with pytest.raises(StoreUnavailableError, match="locked"):
                store.claim(token.id, "other")
            assert time.monotonic() - began < 5
    finally:
        blocker.rollback()
        blocker.close()


@ONLY_PG
def test_postgresql_row_lock_wait_is_bounded(store_url: str) -> None:
    with open_store(store_url) as store:
        token = store.create_range("g", "t", 0, 0, 10, "o")
    holder = open_store(store_url)
    ready, release = threading.Event(), threading.Event()

    def hold() -> None:
        with holder.engine.begin() as conn:
            conn.execute(text("SELECT id FROM fastrecover_ranges WHERE id = :i FOR UPDATE"), {"i": token.id})
            ready.set()
            release.wait(30)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        with open_store(store_url, lock_timeout_ms=300) as store:
            began = time.monotonic()
            with pytest.raises(StoreError, match="lock timeout"):
                store.commit_one(ProgressUpdate(token.id, "o", token.epoch, RangeProgress(0, 10, 5)))
            assert time.monotonic() - began < 5
    finally:
        release.set()
        thread.join(10)
        holder.close()


@ONLY_PG
def test_postgresql_statement_timeout(store_url: str) -> None:
    with open_store(store_url, statement_timeout_ms=200) as store, store.engine.connect() as conn:
        began = time.monotonic()
        with pytest.raises(Exception, match="statement timeout"):
            conn.execute(text("SELECT pg_sleep(5)"))
        assert time.monotonic() - began < 3


@ONLY_PG
def test_upgrade_lock_wait_is_bounded(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    holder = open_store(store_url)
    try:
        with holder.engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _UPGRADE_LOCK_KEY})
            began = time.monotonic()
            with pytest.raises(SchemaLockTimeoutError, match="upgrade lock"):
                upgrade(store_url, lock_wait_s=0.5)
            assert time.monotonic() - began < 5
    finally:
        holder.close()


# ---- values the columns cannot hold ----------------------------------------------------------------


@pytest.mark.parametrize("end", [BIGINT_MAX + 1, 2**64, 10**30])
def test_offsets_above_bigint_are_refused_before_the_driver(store_url: str, end: int) -> None:
    with open_store(store_url) as store:
        with pytest.raises(InvalidValueError, match="what the store can hold"):
            store.create_range("g", "t", 0, 0, end, "o")
        token = store.create_range("g", "t", 0, 0, 10, "o")
        with pytest.raises(InvalidValueError):
            store.commit_progress([ProgressUpdate(token.id, "o", token.epoch, RangeProgress(0, end, end))])
        assert store.get(token.id).progress == RangeProgress(0, 10, 0)


@pytest.mark.parametrize(("what", "value"), [("group", "g" * 256), ("topic", "t" * 256), ("owner", "o" * 256)])
def test_names_longer_than_the_columns_are_refused(store_url: str, what: str, value: str) -> None:
    names = {"group": "g", "topic": "t", "owner": "o", what: value}
    with open_store(store_url) as store, pytest.raises(InvalidValueError, match="at most 255"):
        store.create_range(names["group"], names["topic"], 0, 0, 10, names["owner"])
