"""Fault 5: the range store becomes unreachable during a recovery and during backfill commits.

* SQLite deleted (and its path made unusable) during a recovery: the recovery degrades to the plain
  consumer's behaviour with a clear warning; once the store is back, empty, the commit-metadata mirror
  restores the ranges it lost;
* SQLite locked (an exclusive transaction held by another connection) during backfill commits: the
  commits fail loudly and are retried;
* PostgreSQL refusing connections (the database closed to connections, its backends terminated) during
  a recovery and during backfill commits.

Every variant ends with the checker's verdict: nothing lost.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine, make_url

from fastrecover.store import open_store
from fastrecover_tools.chaos.driver import ChaosDriver, WorkerProc
from fastrecover_tools.testing.waiting import wait_for
from tests.faults.conftest import GROUP_PROTOCOLS, SCRIPTED, DriverFactory, verdict_ok

pytestmark = pytest.mark.faults

QUIET = {"stall_share": 0.0, "fail_child_share": 0.0}


def _lag(driver: ChaosDriver, records: int) -> None:
    producer = driver.producer
    assert producer is not None
    target = producer.acked + records
    wait_for(lambda: producer.acked >= target, 60, 0.1, f"{records} more records produced")


def _first_run(driver: ChaosDriver) -> None:
    """A first incarnation commits some progress and is killed; the lag then builds up."""
    driver.start(spawn=False)
    driver.spawn(0, faults=False, extra=["--commit", "sync"])
    wait_for(lambda: driver.finished_by(0, 0) >= 150, 60, 0.1, "the first incarnation to finish 150 records")
    driver.kill(0)


def _degraded(proc: WorkerProc) -> bool:
    return any(e.get("degraded") for e in proc.count("recovery"))


def _store_failed(proc: WorkerProc) -> bool:
    return any("StoreUnavailableError" in str(e.get("error")) for e in proc.count("commit-failed"))


def _log(driver: ChaosDriver, proc: WorkerProc) -> str:
    return (driver.workdir / "logs" / f"{proc.name.replace('#', '-')}.log").read_text(errors="replace")


def _finishes_after(driver: ChaosDriver, since_ms: int) -> None:
    wait_for(lambda: driver.finished_by(0, since_ms) > 0, 60, 0.1, "the member to keep finishing records")


@pytest.mark.parametrize("group_protocol", GROUP_PROTOCOLS)
def test_sqlite_deleted_during_recovery_degrades_then_mirror_restores(
    chaos_driver: DriverFactory, tmp_path: Path, group_protocol: str
) -> None:
    db = tmp_path / "ranges.db"
    driver = chaos_driver(
        **SCRIPTED,
        rate=150.0,
        store_url=f"sqlite:///{db}",
        group_protocol=group_protocol,
        **QUIET,
    )
    _first_run(driver)
    _lag(driver, 450)
    # incarnation 2 opens ranges and is SIGKILLed mid-range (they are in the store and in the mirror)
    second = driver.spawn(
        0, faults=False, extra=["--commit", "message", "--stall-at", "backfill", "--stall-after", "30"]
    )
    wait_for(lambda: second.has("stalled"), 60, 0.05, "the second incarnation to stall mid-range")
    driver.kill(0)
    with open_store(f"sqlite:///{db}") as store:
        lost_ranges = store.open_ranges(driver.group)
        old_ids = max(t.id for t in store.ranges())
    assert lost_ranges
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.mkdir()  # the store's path cannot be opened: unreachable
    _lag(driver, 300)

    third = driver.spawn(0, faults=False, extra=["--commit", "sync"])
    wait_for(lambda: _degraded(third), 60, 0.05, "a degraded recovery")
    _finishes_after(driver, int(time.time() * 1000))
    text = _log(driver, third)
    assert "range store unavailable" in text and "nothing lost" in text, text[-3000:]
    driver.kill(0)

    db.rmdir()  # the store answers again, empty: the ranges survive only in the commit metadata
    # A new store numbers its tokens from 1 again, and (id, epoch) is what the checker's fencing
    # check tells ranges apart by: use up the old ids elsewhere so the check keeps its meaning.
    with open_store(f"sqlite:///{db}") as store:
        for i in range(old_ids):
            store.create_range("id-padding", "none", 0, i, i + 1, None)
    fourth = driver.spawn(0, faults=False, extra=["--commit", "sync"])
    wait_for(
        lambda: (
            any(e.get("new_ranges") or e.get("resumed") for e in fourth.count("recovery"))
            or "commit-metadata mirror" in _log(driver, fourth)
        ),
        60,
        0.1,
        "the fourth incarnation to recover",
    )
    result = driver.finish()
    table = verdict_ok(result)
    assert result.verdict.ok, table
    assert "from the commit-metadata mirror" in _log(driver, fourth), _log(driver, fourth)[-3000:]
    with open_store(f"sqlite:///{db}") as store:
        restored = store.ranges(driver.group)
    for old in lost_ranges:
        assert any(
            t.key == old.key and t.span.start <= old.progress.committed and t.span.end == old.span.end for t in restored
        ), f"{old.describe()} not restored: {[t.describe() for t in restored]}"


@pytest.mark.parametrize("group_protocol", GROUP_PROTOCOLS)
def test_sqlite_locked_during_backfill_commits_fails_loudly_and_retries(
    chaos_driver: DriverFactory, tmp_path: Path, group_protocol: str
) -> None:
    db = tmp_path / "ranges.db"
    driver = chaos_driver(
        **SCRIPTED,
        rate=300.0,
        store_url=f"sqlite:///{db}",
        group_protocol=group_protocol,
        **QUIET,
    )
    _first_run(driver)
    _lag(driver, 1500)
    second = driver.spawn(0, faults=False, extra=["--commit", "sync", "--commit-every", "20", "--work-us", "2000"])
    wait_for(lambda: any(e.get("new_ranges") for e in second.count("recovery")), 60, 0.05, "ranges to open")
    lock = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        lock.execute("BEGIN EXCLUSIVE")  # another connection holds the write lock
        wait_for(lambda: _store_failed(second), 120, 0.1, "a backfill commit to fail on the locked store")
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    _finishes_after(driver, int(time.time() * 1000))
    text = _log(driver, second)
    assert "database is locked" in text and "kept for retry" in text, text[-3000:]
    result = driver.finish()
    table = verdict_ok(result)
    assert result.verdict.ok, table
    assert result.commit_failures["StoreUnavailableError"] >= 1, table


@pytest.fixture
def pg_store(pg_url: str, pg_admin_engine: Engine) -> Iterator[tuple[str, str]]:
    """(url, database name) of a throwaway PostgreSQL database we may close to connections."""
    name = f"fr_fault_{uuid.uuid4().hex[:12]}"
    with pg_admin_engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(pg_url).set(database=name).render_as_string(hide_password=False), name
    finally:
        with pg_admin_engine.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _pg_reachable(admin: Engine, name: str, reachable: bool) -> None:
    with admin.connect() as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if reachable else "false"}')
        if not reachable:
            conn.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")


@pytest.mark.parametrize("group_protocol", GROUP_PROTOCOLS)
def test_postgresql_unreachable_during_recovery_and_backfill_commits(
    chaos_driver: DriverFactory, pg_store: tuple[str, str], pg_admin_engine: Engine, group_protocol: str
) -> None:
    url, name = pg_store
    driver = chaos_driver(
        **SCRIPTED,
        rate=300.0,
        store_url=url,
        group_protocol=group_protocol,
        **QUIET,
    )
    _first_run(driver)
    _lag(driver, 600)

    _pg_reachable(pg_admin_engine, name, False)
    try:
        second = driver.spawn(0, faults=False, extra=["--commit", "sync"])
        wait_for(lambda: _degraded(second), 60, 0.05, "a degraded recovery")
        _finishes_after(driver, int(time.time() * 1000))
    finally:
        _pg_reachable(pg_admin_engine, name, True)
    text = _log(driver, second)
    assert "range store unavailable" in text and "nothing lost" in text, text[-3000:]
    driver.kill(0)
    _lag(driver, 1500)

    third = driver.spawn(0, faults=False, extra=["--commit", "sync", "--commit-every", "20", "--work-us", "2000"])
    wait_for(lambda: any(e.get("new_ranges") for e in third.count("recovery")), 60, 0.05, "ranges to open")
    _pg_reachable(pg_admin_engine, name, False)
    try:
        wait_for(lambda: _store_failed(third), 60, 0.1, "a backfill commit to fail on the closed database")
    finally:
        _pg_reachable(pg_admin_engine, name, True)
    _finishes_after(driver, int(time.time() * 1000))
    assert "kept for retry" in _log(driver, third)
    result = driver.finish()
    table = verdict_ok(result)
    assert result.verdict.ok, table
    assert result.degraded_recoveries >= 1 and result.commit_failures["StoreUnavailableError"] >= 1, table
