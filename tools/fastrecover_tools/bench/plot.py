"""The benchmark figure (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastrecover_tools.bench.report import MODES, Stat, failures, lag_items

_COLORS = {"plain": "#c0392b", "fastrecover": "#2471a3"}


def _stat(section: Mapping[str, Any], name: str) -> Stat:
    data = section.get(name)
    return Stat.from_dict(data) if isinstance(data, Mapping) else Stat.of([])


def _errorbar(ax: Any, xs: list[float], stats: list[Stat], **kwargs: Any) -> None:
    pts = [(x, s) for x, s in zip(xs, stats, strict=True) if s.median is not None]
    if not pts:
        return
    x = [p[0] for p in pts]
    y = [p[1].median for p in pts]
    lo = [p[1].median - p[1].low for p in pts]  # type: ignore[operator]
    hi = [p[1].high - p[1].median for p in pts]  # type: ignore[operator]
    ax.errorbar(x, y, yerr=[lo, hi], capsize=3, marker="o", **kwargs)


def _bars(
    ax: Any,
    labels: list[str],
    stats: list[Stat],
    goals: list[tuple[float, str]],
    ylabel: str,
    title: str,
    failed: list[int] | None = None,
) -> None:
    """Medians as bars with min-max whiskers, dotted goal lines, and "failed" over cells with failed runs."""
    meds = [s.median or 0.0 for s in stats]
    los = [(s.median or 0.0) - (s.low if s.low is not None else s.median or 0.0) for s in stats]
    his = [(s.high if s.high is not None else s.median or 0.0) - (s.median or 0.0) for s in stats]
    colors = ["#b03a2e" if s.noisy() else "#5d6d7e" for s in stats]
    ax.bar(range(len(labels)), meds, yerr=[los, his], capsize=3, color=colors)
    ax.axhline(1.0, color="black", linewidth=0.8)
    for value, label in goals:
        ax.axhline(value, color="#c0392b", linestyle=":", label=label)
    for i, count in enumerate(failed or []):
        if count:
            ax.text(i, 0.02, f"{count} failed", rotation=90, ha="center", va="bottom", fontsize=7, color="#c0392b")
    ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=60, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if goals:
        ax.legend(fontsize=8)


def plot(result: Mapping[str, Any], path: Path) -> Path | None:
    """Write the figure; returns its path, or None when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    patterns = (result.get("restart") or {}).get("patterns") or {}
    steady = (result.get("steady") or {}).get("cells") or {}
    work, memory = result.get("work") or {}, result.get("memory") or {}
    if not (patterns or steady or work or memory):
        return None
    fig, axes = plt.subplots(2, 2, figsize=(14, 10))
    (a_drain, a_ttf), (a_steady, a_mem) = axes

    labels, stats, failed = [], [], []
    for pattern, lags in patterns.items():
        for lag, per in lag_items(lags):
            if per.get("role", "drain") == "drain":
                labels.append(f"{pattern} {int(lag):,}")
                stats.append(_stat(per, "ratio_records_per_s"))
                failed.append(failures(per))
    if work:
        labels.append(f"{work.get('pattern')} {int(work.get('lag', 0)):,} +{work.get('work_us')} µs")
        stats.append(_stat(work, "ratio_records_per_s"))
        failed.append(failures(work))
    if labels:
        _bars(
            a_drain,
            labels,
            stats,
            [(0.95, "goal async 0.95"), (0.5, "goal per-message sync 0.5")],
            "fastrecover ÷ plain records/s (paired)",
            "Restart → drained per commit pattern and lag (red bar: repeats spread > 10 %)",
            failed,
        )
    else:
        a_drain.set_visible(False)

    auto = patterns.get("auto") or {}
    lags = [lag for lag, _ in lag_items(auto)]
    if lags:
        xs = [float(lag) for lag in lags]
        for mode in MODES:
            _errorbar(
                a_ttf,
                xs,
                [_stat(auto[lag].get(mode, {}), "total_s") for lag in lags],
                color=_COLORS[mode],
                label=f"{mode}: restart → fresh",
            )
        a_ttf.set_xscale("log")
        a_ttf.set_yscale("log")
        a_ttf.set_xlabel("lag (records)")
        a_ttf.set_ylabel("seconds (log)")
        a_ttf.set_title("Time until the first record produced after the restart is delivered", fontsize=10)
        a_ttf.legend(fontsize=8)
        a_ttf.grid(True, which="both", alpha=0.3)
    else:
        a_ttf.set_visible(False)

    if steady:
        _bars(
            a_steady,
            [f"{per.get('api')} {per.get('pattern')}" for per in steady.values()],
            [_stat(per, "cpu_ratio") for per in steady.values()],
            [(0.95, "goal 0.95 (poll, consume auto)")],
            "plain CPU ÷ fastrecover CPU per record",
            "Steady state, mode on, no open range: caller-thread CPU (paired)",
            [failures(per) for per in steady.values()],
        )
    else:
        a_steady.set_visible(False)

    if memory:
        for mode in MODES:
            series = (memory.get(mode) or {}).get("rss_series") or []
            if series:
                a_mem.plot([p[0] for p in series], [p[1] for p in series], color=_COLORS[mode], label=mode)
        a_mem.set_xlabel("seconds since the consumer was created (restart)")
        a_mem.set_ylabel("RSS (MiB)")
        a_mem.set_title(
            f"RSS while catching up a lag of {int(memory.get('lag', 0)):,} records, auto-commit (one run)", fontsize=10
        )
        a_mem.set_ylim(bottom=0)
        a_mem.legend(fontsize=8)
        a_mem.grid(True, alpha=0.3)
    else:
        a_mem.set_visible(False)

    machine = result.get("machine", {})
    fig.suptitle(
        f"fastrecover benchmarks — {machine.get('cpu_model', '?')}, {machine.get('cpus', '?')} CPUs, "
        f"Kafka {machine.get('kafka_version', '?')}, {result.get('finished', '')}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
