"""The demo's measurements: the lag at the restart and the crash → first fresh record time (no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastrecover_tools.demo import quickstart_args
from fastrecover_tools.demo_report import RESTARTED, Ledger, format_table, lag_at, measure


def test_lag_is_what_was_produced_after_the_commit_and_before_the_restart() -> None:
    acked = {(0, 0): 1000, (0, 1): 2000, (0, 2): 5000, (1, 0): 1500, (1, 1): 2500}
    assert lag_at(acked, {0: 1, 1: 0}, 3.0) == 3  # (0, 1), (1, 0), (1, 1); (0, 2) came after the restart
    assert lag_at(acked, {}, 10.0) == 5


def test_crash_to_fresh_is_counted_from_the_sigkill(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l")
    lines = [
        f"t 0 0 103500 100000 {RESTARTED} - -",  # the lag, delivered after the restart
        f"t 0 1 103800 103200 {RESTARTED} - -",  # the first fresh record: produced after the restart
    ]
    ledger.path.write_text("\n".join(lines) + "\n")
    acked = {(0, 0): 100_000, (0, 1): 103_200}
    r = measure(
        "plain", "c", ledger, acked, restart_wall=103.0, crash_wall=100.0, lag_at_restart=1, open_ranges_left=None
    )
    assert r.time_to_fresh_s == pytest.approx(0.8) and r.crash_to_fresh_s == pytest.approx(3.8)
    assert r.down_s == pytest.approx(3.0) and r.lost == 0
    table = format_table([r])
    assert "crash to the first fresh record" in table and "3.80 s" in table and "3.00 s" in table
    assert "time to the first fresh record" in table and "0.80 s" in table
    without = measure("plain", "c", ledger, acked, restart_wall=103.0, lag_at_restart=1, open_ranges_left=None)
    assert without.crash_to_fresh_s is None and "-" in format_table([without])


def test_demo_workers_use_the_quickstart_settings() -> None:
    assert quickstart_args("plain") == [
        *("--group-instance-id", "demo-plain-1", "--session-ms", "10000"),
        "--set=reconnect.backoff.ms=20",
    ]
