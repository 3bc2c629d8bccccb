"""``fastrecover bench``: run the scenarios, summarise repeats, write JSON + PNG + table, refresh the doc.

Output files under ``--out`` (default docs/benchmarks): ``results.json`` (every
raw run, the summaries, the machine and the command), ``bench.png`` and
``table.md``.  Sections not run this time (``--only``) are kept from the
previous results.json, each with the time it was measured, so one scenario can
be re-measured without re-running the rest.  When ``--doc`` (default
docs/benchmarks.md) has the table markers, the block between them is replaced.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import platform
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fastrecover_tools.bench import crash, partitions, scenarios
from fastrecover_tools.bench.patterns import BATCH, PATTERNS, STEADY_CELLS
from fastrecover_tools.bench.profiling import PROFILE_ENV
from fastrecover_tools.bench.redact import scrub
from fastrecover_tools.bench.report import (
    MODES,
    Stat,
    evaluate_goals,
    format_report,
    noisy_cells,
    paired_ratios,
    replace_between_markers,
)
from fastrecover_tools.testing.broker import Broker, create_topic, delete_topic
from fastrecover_tools.testing.driver import broker_session

log = logging.getLogger("fastrecover_tools.bench")

SCENARIOS = ("restart", "crash", "work", "steady", "store", "partitions")
SCHEMA = 2


@dataclass
class Sizes:
    """How much each scenario reads.  :data:`FULL` keeps the whole matrix under ~25 minutes on 2 cores."""

    lags: list[int]  # restart → drained lags of every pattern but per-message sync
    ttf_lag: int  # one more, smaller lag for auto-commit: time to fresh at the large lag / at this one
    sync_lags: list[int]  # per-message sync: a broker (or store) round trip per record
    sync_live_rate: int  # live records/s while a per-message sync consumer drains (~150-200/s here)
    work_lag: int
    steady_records: int
    steady_commit_records: int  # msg-async: a broker commit request per record (~20-50k records/s)
    steady_sync_records: int
    steady_repeats: int
    store_commits: int
    min_timeout_s: float  # a restart run gets this + lag / MIN_RATE of its kind to drain, then fails
    crash_lags: list[int]  # lags of the crash runs (SIGKILL, restart after the downtime)
    partition_counts: list[int] = field(default_factory=lambda: list(partitions.COUNTS))  # partitions per member
    partition_lag: int = partitions.LAG_PER_PARTITION  # records behind the committed offset on every partition


FULL = Sizes(
    lags=[100_000, 1_000_000],
    ttf_lag=10_000,
    sync_lags=[500, 2_000],
    sync_live_rate=20,
    work_lag=200_000,
    steady_records=500_000,
    steady_commit_records=200_000,
    steady_sync_records=1_000,
    steady_repeats=3,
    store_commits=2_000,
    min_timeout_s=60.0,
    crash_lags=[1_000, 10_000],
)
QUICK = Sizes(
    lags=[5_000, 20_000],
    ttf_lag=1_000,
    sync_lags=[200, 500],
    sync_live_rate=20,
    work_lag=5_000,
    steady_records=20_000,
    steady_commit_records=10_000,
    steady_sync_records=200,
    steady_repeats=2,
    store_commits=200,
    min_timeout_s=20.0,
    crash_lags=[1_000],
    partition_counts=[1, 64],
)


@dataclass
class CrashOptions:
    """The crash runs: which settings, how long the crashed process stays down, deadlines."""

    setups: list[str] = field(default_factory=lambda: list(crash.SETUPS))
    down_s: float = 3.0
    repeats: int | None = None  # None: BenchOptions.repeats
    timeout_s: float = 120.0  # crash → first fresh record, restarts after fatal errors included
    kip848_session_ms: int = crash.KIP848_SESSION_MS  # 0: the broker's own setting
    kip848_heartbeat_ms: int = crash.KIP848_HEARTBEAT_MS


@dataclass
class BenchOptions:
    bootstrap: str | None
    sizes: Sizes = field(default_factory=lambda: Sizes(**vars(FULL)))
    repeats: int = 3
    only: set[str] = field(default_factory=lambda: set(SCENARIOS))
    patterns: list[str] = field(default_factory=lambda: list(PATTERNS))
    work_us: int = 20
    work_pattern: str = "msg-async"
    out: Path = Path("docs/benchmarks")
    pg_url: str | None = None
    doc: Path | None = Path("docs/benchmarks.md")
    spark: bool = False
    profile: Path | None = None  # cProfile every consumer process into this directory
    crash: CrashOptions = field(default_factory=CrashOptions)
    partition_repeats: int | None = None  # None: repeats
    command: str = ""  # already masked
    secrets: list[str] = field(default_factory=list)  # scrubbed from everything printed or written


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _say(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# -- machine ----------------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            return round(int(fh.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return None


def kafka_version(bootstrap: str, broker: Broker | None) -> str:
    """The broker's version: from our launcher, else from the command line of the local process on its port."""
    if broker is not None and broker.version != "unknown":
        return broker.version
    try:
        import psutil

        port = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == "LISTEN" and conn.laddr and conn.laddr.port == port and conn.pid:
                cmdline = " ".join(psutil.Process(conn.pid).cmdline())
                found = re.findall(r"kafka[^ :/]*?(\d+\.\d+\.\d+)", cmdline)
                if found:
                    return str(found[0])
    except Exception as exc:  # best effort: psutil missing, no permission, remote broker
        log.debug("kafka version detection failed: %r", exc)
    return os.environ.get("FASTRECOVER_KAFKA_VERSION", "unknown")


def code_version() -> str:
    """``git describe`` of the checkout this runs from (``-dirty`` when it has uncommitted changes)."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version_text(version: Any) -> str:
    """confluent_kafka's version()/libversion(): a (text, int) tuple, or the text alone."""
    return str(version[0] if isinstance(version, tuple) else version)


def machine_info(bootstrap: str, broker: Broker | None) -> dict[str, Any]:
    import confluent_kafka

    return {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "confluent_kafka": _version_text(confluent_kafka.version()),
        "librdkafka": _version_text(confluent_kafka.libversion()),
        "kafka_version": kafka_version(bootstrap, broker),
        "broker": broker.describe() if broker is not None else f"external broker at {bootstrap}",
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "fastrecover_code": code_version(),
    }


# -- scenarios --------------------------------------------------------------------------------------


def restart_cells(opts: BenchOptions) -> list[tuple[str, int, str]]:
    """(pattern, lag, role) of every restart cell; role "ttf" marks the extra small lag of auto-commit."""
    cells: list[tuple[str, int, str]] = []
    for pattern in opts.patterns:
        lags = opts.sizes.sync_lags if PATTERNS[pattern].kind == "sync-message" else opts.sizes.lags
        if pattern == "auto" and opts.sizes.ttf_lag not in lags:
            cells.append((pattern, opts.sizes.ttf_lag, "ttf"))
        cells += [(pattern, lag, "drain") for lag in lags]
    return cells


def _store_url(workdir: Path, name: str) -> str:
    return f"sqlite:///{workdir / (name + '.db')}"


def _mode_order(rep: int, index: int) -> tuple[str, str]:
    """ABAB: plain first on even (repeat + cell) and fastrecover first on odd, so drift hits both."""
    return ("plain", "fastrecover") if (rep + index) % 2 == 0 else ("fastrecover", "plain")


#: A restart run that drains slower than this (records/s) is cut off and recorded as failed: it misses its
#: goal by far (plain drains at 100k+/s, or ~150-200/s with a sync commit per record), and the matrix must
#: finish in bounded time whatever the code under test does.
MIN_RATE = {"async": 10_000, "sync-batch": 10_000, "sync-message": 50}


def run_timeout(pattern: str, lag: int, min_timeout_s: float) -> float:
    """Seconds a run of ``lag`` records gets (for each of its waits) before it counts as failed."""
    return min_timeout_s + lag / MIN_RATE[PATTERNS[pattern].kind]


def _restart_spec(
    bootstrap: str, opts: BenchOptions, pattern: str, lag: int, mode: str, store_url: str, work_us: int = 0
) -> scenarios.RestartSpec:
    sync = PATTERNS[pattern].kind == "sync-message"
    live = opts.sizes.sync_live_rate if sync else scenarios.LIVE_RATE
    timeout = run_timeout(pattern, lag, opts.sizes.min_timeout_s) + lag * work_us / 1e6
    return scenarios.RestartSpec(
        bootstrap, lag, mode, store_url, live_rate=live, pattern=pattern, work_us=work_us, timeout_s=timeout
    )


def _one_restart(spec: scenarios.RestartSpec, wlog: TextIO, what: str) -> dict[str, Any]:
    """One restart run; a failure (worker error, timeout) is recorded in the results, not raised."""
    try:
        run = scenarios.restart_run(spec, wlog)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        _say(f"{what}: FAILED: {reason}")
        return {"error": reason[-2000:]}
    _say_run(what, run)
    return run


def _say_run(what: str, run: Mapping[str, Any]) -> None:
    _say(
        f"{what}: fresh {run['total_s']:.2f}s, drained {run['drain_s']:.2f}s, "
        f"{run['records_per_s']:,.0f} rec/s, peak RSS {run['peak_rss_mib']} MiB"
    )


def run_restarts(bootstrap: str, opts: BenchOptions, workdir: Path) -> dict[str, dict[int, dict[str, list[Any]]]]:
    """Every restart cell ``repeats`` times: repeats outermost, the mode order alternating (ABAB)."""
    cells = restart_cells(opts)
    runs: dict[str, dict[int, dict[str, list[Any]]]] = {}
    for pattern, lag, _role in cells:
        runs.setdefault(pattern, {})[lag] = {mode: [] for mode in MODES}
    with open(workdir / "workers.log", "a") as wlog:
        for rep in range(opts.repeats):
            for index, (pattern, lag, _role) in enumerate(cells):
                for mode in _mode_order(rep, index):
                    # a fresh store per run: every restart starts from an empty range store, as a new group does
                    store_url = _store_url(workdir, f"{pattern}-{lag}-{rep}-{mode}")
                    spec = _restart_spec(bootstrap, opts, pattern, lag, mode, store_url)
                    what = f"restart {pattern} lag {lag:,} repeat {rep + 1}/{opts.repeats} {mode:<11}"
                    runs[pattern][lag][mode].append(_one_restart(spec, wlog, what))
    return runs


def _summ(runs: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    return {name: Stat.of(r.get(name) for r in runs).to_dict() for name in names}


RESTART_METRICS = (
    "total_s",
    "replay_s",
    "join_s",
    "recovery_s",
    "started_s",
    "lag_drained_s",
    "drain_s",
    "records_per_s",
    "cpu_us_per_record",
    "peak_rss_mib",
    "growth_mib",
)


def summarize_pair(plain: Sequence[Mapping[str, Any]], fast: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Both modes of one cell, and the paired ratios (repeat i of fastrecover over repeat i of plain)."""
    return {
        "plain": _summ(plain, RESTART_METRICS),
        "fastrecover": _summ(fast, RESTART_METRICS),
        "ratio_records_per_s": paired_ratios(
            [r.get("records_per_s") for r in fast], [r.get("records_per_s") for r in plain]
        ).to_dict(),
        "ratio_drain_s": paired_ratios([r.get("drain_s") for r in fast], [r.get("drain_s") for r in plain]).to_dict(),
        "ratio_cpu_us_per_record": paired_ratios(
            [r.get("cpu_us_per_record") for r in fast], [r.get("cpu_us_per_record") for r in plain]
        ).to_dict(),
        "errors": {
            mode: [r["error"] for r in runs if "error" in r] for mode, runs in zip(MODES, (plain, fast), strict=True)
        },
        # runs whose consumer was assigned partitions more than once: a rebalance mid-run, records redelivered
        "rebalanced": {
            mode: sum(1 for r in runs if (r.get("assignments") or 0) > 1)
            for mode, runs in zip(MODES, (plain, fast), strict=True)
        },
    }


def summarize_restarts(
    runs: Mapping[str, Mapping[int, Mapping[str, Sequence[Mapping[str, Any]]]]], opts: BenchOptions, measured_at: str
) -> dict[str, Any]:
    roles = {(p, lag): role for p, lag, role in restart_cells(opts)}
    patterns: dict[str, Any] = {}
    for pattern, per_lag in runs.items():
        patterns[pattern] = {}
        for lag, per in sorted(per_lag.items()):
            cell = summarize_pair(per["plain"], per["fastrecover"])
            cell["role"] = roles.get((pattern, lag), "drain")
            cell["lag"] = lag
            patterns[pattern][str(lag)] = cell
    out: dict[str, Any] = {"restart": {"patterns": patterns, "measured_at": measured_at}}
    auto = runs.get("auto")
    if auto:
        lag = max(auto)
        memory: dict[str, Any] = {"lag": lag, "measured_at": measured_at}
        for mode in MODES:
            mruns = auto[lag][mode]
            row = _summ(mruns, ["base_rss_mib", "peak_rss_mib", "growth_mib", "max_child_queue"])
            peak = Stat.from_dict(row["peak_rss_mib"]).median
            ok = [r for r in mruns if "error" not in r]
            median_run = min(ok, key=lambda r: abs((r.get("peak_rss_mib") or 0) - (peak or 0)), default={})
            row["rss_series"] = median_run.get("rss_series", [])
            memory[mode] = row
        out["memory"] = memory
    return out


CRASH_METRICS = (
    "crash_to_fresh_s",
    "spawn_to_fresh_s",
    "spawn_to_fresh_cpu_s",
    "first_spawn_to_fresh_s",
    "ready_s",
    "client_s",
    "imported_s",
    "started_s",
    "join_s",
    "crash_to_joined_s",
    "recovery_s",
    "joined_to_fresh_s",
    "down_s",
    "lag",
    "incarnations",
)


def crash_repeats(opts: BenchOptions) -> int:
    return opts.crash.repeats if opts.crash.repeats is not None else opts.repeats


def crash_cells(opts: BenchOptions) -> list[tuple[str, int]]:
    """(setup, lag) of every crash cell."""
    return [(setup, lag) for setup in opts.crash.setups for lag in opts.sizes.crash_lags]


def _say_crash(what: str, run: Mapping[str, Any]) -> None:
    fatal = len(run.get("fatal_after_s") or ())
    tail = f" ({fatal} fatal exits, restarted)" if fatal else ""
    if "error" in run:
        _say(f"{what}: FAILED: {run['error']}{tail}")
        return
    cpu = run.get("spawn_to_fresh_cpu_s")
    cpu_said = "" if cpu is None else f" ({cpu * 1000:.0f} ms of CPU)"
    times = f"crash→fresh {run['crash_to_fresh_s']:.2f}s, spawn→fresh {run['spawn_to_fresh_s']:.2f}s"
    _say(f"{what}: {times}{cpu_said}{tail}")


def run_crashes(bootstrap: str, opts: BenchOptions, workdir: Path) -> dict[str, dict[int, dict[str, list[Any]]]]:
    """Every crash cell, repeats outermost, the mode order alternating (ABAB), like the restart runs."""
    cells = crash_cells(opts)
    repeats = crash_repeats(opts)
    runs: dict[str, dict[int, dict[str, list[Any]]]] = {}
    for setup, lag in cells:
        runs.setdefault(setup, {})[lag] = {mode: [] for mode in MODES}
    with open(workdir / "workers.log", "a") as wlog:
        for rep in range(repeats):
            for index, (setup, lag) in enumerate(cells):
                for mode in _mode_order(rep, index):
                    spec = crash.CrashSpec(
                        bootstrap,
                        setup,
                        lag,
                        mode,
                        _store_url(workdir, f"crash-{setup}-{lag}-{rep}-{mode}"),
                        down_s=opts.crash.down_s,
                        timeout_s=opts.crash.timeout_s + lag / MIN_RATE["async"],
                        kip848_session_ms=opts.crash.kip848_session_ms,
                        kip848_heartbeat_ms=opts.crash.kip848_heartbeat_ms,
                    )
                    what = f"crash {setup} lag {lag:,} repeat {rep + 1}/{repeats} {mode:<11}"
                    try:
                        run = crash.crash_run(spec, wlog)
                    except Exception as exc:
                        run = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
                    _say_crash(what, run)
                    runs[setup][lag][mode].append(run)
    return runs


def summarize_crash_cell(plain: Sequence[Mapping[str, Any]], fast: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Both modes of one crash cell, the paired ratios (fastrecover over plain), failures and fatal exits."""
    per = {"plain": plain, "fastrecover": fast}
    out: dict[str, Any] = {mode: _summ(runs, CRASH_METRICS) for mode, runs in per.items()}
    for metric in ("crash_to_fresh_s", "spawn_to_fresh_s", "spawn_to_fresh_cpu_s", "client_s"):
        out[f"ratio_{metric}"] = paired_ratios([r.get(metric) for r in fast], [r.get(metric) for r in plain]).to_dict()
    out["errors"] = {mode: [r["error"] for r in runs if "error" in r] for mode, runs in per.items()}
    out["fatal_exits"] = {mode: sum(len(r.get("fatal_after_s") or ()) for r in runs) for mode, runs in per.items()}
    out["fatal_runs"] = {mode: sum(1 for r in runs if r.get("fatal_after_s")) for mode, runs in per.items()}
    out["fatal_error"] = next((r["fatal_error"] for r in (*plain, *fast) if r.get("fatal_error")), None)
    out["group_config"] = next((r["group_config"] for r in (*plain, *fast) if r.get("group_config")), None)
    return out


def summarize_crashes(
    runs: Mapping[str, Mapping[int, Mapping[str, Sequence[Mapping[str, Any]]]]], opts: BenchOptions, measured_at: str
) -> dict[str, Any]:
    cells: dict[str, Any] = {}
    for setup, per_lag in runs.items():
        cells[setup] = {}
        for lag, per in sorted(per_lag.items()):
            cell = summarize_crash_cell(per["plain"], per["fastrecover"])
            cell["lag"] = lag
            cells[setup][str(lag)] = cell
    return {
        "cells": cells,
        "setups": {name: crash.SETUPS[name].label for name in runs},
        "down_s": opts.crash.down_s,
        "repeats": crash_repeats(opts),
        "respawn_delay_s": crash.RESPAWN_DELAY_S,
        "kip848_group": {
            "session_ms": opts.crash.kip848_session_ms or "the broker's",
            "heartbeat_ms": opts.crash.kip848_heartbeat_ms or "the broker's",
        },
        "measured_at": measured_at,
    }


def partition_repeats(opts: BenchOptions) -> int:
    return opts.partition_repeats if opts.partition_repeats is not None else opts.repeats


def _say_partitions(what: str, run: Mapping[str, Any]) -> None:
    if "error" in run:
        _say(f"{what}: FAILED: {run['error']}")
        return

    def num(name: str, digits: int = 3) -> str:
        value = run.get(name)
        return "n/a" if value is None else f"{value:.{digits}f}"

    _say(
        f"{what}: spawn→fresh {num('spawn_to_fresh_s')}s, subscribe→assigned {num('subscribe_to_assigned_s')}s, "
        f"assign {num('recovery_s')}s, ranges {run.get('ranges_opened')}, rows {run.get('rows', '-')}, "
        f"statements {run.get('recovery_statements', '-')} in recovery / {run.get('statements', '-')} in all"
    )


def run_partitions(bootstrap: str, opts: BenchOptions, workdir: Path) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Every partition count, repeats outermost and the arms rotating, one topic per count."""
    counts, lag = opts.sizes.partition_counts, opts.sizes.partition_lag
    repeats = partition_repeats(opts)
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {n: {arm: [] for arm in partitions.ARMS} for n in counts}
    topics: dict[int, str] = {}
    try:
        for n in counts:
            topics[n], rate = partitions.prepare_topic(bootstrap, n, lag)
            _say(f"partitions: topic of {n:,} partitions, {n * lag:,} records ({rate:,.0f}/s)")
        with open(workdir / "workers.log", "a") as wlog:
            for rep in range(repeats):
                for index, n in enumerate(counts):
                    for arm in partitions.arm_order(rep, index):
                        mode, open_first = partitions.arm_mode(arm)
                        spec = partitions.PartitionSpec(
                            bootstrap,
                            topics[n],
                            n,
                            mode,
                            _store_url(workdir, f"partitions-{n}-{rep}-{arm}"),
                            lag_per_partition=lag,
                            timeout_s=opts.sizes.min_timeout_s + n * lag / MIN_RATE["async"],
                            name=f"partitions-{n}-{arm}-r{rep + 1}",
                            store_open_first=open_first,
                        )
                        what = f"partitions {n:,} repeat {rep + 1}/{repeats} {arm:<22}"
                        try:
                            run = partitions.partitions_run(spec, wlog)
                        except Exception as exc:
                            run = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
                        _say_partitions(what, run)
                        runs[n][arm].append(run)
    finally:
        for topic in topics.values():
            try:
                delete_topic(bootstrap, topic, timeout=partitions.ADMIN_TIMEOUT_S)
            except Exception as exc:  # a leftover topic must not lose the measurements
                log.warning("could not delete %s: %s", topic, exc)
    return runs


PARTITION_METRICS = (
    "spawn_to_fresh_s",
    "started_s",
    "spawn_to_store_open_s",
    "subscribe_to_joined_s",
    "subscribe_to_assigned_s",
    "recovery_s",
    "joined_to_fresh_s",
    "spawn_to_lag_drained_s",
    "ranges_opened",
    "rows",
    "recovery_statements",
    "recovery_writes",
    "recovery_commits",
    "statements",
    "store_writes",
    "store_commits",
    "settled_s",
)


def summarize_partition_cell(per: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Every arm of one partition count, the paired ratios (each fastrecover arm over plain) and the failures."""
    out: dict[str, Any] = {arm: _summ(runs, PARTITION_METRICS) for arm, runs in per.items()}
    plain = per.get("plain", [])
    for arm in ("fastrecover", "fastrecover-store-open"):
        for metric in ("spawn_to_fresh_s", "subscribe_to_assigned_s"):
            out[f"ratio_{metric}" if arm == "fastrecover" else f"ratio_{metric}_store_open"] = paired_ratios(
                [r.get(metric) for r in per.get(arm, [])], [r.get(metric) for r in plain]
            ).to_dict()
    out["errors"] = {arm: [r["error"] for r in runs if "error" in r] for arm, runs in per.items()}
    out["rebalanced"] = {arm: sum(1 for r in runs if (r.get("assignments") or 0) > 1) for arm, runs in per.items()}
    return out


def summarize_partitions(
    runs: Mapping[int, Mapping[str, Sequence[Mapping[str, Any]]]], opts: BenchOptions, measured_at: str
) -> dict[str, Any]:
    cells: dict[str, Any] = {}
    for n, per in sorted(runs.items()):
        cell = summarize_partition_cell(per)
        cell["partitions"] = n
        cells[str(n)] = cell
    return {
        "cells": cells,
        "lag_per_partition": opts.sizes.partition_lag,
        "repeats": partition_repeats(opts),
        "settings": "group.instance.id, session.timeout.ms 10000, reconnect.backoff.ms 20, auto-commit (the README "
        "quickstart's); "
        "fastrecover: sqlite store, its schema in place",
        "arms": list(partitions.ARMS),
        "measured_at": measured_at,
    }


def run_work(bootstrap: str, opts: BenchOptions, workdir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restart → drained with ``work_us`` of CPU per record: does the extra consumer cost the application?"""
    pattern, lag = opts.work_pattern, opts.sizes.work_lag
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with open(workdir / "workers.log", "a") as wlog:
        for rep in range(opts.repeats):
            for mode in _mode_order(rep, 0):
                store_url = _store_url(workdir, f"work-{rep}-{mode}")
                spec = _restart_spec(bootstrap, opts, pattern, lag, mode, store_url, opts.work_us)
                what = f"work {opts.work_us} µs {pattern} lag {lag:,} repeat {rep + 1}/{opts.repeats} {mode:<11}"
                runs[mode].append(_one_restart(spec, wlog, what))
    out = summarize_pair(runs["plain"], runs["fastrecover"])
    out.update({"work_us": opts.work_us, "pattern": pattern, "lag": lag, "measured_at": _now()})
    return out, runs


def steady_size(sizes: Sizes, pattern: str) -> int:
    """Records per steady run: fewer where each record costs a commit request (async) or round trip (sync)."""
    if PATTERNS[pattern].kind == "sync-message":
        return sizes.steady_sync_records
    if pattern == "msg-async":
        return sizes.steady_commit_records
    return sizes.steady_records


def _steady_line(mode: str, run: Mapping[str, Any]) -> str:
    if "error" in run:
        return f"{mode} FAILED"
    return f"{mode} {run['cpu_us_per_record']:.3f} µs/rec {run['records_per_s']:,.0f}/s"


STEADY_METRICS = ("cpu_us_per_record", "process_cpu_us_per_record", "records_per_s")


def run_steady(bootstrap: str, opts: BenchOptions, workdir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every steady cell, ``steady_repeats`` times, ABAB; one pre-filled topic read by a new group each run."""
    cells = [(api, p) for api, p in STEADY_CELLS if p in opts.patterns]
    size = {p: steady_size(opts.sizes, p) for _a, p in cells}
    topic = f"bench-steady-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, scenarios.PARTITIONS)
    store_url = _store_url(workdir, "steady")
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {f"{a}/{p}": {m: [] for m in MODES} for a, p in cells}
    wlog = open(workdir / "steady.log", "a")  # noqa: SIM115 - closed in the finally below
    try:
        # More records than any run reads: a consume(500, 1.0) that meets the end of the topic would wait out its
        # timeout (a second added to a run of about a second), so no run may read up to the end.
        total = max(size.values(), default=0) * 11 // 10 + 10 * BATCH * scenarios.PARTITIONS
        rate = scenarios.produce_fast(bootstrap, topic, total)
        _say(f"steady: {total:,} records produced ({rate:,.0f}/s)")
        for rep in range(opts.sizes.steady_repeats):
            for index, (api, pattern) in enumerate(cells):
                key = f"{api}/{pattern}"
                for mode in _mode_order(rep, index):
                    res: dict[str, Any]
                    try:
                        timeout = run_timeout(pattern, size[pattern], opts.sizes.min_timeout_s)
                        res = scenarios.steady_run(
                            bootstrap, topic, mode, api, pattern, size[pattern], store_url, timeout, wlog
                        )
                    except Exception as exc:  # recorded as a failed cell; the rest of the matrix still runs
                        _say(f"steady {key} {mode} FAILED: {type(exc).__name__}: {exc}")
                        res = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
                    raw[key][mode].append(res)
                _say(
                    f"steady repeat {rep + 1}/{opts.sizes.steady_repeats} {key:<20}: "
                    + ", ".join(_steady_line(m, raw[key][m][-1]) for m in MODES)
                )
    finally:
        wlog.close()
        delete_topic(bootstrap, topic)
    out_cells: dict[str, Any] = {}
    for api, pattern in cells:
        key = f"{api}/{pattern}"
        plain, fast = raw[key]["plain"], raw[key]["fastrecover"]
        out_cells[key] = {
            "api": api,
            "pattern": pattern,
            "records": size[pattern],
            "plain": _summ(plain, STEADY_METRICS),
            "fastrecover": _summ(fast, STEADY_METRICS),
            # plain CPU / our CPU: the throughput ratio of a CPU-bound caller thread
            "cpu_ratio": paired_ratios(
                [r.get("cpu_us_per_record") for r in plain], [r.get("cpu_us_per_record") for r in fast]
            ).to_dict(),
            "wall_ratio": paired_ratios(
                [r.get("records_per_s") for r in fast], [r.get("records_per_s") for r in plain]
            ).to_dict(),
            "errors": {m: [r["error"] for r in raw[key][m] if "error" in r] for m in MODES},
        }
    return {"cells": out_cells, "repeats": opts.sizes.steady_repeats, "measured_at": _now()}, raw


def run_store(opts: BenchOptions, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"measured_at": _now()}
    backends: list[tuple[str, Any]] = [("sqlite", None)]
    if opts.pg_url:
        backends.append(("postgresql", opts.pg_url))
    else:
        _say("store: no --pg-url / $FASTRECOVER_PG_URL: PostgreSQL skipped")
    for name, pg in backends:
        try:
            if pg is None:
                url = f"sqlite:///{workdir / 'bench-store-commits.db'}"
                out[name] = _store_backend(url, opts, name)
            else:
                with scenarios.ThrowawayPostgres(pg) as url:
                    out[name] = _store_backend(url, opts, name)
        except Exception as exc:
            reason = scrub(str(exc), opts.secrets)
            log.error("store benchmark on %s failed: %s", name, reason)
            out[name] = {"error": reason}
    return out


def _store_batches(opts: BenchOptions) -> int:
    return max(1, opts.sizes.store_commits // 4)


def _store_backend(url: str, opts: BenchOptions, name: str) -> dict[str, Any]:
    runs = []
    for rep in range(opts.repeats):
        res = scenarios.store_once(url, opts.sizes.store_commits, _store_batches(opts))
        runs.append(res)
        _say(
            f"store {name} repeat {rep + 1}/{opts.repeats}: per-message {res['per_message']['commits_per_s']:,.0f}"
            f" commits/s (p99 {res['per_message']['p99_ms']:.2f} ms), batched "
            f"{res['batched']['commits_per_s']:,.0f} commits/s"
        )
    out: dict[str, Any] = {"settings": scenarios.store_settings(url)}
    for kind in ("per_message", "batched"):
        out[kind] = _summ([r[kind] for r in runs], ["commits_per_s", "records_per_s", "p50_ms", "p99_ms"])
        out[kind]["records_per_commit"] = 1 if kind == "per_message" else 500
        out[kind]["commits"] = opts.sizes.store_commits if kind == "per_message" else _store_batches(opts)
    return out


def run_spark(bootstrap: str, opts: BenchOptions) -> dict[str, Any]:
    from fastrecover_tools.spark_bench import format_table, run_spark_bench

    result = run_spark_bench(bootstrap, opts.sizes.lags, opts.repeats)
    return {"measured_at": _now(), "result": result, "table": format_table(result)}


# -- output -----------------------------------------------------------------------------------------


def _merge_previous(result: dict[str, Any], path: Path) -> None:
    """Keep sections measured by an earlier run that this one did not repeat."""
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if previous.get("schema") != SCHEMA:
        return
    kept = []
    for key in (*SCENARIOS, "memory", "spark"):
        if key not in result and key in previous:
            result[key] = previous[key]
            kept.append(key)
    if kept:
        result.setdefault("kept_from_previous", {})
        for key in kept:
            result["kept_from_previous"][key] = previous.get("command", "?")


def finish(result: dict[str, Any]) -> dict[str, Any]:
    """Evaluate the goals and list the noisy cells, over whatever sections ``result`` holds."""
    result["goals"] = [g.to_dict() for g in evaluate_goals(result)]
    result["noisy"] = noisy_cells(result)
    return result


def _doc_block(result: Mapping[str, Any], doc: Path, out: Path) -> str:
    m = result["machine"]
    png = os.path.relpath(out / "bench.png", doc.parent)
    js = os.path.relpath(out / "results.json", doc.parent)
    lines = [
        f"_Generated by `{result['command']}` — {result['started']} to {result['finished']}._",
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB RAM, {m['platform']}; "
        f"Python {m['python']}, confluent-kafka {m['confluent_kafka']} / librdkafka {m['librdkafka']}; "
        f"Kafka {m['kafka_version']} ({m['broker']}); load average at start {m['loadavg_start']}, "
        f"at the end {m.get('loadavg_end', '?')}; fastrecover {m.get('fastrecover_code', '?')}.",
        "",
        f"Cells are `median (min-max)` over the repeats; raw runs in [{js}]({js}).",
    ]
    kept = result.get("kept_from_previous") or {}
    if kept:
        lines.append("")
        lines.append(
            "Kept from an earlier run: "
            + ", ".join(f"{k} (measured {result[k].get('measured_at', '?')})" for k in kept)
            + "."
        )
    lines += ["", format_report(result), "", f"![benchmark plot]({png})"]
    return "\n".join(lines)


def write_outputs(result: dict[str, Any], opts: BenchOptions) -> dict[str, Path]:
    """results.json, table.md, bench.png and the doc block; every text scrubbed of the known secrets."""
    from fastrecover_tools.bench.plot import plot

    opts.out.mkdir(parents=True, exist_ok=True)
    paths = {"json": opts.out / "results.json", "table": opts.out / "table.md"}
    _merge_previous(result, paths["json"])
    finish(result)
    paths["json"].write_text(scrub(json.dumps(result, indent=1), opts.secrets) + "\n")
    paths["table"].write_text(scrub(format_report(result), opts.secrets) + "\n")
    png = plot(result, opts.out / "bench.png")
    if png is not None:
        paths["png"] = png
    if opts.doc is not None and opts.doc.is_file():
        text = opts.doc.read_text()
        try:
            block = scrub(_doc_block(result, opts.doc, opts.out), opts.secrets)
            opts.doc.write_text(replace_between_markers(text, block))
            paths["doc"] = opts.doc
        except ValueError:
            _say(f"{opts.doc} has no bench-table markers; left unchanged")
    return paths


def byte_compile() -> bool:
    """Write the bytecode of fastrecover and of these tools, as installing a package does; False if it failed.

    Every worker is a new process.  Without cached bytecode each one compiles every module it imports
    (at every start where ``PYTHONDONTWRITEBYTECODE`` is set, as in many containers), and an editable
    checkout's start then costs several times an installed package's: on a 2-core machine about 25
    against 6 ms to import ``fastrecover.consumer`` and 80-100 against 12-20 ms for the mode's modules,
    on the way to every restarted process's first record.  Installers compile what they install.
    """
    import compileall

    import fastrecover
    import fastrecover_tools

    ok = True
    for package in (fastrecover, fastrecover_tools):
        for path in package.__path__:
            ok = bool(compileall.compile_dir(path, quiet=1)) and ok
    return ok


def run_bench(opts: BenchOptions, out: TextIO = sys.stdout) -> dict[str, Any]:
    unknown = opts.only - set(SCENARIOS)
    if unknown:
        raise ValueError(f"unknown scenario(s) {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    result: dict[str, Any] = {"schema": SCHEMA, "command": scrub(opts.command, opts.secrets), "started": _now()}
    if not byte_compile():
        _say("could not write the bytecode of fastrecover or the tools: each worker compiles what it imports")
    if opts.profile is not None:  # inherited by every worker process
        os.environ[PROFILE_ENV] = str(opts.profile.resolve())
        _say(f"profiling every consumer process into {opts.profile}: these figures are distorted")
    began = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="fastrecover-bench-") as tmp,
        broker_session(opts.bootstrap, sys.stderr) as (bootstrap, broker),
    ):
        workdir = Path(tmp)
        result["machine"] = machine_info(bootstrap, broker)
        result["config"] = {
            "sizes": vars(opts.sizes),
            "repeats": opts.repeats,
            "patterns": opts.patterns,
            "work_us": opts.work_us,
            "work_pattern": opts.work_pattern,
            "partitions": scenarios.PARTITIONS,
            "value_bytes": scenarios.VALUE_SIZE,
            "live_rate_per_s": scenarios.LIVE_RATE,
            "restart_store": "sqlite (a new file in a temp dir per run, its schema created before the restart)",
            "workdir_filesystem": scenarios.workdir_filesystem(workdir),
            "fast_producer": scenarios.FAST_PRODUCER,
            "profiled": opts.profile is not None,
            "crash": {**vars(opts.crash), "repeats": crash_repeats(opts), "respawn_delay_s": crash.RESPAWN_DELAY_S},
            "partition_repeats": partition_repeats(opts),
        }
        raw: dict[str, Any] = {}
        if "restart" in opts.only:
            runs = run_restarts(bootstrap, opts, workdir)
            result.update(summarize_restarts(runs, opts, _now()))
            raw["restart"] = {p: {str(k): v for k, v in per.items()} for p, per in runs.items()}
        if "crash" in opts.only:
            crash_runs = run_crashes(bootstrap, opts, workdir)
            result["crash"] = summarize_crashes(crash_runs, opts, _now())
            raw["crash"] = {s: {str(k): v for k, v in per.items()} for s, per in crash_runs.items()}
        if "work" in opts.only:
            result["work"], raw["work"] = run_work(bootstrap, opts, workdir)
        if "steady" in opts.only:
            result["steady"], raw["steady"] = run_steady(bootstrap, opts, workdir)
        if "store" in opts.only:
            result["store"] = run_store(opts, workdir)
        if "partitions" in opts.only:
            part_runs = run_partitions(bootstrap, opts, workdir)
            result["partitions"] = summarize_partitions(part_runs, opts, _now())
            raw["partitions"] = {str(n): per for n, per in part_runs.items()}
        if opts.spark:
            result["spark"] = run_spark(bootstrap, opts)
        result["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        result["runs"] = raw
    result["finished"] = _now()
    result["elapsed_s"] = round(time.monotonic() - began, 1)
    paths = write_outputs(result, opts)
    print(scrub(format_report(result), opts.secrets), file=out)
    print(
        f"\nelapsed {result['elapsed_s']:.0f} s; written: " + ", ".join(str(p) for p in paths.values()),
        file=out,
        flush=True,
    )
    return result
