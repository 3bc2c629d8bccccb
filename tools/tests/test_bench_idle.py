"""The idle benchmark's pure parts: the rotation of the modes, the cells and the table."""

from __future__ import annotations

import pytest

from fastrecover_tools.bench.idle import MODES, cells_of, table
from fastrecover_tools.bench.steady_instructions import rotated


def test_each_mode_runs_first_as_often_as_the_other() -> None:
    firsts = [rotated(MODES, by)[0] for by in range(4)]
    assert firsts.count("plain") == firsts.count("fastrecover") == 2


def test_cells_pair_the_modes_of_one_repeat_and_call() -> None:
    runs = [
        {"repeat": 0, "mode": "plain", "api": "poll", "cpu_ms_per_s": 0.5},
        {"repeat": 0, "mode": "fastrecover", "api": "poll", "cpu_ms_per_s": 1.0},
        {"repeat": 0, "mode": "plain", "api": "consume", "cpu_ms_per_s": 0.1},
        {"repeat": 1, "mode": "fastrecover", "api": "poll", "cpu_ms_per_s": 3.0},  # its plain run is missing
        {"repeat": 2, "mode": "plain", "api": "poll", "cpu_ms_per_s": 0.0},
        {"repeat": 2, "mode": "fastrecover", "api": "poll", "cpu_ms_per_s": 1.0},  # no ratio to a zero
        {"repeat": 3, "mode": "fastrecover", "api": "poll", "cpu_ms_per_s": 2.0},
        {"repeat": 3, "mode": "plain", "api": "poll", "cpu_ms_per_s": 0.5},
    ]
    cells = cells_of(runs, ["poll", "consume"])
    poll = cells["poll"]
    assert poll["ratio"]["values"] == [2.0, 4.0] and poll["ratio"]["median"] == pytest.approx(3.0)
    assert poll["fastrecover"]["values"] == [1.0, 3.0, 1.0, 2.0] and poll["fastrecover"]["median"] == 1.5
    assert poll["plain"]["values"] == [0.5, 0.0, 0.5]
    consume = cells["consume"]
    assert consume["plain"]["values"] == [0.1] and consume["fastrecover"]["n"] == 0 and consume["ratio"]["n"] == 0


def test_table_rows() -> None:
    runs = [
        {"repeat": r, "mode": m, "api": "poll", "cpu_ms_per_s": v}
        for r, (p, f) in enumerate([(0.25, 1.0), (0.30, 1.2)])
        for m, v in (("plain", p), ("fastrecover", f))
    ] + [{"repeat": 0, "mode": "plain", "api": "consume", "cpu_ms_per_s": 0.1}]
    rows = table({"cells": cells_of(runs, ["poll", "consume"])}).splitlines()
    assert rows[0] == "| call | plain (ms/s) | fastrecover (ms/s) | fastrecover / plain (paired) |"
    assert rows[2] == "| `poll(1)` | 0.28 (0.25-0.30) ⚠ | 1.10 (1.00-1.20) ⚠ | 4.0 (4.0-4.0) |"
    assert rows[3] == "| `consume(500, 1)` | 0.10 (n=1) | n/a | n/a |"
