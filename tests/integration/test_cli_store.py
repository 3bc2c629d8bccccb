"""``fastrecover db upgrade`` and ``fastrecover status`` against both real stores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastrecover.cli import main
from fastrecover.ranges import RangeProgress
from fastrecover.store import HEAD_REVISION, ProgressUpdate, open_store

REPO = Path(__file__).resolve().parents[2]


def _status_lines(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip()]


def test_db_upgrade_creates_and_is_idempotent(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade", "--store-url", store_url]) == 0
    assert f"schema revision {HEAD_REVISION} (head)" in capsys.readouterr().out
    assert main(["db", "upgrade", "--store-url", store_url]) == 0
    assert HEAD_REVISION in capsys.readouterr().out
    with open_store(store_url, create=False) as store:
        assert store.ranges() == []


def test_status_on_empty_store(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade", "--store-url", store_url]) == 0
    capsys.readouterr()
    assert main(["status", "--store-url", store_url]) == 0
    assert capsys.readouterr().out.startswith("no open ranges in ")


def test_status_lists_open_ranges_and_all(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with open_store(store_url) as store:
        busy = store.create_range("grp", "orders", 0, 100, 1100, "host-1")
        done = store.create_range("grp", "orders", 1, 0, 50, "host-1")
        other = store.create_range("other", "t", 2, 0, 10, None)
        store.commit_one(
            ProgressUpdate(busy.id, "host-1", 1, RangeProgress(100, 1100, 400, frozenset({500, 501})), skipped=7)
        )
        store.commit_one(ProgressUpdate(done.id, "host-1", 1, RangeProgress(0, 50, 50)))

    assert main(["status", "--store-url", store_url]) == 0
    captured = capsys.readouterr()
    rows = _status_lines(captured.out)
    header = rows[0]
    assert header == [
        "GROUP", "TOPIC", "PART", "ID", "RANGE", "COMMITTED", "PROGRESS", "REMAINING", "SKIPPED", "OWNER",
        "EPOCH", "STATE",
    ]  # fmt: skip
    # RANGE "[100, 1100)" splits into two words on whitespace
    assert rows[1] == ["grp", "orders", "0", str(busy.id), "[100,", "1100)", "400", "30.2%", "698", "7",
                       "host-1", "1", "open"]  # fmt: skip
    assert rows[2] == [
        "other",
        "t",
        "2",
        str(other.id),
        "[0,",
        "10)",
        "0",
        "0.0%",
        "10",
        "0",
        "-",
        "1",
        "open",
    ]
    assert "2 open ranges: 708 records left to backfill, 7 skipped" in captured.out
    assert str(done.id) not in [r[3] for r in rows[1:3]]

    assert main(["status", "--store-url", store_url, "--all", "--group", "grp"]) == 0
    rows = _status_lines(capsys.readouterr().out)
    assert [r[3] for r in rows[1:3]] == [str(busy.id), str(done.id)]
    assert rows[2][-1] == "done" and rows[2][7] == "100.0%"
    assert rows[-1][:5] == ["2", "ranges", "of", "group", "'grp'"]


def test_status_without_schema_names_the_upgrade_command(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--store-url", store_url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastrecover: error: ")
    assert "fastrecover db upgrade --store-url" in err
    assert "Traceback" not in err


def test_status_of_missing_sqlite_file_does_not_create_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "typo.db"
    assert main(["status", "--store-url", f"sqlite:///{path}"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not path.exists()


def test_unreachable_store_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade", "--store-url", "postgresql+psycopg://fr:pw@127.0.0.1:1/x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unavailable" in err and "pw@" not in err


def test_no_command_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: fastrecover" in capsys.readouterr().err


def test_python_dash_m_entry_point(store_url: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tools")])}
    up = subprocess.run(
        [sys.executable, "-m", "fastrecover", "db", "upgrade", "--store-url", store_url],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert HEAD_REVISION in up.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "fastrecover", "status", "--store-url", "postgresql+psycopg://x@127.0.0.1:1/x"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr and bad.stderr.startswith("fastrecover: error:")
