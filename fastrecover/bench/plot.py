"""The benchmark figure (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastrecover.bench.report import STEADY_VARIANTS, Stat, lag_items

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


def plot(result: Mapping[str, Any], path: Path) -> Path | None:
    """Write the figure; returns its path, or None when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ttf, drain, steady, memory = (result.get(k) or {} for k in ("ttf", "drain", "steady", "memory"))
    if not (ttf or drain or steady or memory):
        return None
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (a_ttf, a_drain), (a_steady, a_mem) = axes

    lags = [lag for lag, _ in lag_items(ttf or drain)]
    xs = [float(lag) for lag in lags]
    if ttf:
        for mode in ("plain", "fastrecover"):
            _errorbar(
                a_ttf,
                xs,
                [_stat(ttf[lag].get(mode, {}), "replay_s") for lag in lags],
                color=_COLORS[mode],
                label=f"{mode}: joined → fresh",
            )
            _errorbar(
                a_ttf,
                xs,
                [_stat(ttf[lag].get(mode, {}), "total_s") for lag in lags],
                color=_COLORS[mode],
                linestyle="--",
                alpha=0.6,
                label=f"{mode}: restart → fresh",
            )
        a_ttf.set_xscale("log")
        a_ttf.set_yscale("log")
        a_ttf.set_xlabel("lag (records)")
        a_ttf.set_ylabel("seconds (log)")
        a_ttf.set_title("Time until the first record produced after the restart is delivered")
        a_ttf.legend(fontsize=8)
        a_ttf.grid(True, which="both", alpha=0.3)
    else:
        a_ttf.set_visible(False)

    if drain:
        for mode in ("plain", "fastrecover"):
            _errorbar(
                a_drain,
                xs,
                [_stat(drain[lag].get(mode, {}), "drain_s") for lag in lags],
                color=_COLORS[mode],
                label=mode,
            )
        a_drain.set_xscale("log")
        a_drain.set_yscale("log")
        a_drain.set_xlabel("lag (records)")
        a_drain.set_ylabel("seconds (log)")
        a_drain.set_title("Restart → every lag and live record delivered")
        a_drain.legend(fontsize=8)
        a_drain.grid(True, which="both", alpha=0.3)
    else:
        a_drain.set_visible(False)

    if steady:
        labels, meds, los, his = [], [], [], []
        for api, per in steady.items():
            if not isinstance(per, Mapping):
                continue
            for variant in STEADY_VARIANTS[1:]:
                s = _stat(per.get(variant, {}), "cpu_ratio_to_raw")
                if s.median is None:
                    continue
                labels.append(f"{api}\nmode {variant}")
                meds.append(s.median)
                los.append(s.median - (s.low or s.median))
                his.append((s.high or s.median) - s.median)
        a_steady.bar(range(len(labels)), meds, yerr=[los, his], capsize=4, color="#5d6d7e")
        a_steady.axhline(1.0, color="black", linewidth=0.8)
        a_steady.axhline(0.95, color="#c0392b", linestyle=":", label="goal 0.95")
        a_steady.set_xticks(range(len(labels)), labels, fontsize=8)
        a_steady.set_ylabel("raw CPU per record ÷ ours (1 = as fast)")
        a_steady.set_title("Steady state, no crash: caller-thread CPU ratio to raw (paired)")
        a_steady.legend(fontsize=8)
    else:
        a_steady.set_visible(False)

    if memory:
        for mode in ("plain", "fastrecover"):
            series = (memory.get(mode) or {}).get("rss_series") or []
            if series:
                a_mem.plot([p[0] for p in series], [p[1] for p in series], color=_COLORS[mode], label=mode)
        a_mem.set_xlabel("seconds since the consumer was created (restart)")
        a_mem.set_ylabel("RSS (MiB)")
        a_mem.set_title(f"RSS while catching up a lag of {int(memory.get('lag', 0)):,} records (one run)")
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
