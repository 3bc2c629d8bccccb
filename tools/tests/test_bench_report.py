"""The pure parts of the benchmark report: statistics over repeats, ratios, tables, doc markers."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fastrecover_tools.bench.report import (
    NOISY_MARK,
    TABLE_END,
    TABLE_START,
    Stat,
    evaluate_goals,
    failed_cells,
    fmt_ratio,
    format_report,
    goals_table,
    lag_items,
    markdown_table,
    noisy_cells,
    paired_ratios,
    ratio,
    replace_between_markers,
    restart_table,
    steady_table,
    store_table,
    ttf_table,
    work_table,
)


def test_stat_is_median_min_max_and_skips_missing() -> None:
    s = Stat.of([3.0, None, 1.0, 2.0, float("nan")])
    assert (s.median, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 3)
    assert Stat.of([1.0, 4.0]).median == 2.5
    empty = Stat.of([None])
    assert empty.n == 0 and empty.median is None
    assert empty.cell() == "n/a"


def test_stat_round_trips_through_json_dict() -> None:
    s = Stat.of([0.5, 0.25, 1.0])
    assert Stat.from_dict(s.to_dict()) == s


def test_cell_formats_median_and_range() -> None:
    assert Stat.of([1.0, 2.0, 3.0]).cell(1) == "2.0 (1.0-3.0) ⚠"  # repeats 100 % apart: flagged
    assert Stat.of([1234.0, 5678.0, 3000.0]).cell(0, thousands=True) == "3,000 (1,234-5,678) ⚠"
    assert Stat.of([100.0, 104.0, 102.0]).cell(0) == "102 (100-104)"
    assert Stat.of([0.5]).cell(2) == "0.50 (n=1)"


def test_ratio_of_medians_and_paired_ratios() -> None:
    assert ratio(Stat.of([10.0, 20.0, 30.0]), Stat.of([2.0, 4.0, 6.0])) == 5.0
    assert ratio(Stat.of([1.0]), Stat.of([0.0])) is None
    assert ratio(Stat.of([]), Stat.of([1.0])) is None
    paired = paired_ratios([2.0, 9.0, None], [1.0, 3.0, 5.0])
    assert (paired.median, paired.low, paired.high, paired.n) == (2.5, 2.0, 3.0, 2)
    assert fmt_ratio(None) == "n/a"
    assert fmt_ratio(12.345, 1) == "12.3x"


def test_markdown_table_shape_and_errors() -> None:
    text = markdown_table(["a", "b"], [["x", "1"], ["y", "2"]])
    assert text.splitlines() == ["| a | b |", "| --- | ---: |", "| x | 1 |", "| y | 2 |"]
    with pytest.raises(ValueError):
        markdown_table(["a", "b"], [["only one"]])
    with pytest.raises(ValueError):
        markdown_table(["a", "b"], [], align="l")


def _stats(*values: float) -> dict[str, Any]:
    return Stat.of(values).to_dict()


def _restart_cell(
    plain_rps: float, fast_rps: float, ratio_values: tuple[float, ...], role: str = "drain"
) -> dict[str, Any]:
    return {
        "plain": {"drain_s": _stats(4.0), "records_per_s": _stats(plain_rps), "total_s": _stats(2.0, 2.5, 3.0)},
        "fastrecover": {
            "drain_s": _stats(2.0),
            "records_per_s": _stats(fast_rps),
            "total_s": _stats(1.0, 1.1, 1.2),
            "recovery_s": _stats(0.05),
        },
        "ratio_records_per_s": _stats(*ratio_values),
        "ratio_drain_s": _stats(*(1 / v for v in ratio_values)),
        "errors": {"plain": [], "fastrecover": []},
        "role": role,
    }


def _result() -> dict[str, Any]:
    return {
        "restart": {
            "patterns": {
                "auto": {
                    "10000": _restart_cell(1000.0, 1000.0, (1.0, 1.0, 1.0), role="ttf"),
                    "100000": _restart_cell(1000.0, 2000.0, (2.0, 2.0, 2.0)),
                },
                "msg-sync": {"2000": _restart_cell(1000.0, 600.0, (0.6, 0.62, 0.58))},
            },
            "measured_at": "now",
        },
        "steady": {
            "cells": {
                "poll/auto": {
                    "api": "poll",
                    "pattern": "auto",
                    "records": 10,
                    "plain": {"records_per_s": _stats(100.0), "cpu_us_per_record": _stats(1.0)},
                    "fastrecover": {"records_per_s": _stats(90.0), "cpu_us_per_record": _stats(1.1)},
                    "cpu_ratio": _stats(0.91),
                    "wall_ratio": _stats(0.9),
                }
            },
            "measured_at": "now",
        },
        "store": {
            "sqlite": {
                "per_message": {
                    "commits_per_s": _stats(200.0),
                    "records_per_s": _stats(200.0),
                    "p50_ms": _stats(4.0),
                    "p99_ms": _stats(20.0),
                },
                "settings": {"synchronous": 2},
            },
            "postgresql": {"error": "no server"},
            "measured_at": "now",
        },
    }


def test_tables_sort_lags_skip_metadata_and_show_ratios() -> None:
    result = _result()
    auto = result["restart"]["patterns"]["auto"]
    assert [lag for lag, _ in lag_items(auto)] == ["10000", "100000"]
    ttf = ttf_table(result["restart"]).splitlines()
    assert len(ttf) == 4  # header, separator, two lags
    assert ttf[2].startswith("| 10,000 | 2.50 (2.00-3.00) ⚠ | 1.10 (1.00-1.20) ⚠ | 2.3x |")
    restart = restart_table(result["restart"])
    assert "| auto: auto-commit | 100,000 | 4.00 (n=1) | 2.00 (n=1) | 1,000 (n=1) | 2,000 (n=1) |" in restart
    assert "| 2.00 (2.00-2.00) |" in restart  # paired ratio, no flag: the repeats agree
    assert restart.splitlines()[2].endswith("| n/a | n/a | n/a |")  # a result kept from before the CPU columns
    auto["100000"]["plain"]["cpu_us_per_record"] = _stats(0.6, 0.62)
    auto["100000"]["fastrecover"]["cpu_us_per_record"] = _stats(0.7)
    auto["100000"]["ratio_cpu_us_per_record"] = _stats(1.18, 1.2, 1.22)
    cpu_row = restart_table(result["restart"]).splitlines()[3]
    assert cpu_row.endswith("| 0.61 (0.60-0.62) | 0.70 (n=1) | 1.20 (1.18-1.22) |"), cpu_row
    steady = steady_table(result["steady"])
    assert "poll, auto: auto-commit" in steady and "0.910 (n=1)" in steady
    store = store_table(result["store"])
    assert "| postgresql | n/a |" in store and "| sqlite | per-message | 200 (n=1) |" in store


def test_format_report_has_only_the_sections_present() -> None:
    text = format_report(_result())
    assert "Time to fresh data" in text and "Cost of the range store" in text and "per commit pattern" in text
    assert "Memory while backfilling" not in text and "With CPU work" not in text
    assert format_report({}) == ""


def test_spread_is_range_over_median_and_flags_above_ten_percent() -> None:
    assert Stat.of([1.0, 1.05, 1.1]).spread == pytest.approx(0.1 / 1.05)
    assert not Stat.of([1.0, 1.05, 1.1]).noisy()
    assert Stat.of([1.0, 1.2, 1.05]).noisy()
    assert Stat.of([1.0]).spread is None and not Stat.of([1.0]).noisy()
    assert Stat.of([]).spread is None
    assert NOISY_MARK in Stat.of([1.0, 2.0]).cell(1)
    assert NOISY_MARK not in Stat.of([1.0, 1.01]).cell(1)


def test_the_medians_interval_narrows_with_repeats_and_holds_the_median() -> None:
    assert Stat.of([1.0, 1.1, 1.2, 1.3]).ci95() is None, "too few repeats to resample"
    few = Stat.of([0.5, 0.9, 1.0, 1.1, 1.5])
    many = Stat.of([0.5, 0.9, 1.0, 1.1, 1.5] * 8)
    for stat in (few, many):
        interval = stat.ci95()
        assert interval is not None and stat.median is not None
        assert interval[0] <= stat.median <= interval[1]
    few_ci, many_ci = few.ci95(), many.ci95()
    assert few_ci is not None and many_ci is not None
    assert many_ci[1] - many_ci[0] < few_ci[1] - few_ci[0]
    assert few.ci95() == few_ci, "seeded: the same values give the same interval"
    assert Stat.of([2.0] * 6).ci95() == (2.0, 2.0)


def _goal(goals: list[Any], prefix: str) -> Any:
    found = [g for g in goals if g.name.startswith(prefix)]
    assert len(found) == 1, [g.name for g in goals]
    return found[0]


def test_goals_met_missed_and_not_measured() -> None:
    goals = evaluate_goals(_result())
    auto = _goal(goals, "drain records/s, auto, lag 100,000")
    assert (auto.value, auto.threshold, auto.met) == (2.0, 0.95, True)
    # the 10k auto lag exists for time to fresh only: no drain goal on it
    assert not [g for g in goals if g.name.startswith("drain records/s, auto, lag 10,000")]
    sync = _goal(goals, "drain records/s, msg-sync, lag 2,000")
    assert sync.threshold == 0.5 and sync.met is True and sync.value == pytest.approx(0.6)
    # patterns not in the result: one unmeasured goal each, never a silent pass
    for pattern in ("msg-async", "batch-async", "store"):
        assert _goal(goals, f"drain records/s, {pattern}:").met is None
    poll = _goal(goals, "steady state, poll")
    assert poll.value == pytest.approx(0.91) and poll.met is False
    assert _goal(goals, "steady state, consume").met is None
    assert _goal(goals, "20 µs work").met is None
    ttf = _goal(goals, "time to fresh flat")
    assert ttf.value == pytest.approx(1.0) and ttf.met is True and "100,000 / 10,000" in ttf.name


def test_goal_thresholds_are_inclusive_and_failures_miss_the_goal() -> None:
    result = _result()
    result["work"] = {
        "work_us": 20,
        "lag": 1000,
        "pattern": "msg-async",
        "ratio_drain_s": _stats(1.05),
        "errors": {"plain": [], "fastrecover": []},
    }
    assert _goal(evaluate_goals(result), "20 µs work").met is True
    result["work"]["ratio_drain_s"] = _stats(1.06)
    assert _goal(evaluate_goals(result), "20 µs work").met is False
    cell = result["restart"]["patterns"]["auto"]["100000"]
    cell["errors"]["fastrecover"] = ["RuntimeError: worker died\nStateError: commit of partitions not assigned"]
    auto = _goal(evaluate_goals(result), "drain records/s, auto, lag 100,000")
    assert auto.value == 2.0 and auto.met is False and auto.failures == 1
    assert failed_cells(result) == [
        "restart auto lag 100,000 fastrecover: 1 failed, first: StateError: commit of partitions not assigned"
    ]
    table = goals_table([g.to_dict() for g in evaluate_goals(result)])
    assert "**no** (1 failed run)" in table
    assert "95 % interval of the median" in table
    goals = [g.to_dict() for g in evaluate_goals(result)]
    assert "Failed or disturbed runs" in format_report({**result, "goals": goals})


def test_ttf_goal_uses_largest_over_smallest_lag() -> None:
    result = _result()
    big = _restart_cell(1.0, 1.0, (1.0,))
    big["fastrecover"]["total_s"] = _stats(1.8)
    result["restart"]["patterns"]["auto"]["1000000"] = big
    ttf = _goal(evaluate_goals(result), "time to fresh flat")
    assert "1,000,000 / 10,000" in ttf.name
    assert ttf.value == pytest.approx(1.8 / 1.1) and ttf.met is False


def test_noisy_cells_name_every_flagged_figure() -> None:
    result = _result()
    result["steady"]["cells"]["poll/auto"]["plain"]["cpu_us_per_record"] = _stats(1.0, 1.5)
    noisy = noisy_cells(result)
    assert "steady poll/auto plain cpu_us_per_record" in noisy
    assert not [n for n in noisy if n.startswith("restart")]


def test_work_table_row() -> None:
    work = {
        "work_us": 20,
        "lag": 200_000,
        "pattern": "msg-async",
        "plain": {"drain_s": _stats(5.0)},
        "fastrecover": {"drain_s": _stats(5.1)},
        "ratio_drain_s": _stats(1.02),
    }
    assert (
        "| msg-async: commit(message=m, asynchronous=True) per record | 200,000 | 20 | 5.00 (n=1) | 5.10 (n=1) |"
        in (work_table(work))
    )


def test_replace_between_markers() -> None:
    doc = f"intro\n{TABLE_START}\nold\n{TABLE_END}\noutro\n"
    new = replace_between_markers(doc, "new table\n")
    assert new == f"intro\n{TABLE_START}\nnew table\n{TABLE_END}\noutro\n"
    assert replace_between_markers(new, "again").count(TABLE_START) == 1
    with pytest.raises(ValueError):
        replace_between_markers("no markers", "x")


def test_percentile_and_stat_handle_single_values() -> None:
    from fastrecover_tools.bench.scenarios import _percentile

    assert _percentile([5.0], 99) == 5.0
    assert _percentile([1.0, 2.0, 3.0, 4.0], 50) in (2.0, 3.0)
    assert math.isnan(_percentile([], 50))


def test_rebalanced_runs_are_listed() -> None:
    result = _result()
    result["restart"]["patterns"]["auto"]["100000"]["rebalanced"] = {"plain": 0, "fastrecover": 2}
    assert failed_cells(result) == [
        "restart auto lag 100,000 fastrecover: 2 run(s) rebalanced mid-run (records redelivered; figures suspect)"
    ]
