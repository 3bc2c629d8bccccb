"""Pure parts of the benchmark report: statistics over repeats and the Markdown tables.

Every figure is a :class:`Stat`: the median of the repeats with their min and
max (and the raw values, kept in the JSON).  Nothing here does I/O except
:func:`replace_between_markers`, which rewrites one block of a text.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TABLE_START = "<!-- bench-table:start -->"
TABLE_END = "<!-- bench-table:end -->"


@dataclass(frozen=True)
class Stat:
    """Median, min and max of the repeats of one figure (``n`` = how many runs produced a value)."""

    median: float | None
    low: float | None
    high: float | None
    n: int
    values: tuple[float, ...] = ()

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat:
        got = tuple(float(v) for v in values if v is not None and not math.isnan(float(v)))
        if not got:
            return cls(None, None, None, 0, ())
        return cls(statistics.median(got), min(got), max(got), len(got), got)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stat:
        return cls(
            data.get("median"), data.get("min"), data.get("max"), int(data.get("n", 0)), tuple(data.get("values", ()))
        )

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n, "values": list(self.values)}

    def cell(self, digits: int = 2, scale: float = 1.0, thousands: bool = False) -> str:
        """``median (min-max)``, or ``n/a`` when no run produced a value."""
        if self.median is None or self.low is None or self.high is None:
            return "n/a"

        def num(v: float) -> str:
            return f"{v * scale:,.{digits}f}" if thousands else f"{v * scale:.{digits}f}"

        if self.n == 1:
            return f"{num(self.median)} (n=1)"
        return f"{num(self.median)} ({num(self.low)}-{num(self.high)})"


def ratio(numerator: Stat, denominator: Stat) -> float | None:
    """Ratio of two medians (None when either is missing or the denominator is 0)."""
    if numerator.median is None or denominator.median in (None, 0):
        return None
    assert denominator.median is not None
    return numerator.median / denominator.median


def paired_ratios(numerators: Sequence[float | None], denominators: Sequence[float | None]) -> Stat:
    """Ratio per repeat (run i over run i of the same repeat), summarised."""
    return Stat.of(
        None if a is None or b in (None, 0) else a / b  # type: ignore[operator]
        for a, b in zip(numerators, denominators, strict=False)
    )


def fmt_ratio(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}x"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str | None = None) -> str:
    """A GitHub Markdown table; ``align`` is one letter per column (l or r), default l then r."""
    cols = len(header)
    align = align or ("l" + "r" * (cols - 1))
    if len(align) != cols:
        raise ValueError(f"align has {len(align)} letters for {cols} columns")
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    for row in rows:
        cells = list(row)
        if len(cells) != cols:
            raise ValueError(f"row {cells!r} has {len(cells)} cells, expected {cols}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _stat(section: Mapping[str, Any], name: str) -> Stat:
    data = section.get(name)
    return Stat.from_dict(data) if isinstance(data, Mapping) else Stat.of([])


def _lag_label(lag: str | int) -> str:
    return f"{int(lag):,}"


def lag_items(section: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The per-lag entries of a section, by increasing lag (metadata keys such as measured_at skipped)."""
    return sorted(
        ((k, v) for k, v in section.items() if str(k).isdigit() and isinstance(v, Mapping)), key=lambda kv: int(kv[0])
    )


def ttf_table(ttf: Mapping[str, Any]) -> str:
    rows = []
    for lag, per in lag_items(ttf):
        plain, fast = per.get("plain", {}), per.get("fastrecover", {})
        rows.append(
            [
                _lag_label(lag),
                _stat(plain, "replay_s").cell(3),
                _stat(fast, "replay_s").cell(3),
                fmt_ratio(ratio(_stat(plain, "replay_s"), _stat(fast, "replay_s")), 1),
                _stat(plain, "total_s").cell(2),
                _stat(fast, "total_s").cell(2),
                fmt_ratio(ratio(_stat(plain, "total_s"), _stat(fast, "total_s")), 1),
                _stat(plain, "join_s").cell(2),
                _stat(fast, "join_s").cell(2),
                _stat(fast, "recovery_s").cell(3),
            ]
        )
    return markdown_table(
        [
            "lag (records)",
            "plain: assigned→fresh (s)",
            "fastrecover: joined→fresh (s)",
            "ratio",
            "plain: restart→fresh (s)",
            "fastrecover: restart→fresh (s)",
            "ratio",
            "plain: restart→joined (s)",
            "fastrecover: restart→joined (s)",
            "fastrecover: recovery (s)",
        ],
        rows,
    )


def drain_table(drain: Mapping[str, Any]) -> str:
    rows = []
    for lag, per in lag_items(drain):
        plain, fast = per.get("plain", {}), per.get("fastrecover", {})
        rows.append(
            [
                _lag_label(lag),
                _stat(plain, "drain_s").cell(2),
                _stat(fast, "drain_s").cell(2),
                fmt_ratio(ratio(_stat(plain, "drain_s"), _stat(fast, "drain_s")), 2),
                _stat(plain, "records_per_s").cell(0, thousands=True),
                _stat(fast, "records_per_s").cell(0, thousands=True),
                fmt_ratio(ratio(_stat(fast, "records_per_s"), _stat(plain, "records_per_s")), 2),
            ]
        )
    return markdown_table(
        [
            "lag (records)",
            "plain: restart→drained (s)",
            "fastrecover: restart→drained (s)",
            "ratio",
            "plain: records/s",
            "fastrecover: records/s",
            "fastrecover / plain",
        ],
        rows,
    )


STEADY_VARIANTS = ("raw", "off", "on")
STEADY_LABELS = {
    "raw": "confluent_kafka.Consumer",
    "off": "fastrecover, mode off",
    "on": "fastrecover, mode on (no open range)",
}


def steady_table(steady: Mapping[str, Any]) -> str:
    rows = []
    for api, per in steady.items():
        if not isinstance(per, Mapping):
            continue
        for variant in STEADY_VARIANTS:
            row = per.get(variant)
            if not isinstance(row, Mapping):
                continue
            rows.append(
                [
                    api,
                    STEADY_LABELS.get(variant, variant),
                    _stat(row, "records_per_s").cell(0, thousands=True),
                    _stat(row, "ratio_to_raw").cell(3) if variant != "raw" else "1",
                    _stat(row, "cpu_us_per_record").cell(3),
                    _stat(row, "cpu_ratio_to_raw").cell(3) if variant != "raw" else "1",
                ]
            )
    return markdown_table(
        [
            "API",
            "consumer",
            "records/s",
            "ratio to raw, wall clock",
            "caller-thread CPU µs/record",
            "ratio to raw, CPU",
        ],
        rows,
        align="llrrrr",
    )


def store_table(store: Mapping[str, Any]) -> str:
    rows = []
    for backend, per in store.items():
        if not isinstance(per, Mapping):
            continue
        if "error" in per:
            rows.append([backend, "n/a", "n/a", "n/a", "n/a", "n/a"])
            continue
        for kind in ("per_message", "batched"):
            row = per.get(kind)
            if not isinstance(row, Mapping):
                continue
            rows.append(
                [
                    backend,
                    kind.replace("_", "-")
                    + (f" ({row.get('records_per_commit')} records)" if kind == "batched" else ""),
                    _stat(row, "commits_per_s").cell(0, thousands=True),
                    _stat(row, "records_per_s").cell(0, thousands=True),
                    _stat(row, "p50_ms").cell(3),
                    _stat(row, "p99_ms").cell(3),
                ]
            )
    return markdown_table(
        ["store", "commit", "commits/s", "records/s", "p50 latency (ms)", "p99 latency (ms)"], rows, align="llrrrr"
    )


def memory_table(memory: Mapping[str, Any]) -> str:
    rows = []
    for mode in ("plain", "fastrecover"):
        row = memory.get(mode)
        if not isinstance(row, Mapping):
            continue
        rows.append(
            [
                mode,
                _stat(row, "base_rss_mib").cell(1),
                _stat(row, "peak_rss_mib").cell(1),
                _stat(row, "growth_mib").cell(1),
                _stat(row, "max_child_queue").cell(0, thousands=True),
            ]
        )
    return markdown_table(
        ["consumer", "RSS before assignment (MiB)", "peak RSS (MiB)", "growth (MiB)", "max child queue (records)"],
        rows,
    )


def format_report(result: Mapping[str, Any]) -> str:
    """All sections present in ``result`` as Markdown (headings and tables)."""
    parts: list[str] = []
    sections = [
        ("ttf", "Time to fresh data after a restart", ttf_table),
        ("drain", "Time to drain the lag and the live records", drain_table),
        ("steady", "Steady state, no crash (ratio to raw confluent_kafka.Consumer)", steady_table),
        ("store", "Cost of the range store (backfill commits)", store_table),
        ("memory", "Memory while backfilling", memory_table),
    ]
    for key, title, table in sections:
        data = result.get(key)
        if data:
            parts.append(f"#### {title}\n\n{table(data)}")
    spark = result.get("spark")
    if isinstance(spark, Mapping) and spark.get("table"):
        parts.append(f"#### Spark source after downtime\n\n{spark['table']}")
    return "\n\n".join(parts)


def replace_between_markers(text: str, block: str, start: str = TABLE_START, end: str = TABLE_END) -> str:
    """Put ``block`` between the two marker lines of ``text`` (ValueError if they are missing)."""
    i, j = text.find(start), text.find(end)
    if i < 0 or j < 0 or j < i:
        raise ValueError(f"markers {start!r} ... {end!r} not found")
    return text[: i + len(start)] + "\n" + block.strip("\n") + "\n" + text[j:]
