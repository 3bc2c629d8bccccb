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

from fastrecover.bench import scenarios
from fastrecover.bench.report import (
    STEADY_VARIANTS,
    Stat,
    format_report,
    paired_ratios,
    replace_between_markers,
)
from fastrecover.testing.broker import Broker, create_topic, delete_topic
from fastrecover.testing.driver import broker_session

log = logging.getLogger("fastrecover.bench")

SCENARIOS = ("ttf", "drain", "steady", "store", "memory")
SCHEMA = 1


@dataclass
class BenchOptions:
    bootstrap: str | None
    lags: list[int] = field(default_factory=lambda: [10_000, 100_000, 1_000_000])
    repeats: int = 3
    only: set[str] = field(default_factory=lambda: set(SCENARIOS))
    out: Path = Path("docs/benchmarks")
    pg_url: str | None = None
    doc: Path | None = Path("docs/benchmarks.md")
    spark: bool = False
    memory_lag: int = 1_000_000
    steady_records: int = 500_000
    steady_repeats: int = 5
    store_commits: int = 2000
    store_batches: int = 500
    command: str = ""


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


def _restart_lags(opts: BenchOptions) -> list[int]:
    lags = list(opts.lags) if opts.only & {"ttf", "drain"} else []
    if "memory" in opts.only and opts.memory_lag not in lags:
        lags.append(opts.memory_lag)
    return lags


def run_restarts(bootstrap: str, opts: BenchOptions, workdir: Path) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Every (lag, mode) restart ``repeats`` times; repeats outermost, mode order alternating."""
    lags = _restart_lags(opts)
    store_url = scenarios.sqlite_url(workdir)
    runs: dict[int, dict[str, list[dict[str, Any]]]] = {lag: {"plain": [], "fastrecover": []} for lag in lags}
    with open(workdir / "workers.log", "a") as wlog:
        for rep in range(opts.repeats):
            for lag in lags:
                modes = ("plain", "fastrecover") if rep % 2 == 0 else ("fastrecover", "plain")
                for mode in modes:
                    spec = scenarios.RestartSpec(bootstrap, lag, mode, store_url)
                    run = scenarios.restart_run(spec, wlog)
                    runs[lag][mode].append(run)
                    _say(
                        f"restart lag {lag:,} repeat {rep + 1}/{opts.repeats} {mode:<11}: joined "
                        f"{run['join_s']:.2f}s, fresh {run['total_s']:.2f}s (replay {run['replay_s']:.3f}s), "
                        f"drained {run['drain_s']:.2f}s, {run['records_per_s']:,.0f} rec/s, "
                        f"peak RSS {run['peak_rss_mib']} MiB"
                    )
    return runs


def _summ(runs: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    return {name: Stat.of(r.get(name) for r in runs).to_dict() for name in names}


def summarize_restarts(
    runs: Mapping[int, Mapping[str, Sequence[Mapping[str, Any]]]], opts: BenchOptions, measured_at: str
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    lags = [lag for lag in runs if lag in opts.lags]
    if "ttf" in opts.only:
        out["ttf"] = {
            str(lag): {
                mode: _summ(runs[lag][mode], ["total_s", "replay_s", "join_s", "recovery_s", "started_s"])
                for mode in ("plain", "fastrecover")
            }
            for lag in lags
        }
        out["ttf"]["measured_at"] = measured_at
    if "drain" in opts.only:
        out["drain"] = {
            str(lag): {
                mode: _summ(runs[lag][mode], ["drain_s", "lag_drained_s", "records_per_s"])
                for mode in ("plain", "fastrecover")
            }
            for lag in lags
        }
        out["drain"]["measured_at"] = measured_at
    if "memory" in opts.only and opts.memory_lag in runs:
        memory: dict[str, Any] = {"lag": opts.memory_lag, "measured_at": measured_at}
        for mode in ("plain", "fastrecover"):
            mruns = runs[opts.memory_lag][mode]
            row = _summ(mruns, ["base_rss_mib", "peak_rss_mib", "growth_mib", "max_child_queue"])
            peak = Stat.from_dict(row["peak_rss_mib"]).median
            median_run = min(mruns, key=lambda r: abs((r.get("peak_rss_mib") or 0) - (peak or 0)))
            row["rss_series"] = median_run.get("rss_series", [])
            memory[mode] = row
        out["memory"] = memory
    return out


def run_steady(bootstrap: str, opts: BenchOptions, workdir: Path) -> dict[str, Any]:
    topic = f"bench-steady-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, scenarios.PARTITIONS)
    store_url = scenarios.sqlite_url(workdir)
    raw: dict[str, dict[str, list[dict[str, float]]]] = {
        api: {v: [] for v in STEADY_VARIANTS} for api in ("poll", "consume")
    }
    try:
        rate = scenarios.produce_fast(bootstrap, topic, opts.steady_records)
        _say(f"steady: {opts.steady_records:,} records produced ({rate:,.0f}/s)")
        for rep in range(opts.steady_repeats):
            for api in ("poll", "consume"):
                shift = rep % len(STEADY_VARIANTS)
                order = STEADY_VARIANTS[shift:] + STEADY_VARIANTS[:shift]
                for variant in order:
                    res = scenarios.steady_once(bootstrap, topic, variant, api, opts.steady_records, store_url)
                    raw[api][variant].append(res)
                _say(
                    f"steady repeat {rep + 1}/{opts.steady_repeats} {api:<7}: "
                    + ", ".join(f"{v} {raw[api][v][-1]['records_per_s']:,.0f}/s" for v in STEADY_VARIANTS)
                )
    finally:
        delete_topic(bootstrap, topic)
    summary: dict[str, Any] = {}
    for api, per in raw.items():
        rows: dict[str, Any] = {}
        base = [r["records_per_s"] for r in per["raw"]]
        base_cpu = [r["cpu_us_per_record"] for r in per["raw"]]
        for variant, runs in per.items():
            row = _summ(runs, ["records_per_s", "cpu_us_per_record"])
            if variant != "raw":
                row["ratio_to_raw"] = paired_ratios([r["records_per_s"] for r in runs], base).to_dict()
                # raw CPU / our CPU per record: the throughput ratio of a caller thread that is CPU-bound,
                # much less disturbed by other load on the machine than wall-clock rates
                row["cpu_ratio_to_raw"] = paired_ratios(base_cpu, [r["cpu_us_per_record"] for r in runs]).to_dict()
            rows[variant] = row
        summary[api] = rows
    summary_out: dict[str, Any] = dict(summary)
    summary_out["measured_at"] = _now()
    summary_out["records"] = opts.steady_records
    return summary_out


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
            log.error("store benchmark on %s failed: %s", name, exc)
            out[name] = {"error": str(exc)}
    return out


def _store_backend(url: str, opts: BenchOptions, name: str) -> dict[str, Any]:
    runs = []
    for rep in range(opts.repeats):
        res = scenarios.store_once(url, opts.store_commits, opts.store_batches)
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
        out[kind]["commits"] = opts.store_commits if kind == "per_message" else opts.store_batches
    return out


def run_spark(bootstrap: str, opts: BenchOptions) -> dict[str, Any]:
    from fastrecover.spark.bench import format_table, run_spark_bench

    result = run_spark_bench(bootstrap, opts.lags, opts.repeats)
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
    for key in (*SCENARIOS, "spark"):
        if key not in result and key in previous:
            result[key] = previous[key]
            kept.append(key)
    if kept:
        result.setdefault("kept_from_previous", {})
        for key in kept:
            result["kept_from_previous"][key] = previous.get("command", "?")


def _doc_block(result: Mapping[str, Any], doc: Path, out: Path) -> str:
    m = result["machine"]
    png = os.path.relpath(out / "bench.png", doc.parent)
    js = os.path.relpath(out / "results.json", doc.parent)
    lines = [
        f"_Generated by `{result['command']}` — finished {result['finished']}._",
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
    from fastrecover.bench.plot import plot

    opts.out.mkdir(parents=True, exist_ok=True)
    paths = {"json": opts.out / "results.json", "table": opts.out / "table.md"}
    _merge_previous(result, paths["json"])
    paths["json"].write_text(json.dumps(result, indent=1) + "\n")
    paths["table"].write_text(format_report(result) + "\n")
    png = plot(result, opts.out / "bench.png")
    if png is not None:
        paths["png"] = png
    if opts.doc is not None and opts.doc.is_file():
        text = opts.doc.read_text()
        try:
            opts.doc.write_text(replace_between_markers(text, _doc_block(result, opts.doc, opts.out)))
            paths["doc"] = opts.doc
        except ValueError:
            _say(f"{opts.doc} has no bench-table markers; left unchanged")
    return paths


def run_bench(opts: BenchOptions, out: TextIO = sys.stdout) -> dict[str, Any]:
    unknown = opts.only - set(SCENARIOS)
    if unknown:
        raise ValueError(f"unknown scenario(s) {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    result: dict[str, Any] = {"schema": SCHEMA, "command": opts.command, "started": _now()}
    with (
        tempfile.TemporaryDirectory(prefix="fastrecover-bench-") as tmp,
        broker_session(opts.bootstrap, sys.stderr) as (bootstrap, broker),
    ):
        workdir = Path(tmp)
        result["machine"] = machine_info(bootstrap, broker)
        result["config"] = {
            "lags": opts.lags,
            "repeats": opts.repeats,
            "partitions": scenarios.PARTITIONS,
            "value_bytes": scenarios.VALUE_SIZE,
            "live_rate_per_s": scenarios.LIVE_RATE,
            "memory_lag": opts.memory_lag,
            "steady_records": opts.steady_records,
            "steady_repeats": opts.steady_repeats,
            "store_commits": opts.store_commits,
            "store_batches": opts.store_batches,
            "restart_store": "sqlite (file in a temp dir)",
            "workdir_filesystem": scenarios.workdir_filesystem(workdir),
            "fast_producer": scenarios.FAST_PRODUCER,
        }
        if opts.only & {"ttf", "drain", "memory"}:
            runs = run_restarts(bootstrap, opts, workdir)
            result.update(summarize_restarts(runs, opts, _now()))
            result.setdefault("runs", {})["restart"] = {str(k): v for k, v in runs.items()}
        if "steady" in opts.only:
            result["steady"] = run_steady(bootstrap, opts, workdir)
        if "store" in opts.only:
            result["store"] = run_store(opts, workdir)
        if opts.spark:
            result["spark"] = run_spark(bootstrap, opts)
        result["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["finished"] = _now()
    paths = write_outputs(result, opts)
    print(format_report(result), file=out)
    print("\nwritten: " + ", ".join(str(p) for p in paths.values()), file=out, flush=True)
    return result
