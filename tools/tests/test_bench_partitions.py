"""The partitions runs' pure parts: options, arms, the figures, the statement counter, the tables and goals."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from fastrecover.store import open_store, upgrade
from fastrecover_tools.bench import command
from fastrecover_tools.bench.partitions import (
    ARMS,
    PartitionSpec,
    arm_mode,
    arm_order,
    figures,
    lag_starts,
    offsets_text,
    store_rows,
    worker_args,
)
from fastrecover_tools.bench.report import (
    Stat,
    evaluate_goals,
    failed_cells,
    format_report,
    noisy_cells,
    partition_goals,
    partitions_store_table,
    partitions_table,
)
from fastrecover_tools.bench.run import (
    FULL,
    QUICK,
    SCENARIOS,
    BenchOptions,
    partition_repeats,
    summarize_partition_cell,
)
from fastrecover_tools.bench.statements import StatementCounter, delta, kind_of, parameter_sets, writes
from fastrecover_tools.bench.worker import lag_records, offsets_arg


def _options(*argv: str) -> BenchOptions:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    opts = command.options_from_args(parser.parse_args(list(argv)), ["bench", *argv])
    assert isinstance(opts, BenchOptions)
    return opts


def test_partition_options_defaults_and_overrides() -> None:
    opts = _options()
    assert "partitions" in SCENARIOS and "partitions" in opts.only
    assert opts.sizes.partition_counts == FULL.partition_counts == [1, 64, 512, 2048]
    assert opts.sizes.partition_lag == 200 and partition_repeats(opts) == opts.repeats == 3
    assert _options("--quick").sizes.partition_counts == QUICK.partition_counts
    opts = _options("--only", "partitions", "--partition-counts", "8,2_048", "--partition-lag", "300")
    assert opts.only == {"partitions"} and opts.sizes.partition_counts == [8, 2048]
    assert opts.sizes.partition_lag == 300
    assert partition_repeats(_options("--partition-repeats", "5", "--repeats", "2")) == 5
    with pytest.raises(SystemExit):
        _options("--partition-counts", "0")


def test_lag_starts_leave_the_lag_on_every_partition() -> None:
    ends = {0: 1000, 1: 150, 2: 200}
    starts = lag_starts(ends, 200)
    assert starts == {0: 800, 1: 0, 2: 0}
    text_ = offsets_text(starts)
    assert text_ == "0:800,1:0,2:0" and offsets_arg(text_) == starts
    assert lag_records(starts, ends) == 200 + 150 + 200
    assert offsets_arg("") == {} and lag_records({}, {0: 5, 1: 7}) == 12


def test_arms_rotate_so_each_runs_first_as_often() -> None:
    assert ARMS == ("plain", "fastrecover", "fastrecover-store-open")
    assert arm_mode("plain") == ("plain", False)
    assert arm_mode("fastrecover") == ("fastrecover", False)
    assert arm_mode("fastrecover-store-open") == ("fastrecover", True)
    with pytest.raises(ValueError, match="nope"):
        arm_mode("nope")
    orders = [arm_order(rep, 0) for rep in range(3)]
    assert {o[0] for o in orders} == set(ARMS) and all(sorted(o) == sorted(ARMS) for o in orders)
    assert arm_order(0, 1) == arm_order(1, 0)


def _events(counting_since: float | None, recovery: dict[str, int] | None = None) -> list[dict[str, Any]]:
    return [
        {"event": "started", "t": 100.4},
        {"event": "store_open", "t": 100.9},
        {"event": "subscribed", "t": 101.0},
        {"event": "joined", "t": 101.2},
        {
            "event": "assigned",
            "t": 101.7,
            "assign_s": 0.5,
            "ranges_opened": 64,
            "degraded": 0,
            "statements": recovery,
            "counting_since": counting_since,
        },
        {"event": "fresh", "t": 101.8},
        {"event": "lag_drained", "t": 103.0},
        {"event": "statements", "t": 104.0, "counts": {"statements": 90, "commits": 7, "kind:UPDATE": 64}},
        {"event": "stats", "t": 104.0, "assignments": 1},
    ]


def test_figures_from_the_worker_events() -> None:
    recovery = {"statements": 5, "commits": 2, "kind:INSERT": 1, "kind:UPDATE": 1, "kind:SELECT": 3}
    f = figures(_events(100.5, recovery), spawned=100.0)
    assert f["spawn_to_fresh_s"] == pytest.approx(1.8) and f["started_s"] == pytest.approx(0.4)
    assert f["spawn_to_store_open_s"] == pytest.approx(0.9)
    assert f["subscribe_to_joined_s"] == pytest.approx(0.2) and f["subscribe_to_assigned_s"] == pytest.approx(0.7)
    assert f["recovery_s"] == 0.5 and f["joined_to_fresh_s"] == pytest.approx(0.6)
    assert f["spawn_to_lag_drained_s"] == pytest.approx(3.0) and f["ranges_opened"] == 64
    assert (f["recovery_statements"], f["recovery_writes"], f["recovery_commits"]) == (5, 2, 2)
    assert (f["statements"], f["store_writes"], f["store_commits"]) == (90, 64, 7)
    assert f["assignments"] == 1


def test_figures_drop_recovery_statements_counted_from_the_middle() -> None:
    # the counter began listening after the assignment began: its count of the recovery is partial
    late = figures(_events(101.5, {"statements": 1}), spawned=100.0)
    assert late["recovery_statements"] is None and late["recovery_writes"] is None
    assert late["statements"] == 90  # the totals say how many it saw; the docs say from when
    plain = figures(_events(None), spawned=100.0)
    assert plain["recovery_statements"] is None and plain["recovery_commits"] is None
    empty = figures([], spawned=100.0)
    assert empty["spawn_to_fresh_s"] is None and empty["statements"] is None


def test_only_the_arm_that_opens_its_store_first_counts_statements() -> None:
    # the counter's thread imports SQLAlchemy holding the GIL: in an arm timed from the spawn it slowed the
    # consumer's start-up, join and recovery, which no other arm paid
    def args(arm: str) -> list[str]:
        mode, store_open_first = arm_mode(arm)
        spec = PartitionSpec("b:9092", "t", 2, mode, "sqlite:///s.db", store_open_first=store_open_first, name=arm)
        return worker_args(spec, "g", {0: 5, 1: 7}, {0: 205, 1: 207}, "member-1")

    counted = {arm: "--count-statements" in args(arm) for arm in ARMS}
    assert counted == {"plain": False, "fastrecover": False, "fastrecover-store-open": True}
    store_open = args("fastrecover-store-open")
    assert "--store-open-first" in store_open and "--store-open-first" not in args("fastrecover")
    assert store_open[store_open.index("--lag-start") + 1] == "0:5,1:7"
    assert store_open[store_open.index("--lag-end") + 1] == "0:205,1:207"
    assert "--set=group.instance.id=member-1" in store_open


def test_statement_kinds_deltas_and_writes() -> None:
    assert kind_of("  SELECT 1") == "SELECT" and kind_of("\n(select 1)") == "SELECT"
    assert kind_of("update t set x=1") == "UPDATE" and kind_of("") == "?"
    assert parameter_sets([{"a": 1}, {"a": 2}], True) == 2 and parameter_sets({"a": 1}, False) == 1
    before = {"statements": 3, "kind:SELECT": 3}
    after = {"statements": 7, "kind:SELECT": 4, "kind:INSERT": 2, "kind:UPDATE": 1, "commits": 1}
    assert delta(after, before) == {"statements": 4, "kind:SELECT": 1, "kind:INSERT": 2, "kind:UPDATE": 1, "commits": 1}
    assert writes(delta(after, before)) == 3 and writes({}) == 0


def test_statement_counter_sees_a_real_engine(tmp_path: Path) -> None:
    counter = StatementCounter()
    counter.install_in_background().join(30)
    assert counter.error is None and counter.installed_at is not None
    engine = create_engine(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        with engine.begin() as conn:
            conn.execute(text("create table t (x integer)"))
            conn.execute(text("insert into t values (:x)"), [{"x": 1}, {"x": 2}, {"x": 3}])
            conn.execute(text("select count(*) from t"))
    finally:
        engine.dispose()
    counts = counter.snapshot()
    assert counts["kind:CREATE"] == 1 and counts["kind:INSERT"] == 1 and counts["kind:SELECT"] == 1
    assert counts["statements"] == 3 and counts["parameter_sets"] == 1 + 3 + 1 and counts["commits"] == 1
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    event.remove(Engine, "before_cursor_execute", counter._on_execute)
    event.remove(Engine, "commit", counter._on_commit)


def test_store_rows_by_state(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    assert store_rows(url) == {"rows": 0}
    with open_store(url) as store:
        store.create_range("g", "t", 0, 0, 200, "owner")
        store.create_range("g", "t", 1, 0, 200, "owner")
    assert store_rows(url) == {"rows": 2, "rows_open": 2}


def _run(spawn: float, recovery: float, **more: Any) -> dict[str, Any]:
    return {"spawn_to_fresh_s": spawn, "subscribe_to_assigned_s": recovery + 0.2, "recovery_s": recovery, **more}


def _store_run(recovery: float) -> dict[str, Any]:
    return _run(
        1.0 + recovery,
        recovery,
        ranges_opened=2048,
        rows=2048,
        recovery_statements=23,
        recovery_commits=8,
        statements=2088,
        store_commits=11,
        joined_to_fresh_s=recovery + 0.01,
        spawn_to_lag_drained_s=20.0,
    )


def _result(fast_recovery: tuple[float, ...]) -> dict[str, Any]:
    cells: dict[str, Any] = {}
    for n, scale in ((1, 0.0), (2048, 1.0)):
        per = {
            "plain": [_run(0.7 + scale, 0.001), _run(0.75 + scale, 0.001), _run(0.8 + scale, 0.002)],
            "fastrecover": [_run(0.8 + r * scale, r * scale, ranges_opened=0) for r in fast_recovery],
            "fastrecover-store-open": [_store_run(r * scale * 4) for r in fast_recovery],
        }
        cells[str(n)] = {**summarize_partition_cell(per), "partitions": n}
    return {"partitions": {"cells": cells, "lag_per_partition": 200, "repeats": 3, "settings": "quickstart"}}


def test_summary_pairs_each_fastrecover_arm_with_plain() -> None:
    cell = _result((0.5, 0.6, 0.7))["partitions"]["cells"]["2048"]
    ratio = Stat.from_dict(cell["ratio_spawn_to_fresh_s"])
    assert ratio.n == 3 and ratio.median == pytest.approx((0.8 + 0.6) / 1.75)
    assert Stat.from_dict(cell["ratio_spawn_to_fresh_s_store_open"]).n == 3
    assert Stat.from_dict(cell["fastrecover-store-open"]["rows"]).median == 2048
    assert cell["errors"] == {"plain": [], "fastrecover": [], "fastrecover-store-open": []}
    assert cell["rebalanced"] == {"plain": 0, "fastrecover": 0, "fastrecover-store-open": 0}


def test_tables_show_both_fastrecover_arms() -> None:
    section = _result((0.5, 0.6, 0.7))["partitions"]
    table = partitions_table(section)
    assert table.splitlines()[2].startswith("| 1 | 0.750 (0.700-0.800) ⚠ | 0.800 (0.800-0.800) | 1.07 (1.00-1.14) ⚠ |")
    assert "| 2,048 |" in table and "0.600 (0.500-0.700, 33 %)" in table
    store = partitions_store_table(section)
    assert "| 2,048 | 2.400 (2.000-2.800, 33 %) ⚠ |" in store
    assert "| 2,048 | 2,048 | 23 / 8 | 2,088 / 11 | 20.00 (20.00-20.00) |" in store


def test_partition_goals_judge_the_recovery_at_2048_and_flatness() -> None:
    met = {g.name: g for g in partition_goals(_result((0.5, 0.6, 0.7))["partitions"])}
    starts, every, flat = list(met.values())
    assert starts.value == pytest.approx(0.6) and starts.met is True
    assert every.value == pytest.approx(2.4) and every.met is False
    assert flat.value == pytest.approx((0.8 + 0.6) / 0.8) and flat.met is False and "2,048 / 1" in flat.name
    one_count = {"cells": {"64": _result((0.5,))["partitions"]["cells"]["2048"]}}
    assert [g.met for g in partition_goals(one_count)] == [None, None, None]
    goals = evaluate_goals(_result((0.5, 0.6, 0.7)))
    assert any(g.name.startswith("recovery of 2,048 partitions") for g in goals)


def test_failed_noisy_and_report_name_partition_cells() -> None:
    result = _result((0.5, 0.6, 0.9))
    cell = result["partitions"]["cells"]["2048"]
    cell["errors"]["fastrecover-store-open"] = ["TimeoutError: the store to record every range as finished"]
    failed = failed_cells(result)
    assert any(f.startswith("partitions 2,048 fastrecover-store-open: 1 failed") for f in failed)
    assert "partitions 2,048 fastrecover recovery_s" in noisy_cells(result)
    goal = partition_goals(result["partitions"])[1]
    assert goal.failures == 1 and goal.met is False
    report = format_report({**result, "goals": [g.to_dict() for g in evaluate_goals(result)]})
    assert "#### Scale in partitions: one member recovering N partitions" in report
    assert "#### Scale in partitions: the recovery with a range on every partition" in report
