"""The idle benchmark's pure parts: the rotation, the summaries, the paired ratios and the table."""

from __future__ import annotations

import pytest

from fastrecover_tools.bench.idle import MODES, paired_ratios, rotated, summary, table


def test_each_mode_runs_first_as_often_as_the_other() -> None:
    firsts = [rotated(MODES, by)[0] for by in range(4)]
    assert firsts.count("plain") == firsts.count("fastrecover") == 2
    assert sorted(rotated(MODES, 3)) == sorted(MODES)


def test_summary_and_spread() -> None:
    s = summary([2.0, 1.0, 4.0])
    assert (s["median"], s["min"], s["max"]) == (2.0, 1.0, 4.0)
    assert s["spread"] == pytest.approx(1.5)
    assert summary([0.0, 0.0])["spread"] is None


def test_ratios_pair_the_modes_of_one_repeat_and_api() -> None:
    runs = [
        {"repeat": 0, "mode": "plain", "api": "poll", "cpu_ms_per_s": 0.5},
        {"repeat": 0, "mode": "fastrecover", "api": "poll", "cpu_ms_per_s": 1.0},
        {"repeat": 0, "mode": "plain", "api": "consume", "cpu_ms_per_s": 0.1},
        {"repeat": 1, "mode": "fastrecover", "api": "poll", "cpu_ms_per_s": 3.0},  # its plain run is missing
        {"repeat": 2, "mode": "plain", "api": "poll", "cpu_ms_per_s": 0.0},
        {"repeat": 2, "mode": "fastrecover", "api": "poll", "cpu_ms_per_s": 1.0},  # no ratio to a zero
    ]
    assert paired_ratios(runs, "poll") == [2.0]
    assert paired_ratios(runs, "consume") == []


def test_table_rows() -> None:
    cells = {
        "poll": {"plain": summary([0.25, 0.3]), "fastrecover": summary([1.0, 1.2]), "ratio": summary([4.0, 4.0])},
        "consume": {"plain": summary([0.1]), "fastrecover": summary([1.1]), "ratio": None},
    }
    rows = table({"cells": cells}).splitlines()
    assert rows[2] == "| `poll(1)` | 0.28 (0.25-0.30) | 1.10 (1.00-1.20) | 4.0 (4.0-4.0) |"
    assert rows[3] == "| `consume(500, 1)` | 0.10 (0.10-0.10) | 1.10 (1.10-1.10) | n/a |"
