"""The pure parts of the benchmark report: statistics over repeats, ratios, tables, doc markers."""

from __future__ import annotations

import math
from typing import Any

import pytest

from fastrecover.bench.report import (
    TABLE_END,
    TABLE_START,
    Stat,
    drain_table,
    fmt_ratio,
    format_report,
    lag_items,
    markdown_table,
    paired_ratios,
    ratio,
    replace_between_markers,
    steady_table,
    store_table,
    ttf_table,
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
    assert Stat.of([1.0, 2.0, 3.0]).cell(1) == "2.0 (1.0-3.0)"
    assert Stat.of([1234.0, 5678.0, 3000.0]).cell(0, thousands=True) == "3,000 (1,234-5,678)"
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


def _result() -> dict[str, Any]:
    mode = {
        "total_s": _stats(2.0, 2.5, 3.0),
        "replay_s": _stats(1.0, 1.5, 2.0),
        "join_s": _stats(1.0),
        "recovery_s": _stats(0.05),
    }
    fast = {**mode, "replay_s": _stats(0.1, 0.2, 0.3)}
    return {
        "ttf": {
            "100000": {"plain": mode, "fastrecover": fast},
            "10000": {"plain": mode, "fastrecover": fast},
            "measured_at": "now",
        },
        "drain": {
            "10000": {
                "plain": {"drain_s": _stats(4.0), "records_per_s": _stats(1000.0)},
                "fastrecover": {"drain_s": _stats(2.0), "records_per_s": _stats(2000.0)},
            }
        },
        "steady": {
            "poll": {
                "raw": {"records_per_s": _stats(100.0), "cpu_us_per_record": _stats(1.0)},
                "on": {
                    "records_per_s": _stats(90.0),
                    "cpu_us_per_record": _stats(1.1),
                    "ratio_to_raw": _stats(0.9),
                    "cpu_ratio_to_raw": _stats(0.91),
                },
            },
            "measured_at": "now",
            "records": 10,
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
    assert [lag for lag, _ in lag_items(result["ttf"])] == ["10000", "100000"]
    ttf = ttf_table(result["ttf"]).splitlines()
    assert len(ttf) == 4  # header, separator, two lags; measured_at is not a row
    assert ttf[2].startswith("| 10,000 | 1.500 (1.000-2.000) | 0.200 (0.100-0.300) | 7.5x |")
    drain = drain_table(result["drain"])
    assert "| 10,000 | 4.00 (n=1) | 2.00 (n=1) | 2.00x |" in drain
    assert "2.00x |" in drain.splitlines()[-1]
    steady = steady_table(result["steady"])
    assert "fastrecover, mode on (no open range)" in steady and "0.910 (n=1)" in steady
    store = store_table(result["store"])
    assert "| postgresql | n/a |" in store and "| sqlite | per-message | 200 (n=1) |" in store


def test_format_report_has_only_the_sections_present() -> None:
    text = format_report(_result())
    assert "Time to fresh data" in text and "Cost of the range store" in text
    assert "Memory while backfilling" not in text
    assert format_report({}) == ""


def test_replace_between_markers() -> None:
    doc = f"intro\n{TABLE_START}\nold\n{TABLE_END}\noutro\n"
    new = replace_between_markers(doc, "new table\n")
    assert new == f"intro\n{TABLE_START}\nnew table\n{TABLE_END}\noutro\n"
    assert replace_between_markers(new, "again").count(TABLE_START) == 1
    with pytest.raises(ValueError):
        replace_between_markers("no markers", "x")


def test_percentile_and_stat_handle_single_values() -> None:
    from fastrecover.bench.scenarios import _percentile

    assert _percentile([5.0], 99) == 5.0
    assert _percentile([1.0, 2.0, 3.0, 4.0], 50) in (2.0, 3.0)
    assert math.isnan(_percentile([], 50))
