"""Tables and the plot of docs/spark.md from the benchmark JSON files beside this script.

python docs/spark-bench/report.py  -> prints Markdown tables, writes spark-bench.png
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent


def _fmt(values: list[float]) -> str:
    if not values:
        return "not measured"
    med = statistics.median(values)
    return f"{med:.2f} ({min(values):.2f}-{max(values):.2f}, n={len(values)})"


def _results() -> dict[str, dict]:
    """Every run's result by name.  A file of experiments holds several results under ``runs``, each tagged
    with its ``variant``; they are listed as ``file#name``."""
    results = {}
    for path in sorted(HERE.glob("*.json")):
        data = json.loads(path.read_text())
        nested = data.get("runs", {})
        if nested and all(isinstance(v, dict) and "variant" in v for v in nested.values()):
            results.update({f"{path.name}#{name}": r for name, r in nested.items()})
        else:
            results[path.name] = data
    return results


def main() -> int:
    results = _results()
    lines = [
        "| file | sink | lag | source | restart -> first fresh record (s) | restart -> lag drained (s) | load avg |",
        "| --- | --- | ---: | --- | --- | --- | --- |",
    ]
    plot: dict[str, dict[tuple[str, int], list[float]]] = {}  # runs of every file pooled
    failures: list[str] = []
    for name, r in results.items():
        failures += [f"{name}: {f}" for f in r.get("failed_attempts", [])]
        for sink, by_lag in r.get("runs", {}).items():
            for lag, per in by_lag.items():
                for src, runs in per.items():
                    fresh = [x["first_fresh_s"] for x in runs if x.get("first_fresh_s") is not None]
                    drain = [x["drain_s"] for x in runs if x.get("drain_s") is not None]
                    loads = [x["load_avg_1m"] for x in runs if "load_avg_1m" in x]
                    load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else ""
                    lines.append(f"| {name} | {sink} | {int(lag):,} | {src} | {_fmt(fresh)} | {_fmt(drain)} | {load} |")
                    if r.get("variant", "current") != "current":
                        continue  # a variant that did not land: in the table, not in the plot
                    plot.setdefault(f"{src} first fresh", {}).setdefault((sink, int(lag)), []).extend(fresh)
                    plot.setdefault(f"{src} drained", {}).setdefault((sink, int(lag)), []).extend(drain)
    print("\n".join(lines))
    steady_lines = ["| source | records/s after the first batch | load avg |", "| --- | --- | --- |"]
    for r in results.values():
        for src, st in r.get("steady", {}).items():
            rates = [x["rate_per_s"] for x in st["runs"] if x.get("rate_per_s")]
            loads = [x.get("load_avg_1m", 0) for x in st["runs"]]
            med = "n/a"
            if rates:
                med = f"{statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f}, n={len(rates)})"
            steady_lines.append(f"| {src} | {med} | {min(loads):.1f}-{max(loads):.1f} |")
    print()
    print("\n".join(steady_lines))
    print()
    print("failed attempts:", len(failures))
    for f in failures:
        print(" -", f)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 0
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, points in sorted(plot.items()):
        pts = sorted((lag, statistics.median(v)) for (sink, lag), v in points.items() if sink == "count" and v)
        if pts:
            ax.plot([max(p[0], 1000) for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("lag (records; 0 plotted at 1,000)")
    ax.set_ylabel("seconds after start() (median of all runs)")
    ax.set_title("Restart after downtime, count sink, 2 shared cores")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE / "spark-bench.png", dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
