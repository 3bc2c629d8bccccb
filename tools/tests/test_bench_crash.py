"""The crash runs' pure parts: settings per setup, the timeline, the summary, the table and the goals of issue 31."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from fastrecover.errors import ConfigError
from fastrecover_tools.bench import command
from fastrecover_tools.bench.crash import SETUPS, setup_config, timeline
from fastrecover_tools.bench.report import (
    Stat,
    crash_goals,
    crash_table,
    evaluate_goals,
    failed_cells,
    format_report,
    noisy_cells,
)
from fastrecover_tools.bench.run import FULL, QUICK, BenchOptions, crash_cells, summarize_crash_cell
from fastrecover_tools.bench.worker import drop_classic_only, extra_config


def _options(*argv: str) -> BenchOptions:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    opts = command.options_from_args(parser.parse_args(list(argv)), ["bench", *argv])
    assert isinstance(opts, BenchOptions)
    return opts


def test_setups_cover_defaults_static_and_kip848() -> None:
    assert list(SETUPS) == ["default", "static", "kip848", "kip848-static"]
    assert setup_config("default", "m") == {}
    assert setup_config("static", "m") == {
        "session.timeout.ms": "10000",
        "reconnect.backoff.ms": "20",
        "group.instance.id": "m",
    }
    assert setup_config("kip848", "m") == {"group.protocol": "consumer"}
    assert setup_config("kip848-static", "m") == {"group.protocol": "consumer", "group.instance.id": "m"}
    assert SETUPS["kip848-static"].kip848 and not SETUPS["static"].kip848


def test_worker_set_items_and_classic_only_keys() -> None:
    assert extra_config(["group.protocol=consumer", " a = b "]) == {"group.protocol": "consumer", "a": "b"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        extra_config(["novalue"])
    classic = {"session.timeout.ms": "10000", "group.instance.id": "m"}
    assert drop_classic_only(classic) == classic
    assert drop_classic_only({**classic, "group.protocol": "consumer"}) == {
        "group.instance.id": "m",
        "group.protocol": "consumer",
    }


def test_timeline_from_events() -> None:
    crash = 1000.0
    events = [
        {"event": "imported", "t": 1003.15},
        {"event": "started", "t": 1003.2},
        {"event": "subscribed", "t": 1003.21},
        {"event": "joined", "t": 1003.3},
        {"event": "joined", "t": 1009.0},  # a second assignment: the first one counts
        {"event": "assigned", "t": 1003.35},
        {"event": "fresh", "t": 1003.5, "cpu": 0.07},
        {"event": "fresh", "t": 1003.6, "cpu": 0.09},  # a later one: the first counts
    ]
    t = timeline(events, crash, spawned=1003.0, down_s=3.0)
    assert t["spawn_to_fresh_cpu_s"] == pytest.approx(0.07)
    assert t["crash_to_fresh_s"] == pytest.approx(3.5)
    assert t["spawn_to_fresh_s"] == pytest.approx(0.5)
    assert t["first_spawn_to_fresh_s"] == pytest.approx(0.5)
    assert t["imported_s"] == pytest.approx(0.15) and t["started_s"] == pytest.approx(0.2)
    assert t["join_s"] == pytest.approx(0.3) and t["recovery_s"] == pytest.approx(0.05)
    assert t["joined_to_fresh_s"] == pytest.approx(0.2)
    # restarted after fatal errors: spawn→fresh is the last process's, first_spawn→fresh the whole wait
    late = timeline(events, crash, spawned=1003.4, down_s=3.0)
    assert late["spawn_to_fresh_s"] == pytest.approx(0.1) and late["first_spawn_to_fresh_s"] == pytest.approx(0.5)
    missing = timeline([{"event": "started", "t": 1003.2}], crash, 1003.0, 3.0)
    assert missing["crash_to_fresh_s"] is None and missing["recovery_s"] is None
    assert missing["spawn_to_fresh_cpu_s"] is None


def test_crash_options_defaults_overrides_and_errors() -> None:
    opts = _options()
    assert opts.sizes.crash_lags == FULL.crash_lags == [1_000, 10_000]
    assert opts.crash.setups == list(SETUPS) and opts.crash.down_s == 3.0 and opts.crash.repeats is None
    assert opts.crash.kip848_session_ms == 45_000 and "crash" in opts.only
    assert crash_cells(opts) == [(s, lag) for s in SETUPS for lag in (1_000, 10_000)]
    assert _options("--quick").sizes.crash_lags == QUICK.crash_lags
    opts = _options(
        "--crash-lags", "1000,10_000_000", "--crash-setups", "static", "--crash-down", "0", "--crash-repeats", "5"
    )
    assert crash_cells(opts) == [("static", 1_000), ("static", 10_000_000)]
    assert opts.crash.down_s == 0 and opts.crash.repeats == 5
    for argv, needle in (
        (["--crash-setups", "static,nope"], "nope"),
        (["--crash-down", "-1"], "--crash-down"),
        (["--crash-timeout", "0"], "--crash-timeout"),
        (["--kip848-session-ms", "-5"], "--kip848-session-ms"),
    ):
        with pytest.raises(ConfigError, match=needle):
            _options(*argv)


def _run(crash_s: float, spawn_s: float, fatal: int = 0) -> dict[str, Any]:
    # the interpreter's start and the shared imports take 0.15 s of spawn→fresh; the rest is the client's own
    run: dict[str, Any] = {"crash_to_fresh_s": crash_s, "spawn_to_fresh_s": spawn_s, "lag": 1000}
    run["client_s"] = round(spawn_s - 0.15, 6)
    if fatal:
        run["fatal_after_s"] = [3.1 + i for i in range(fatal)]
        run["fatal_error"] = "UNRELEASED_INSTANCE_ID"
    return run


def _crash_result(fast_crash: tuple[float, ...] = (3.4, 3.45, 3.5)) -> dict[str, Any]:
    plain = [_run(3.2, 0.2), _run(3.25, 0.22), _run(3.3, 0.21)]
    fast = [_run(c, c - 3.0) for c in fast_crash]
    static = {**summarize_crash_cell(plain, fast), "lag": 1000}
    kip = summarize_crash_cell([_run(45.0, 0.3, fatal=30)], [{"error": "TimeoutError: no fresh record"}])
    return {
        "crash": {
            "cells": {"static": {"1000": static}, "kip848-static": {"1000": {**kip, "lag": 1000}}},
            "setups": {"static": SETUPS["static"].label, "kip848-static": SETUPS["kip848-static"].label},
            "down_s": 3.0,
            "repeats": 3,
            "respawn_delay_s": 1.0,
            "kip848_group": {"session_ms": 45000, "heartbeat_ms": 5000},
        }
    }


def test_summary_pairs_repeats_and_counts_fatal_exits() -> None:
    crash = _crash_result()["crash"]
    static = crash["cells"]["static"]["1000"]
    ratio = Stat.from_dict(static["ratio_spawn_to_fresh_s"])
    assert ratio.n == 3 and ratio.median == pytest.approx(0.45 / 0.22)
    assert static["fatal_exits"] == {"plain": 0, "fastrecover": 0} and static["fatal_error"] is None
    kip = crash["cells"]["kip848-static"]["1000"]
    assert kip["fatal_exits"] == {"plain": 30, "fastrecover": 0} and kip["fatal_runs"]["plain"] == 1
    assert kip["fatal_error"] == "UNRELEASED_INSTANCE_ID"
    assert kip["errors"]["fastrecover"] == ["TimeoutError: no fresh record"]


def test_crash_table_shows_spread_ratio_and_fatal_exits() -> None:
    result = _crash_result()
    table = crash_table(result["crash"])
    assert "| static membership (quickstart) | 1,000 | 3.25 (3.20-3.30, 3 %) | 3.45 (3.40-3.50, 3 %) |" in table
    assert "| 0.060 (0.050-0.070, 33 %) ⚠ | 0.300 (0.250-0.350, 33 %) ⚠ | 5.00 (4.29-5.83) ⚠ |" in table  # ready→fresh
    assert "| group.protocol=consumer, static | 1,000 | 45.00 (n=1) | n/a |" in table
    assert "30 in 1 runs / 0 in 0 runs" in table and "| none |" in table
    text = format_report(result)
    assert "Crash → first fresh record" in text and "restarted 3.0 s later" in text
    assert "UNRELEASED_INSTANCE_ID" in text and "consumer.session.timeout.ms 45000" in text
    assert failed_cells(result) == [
        "crash kip848-static lag 1,000 fastrecover: 1 failed, first: TimeoutError: no fresh record"
    ]


def test_crash_goals_of_issue_31() -> None:
    result = _crash_result()
    goals = crash_goals(result["crash"])
    assert [g.name.split(":")[0] for g in goals] == [
        "crash→fresh, quickstart settings, restart 3 s after the kill, lag 1,000",
        "spawn→fresh, quickstart settings, lag 1,000",
        "ready→fresh (spawn→fresh less the shared start), lag 1,000",
    ]
    crash_goal, spawn_goal, client_goal = goals
    assert crash_goal.value == pytest.approx(3.45) and crash_goal.threshold == 3.5 and crash_goal.met is True
    assert spawn_goal.threshold == 1.0 and spawn_goal.met is False  # 0.45 s against plain's 0.22 s
    # paired per repeat: 0.25/0.05, 0.30/0.07, 0.35/0.06
    assert client_goal.value == pytest.approx(0.25 / 0.05) and client_goal.met is False
    slow = crash_goals(_crash_result((3.6, 3.7, 3.8))["crash"])[0]
    assert slow.met is False
    assert [g.name for g in evaluate_goals(result) if g.name.startswith("crash→fresh")] == [crash_goal.name]


def test_no_spawn_goal_at_lags_the_issue_names_none_for() -> None:
    crash = _crash_result()["crash"]
    crash["cells"]["static"]["100000"] = {**crash["cells"]["static"]["1000"], "lag": 100_000}
    crash["cells"]["static"]["1000000"] = {**crash["cells"]["static"]["1000"], "lag": 1_000_000}
    names = [g.name for g in crash_goals(crash) if g.name.startswith("spawn")]
    assert names == [
        "spawn→fresh, quickstart settings, lag 1,000: fastrecover / plain",
        "spawn→fresh, quickstart settings, lag 1,000,000: fastrecover / plain",
    ]
    assert [g.threshold for g in crash_goals(crash) if g.name.startswith("spawn")] == [1.0, 0.2]


def test_noisy_crash_cells_are_named() -> None:
    result = _crash_result((3.0, 3.5, 4.0))
    noisy = noisy_cells(result)
    assert "crash static lag 1,000 fastrecover crash_to_fresh_s" in noisy
    assert "crash static lag 1,000 fastrecover spawn_to_fresh_s" in noisy
    assert not [n for n in noisy if "plain" in n and "static lag" in n and "crash_to" in n]


def test_cell_with_spread_percentage() -> None:
    assert Stat.of([1.0, 1.02, 1.04]).cell(2, show_spread=True) == "1.02 (1.00-1.04, 4 %)"
    assert Stat.of([0.5]).cell(2, show_spread=True) == "0.50 (n=1)"
