"""Pure parts of the benchmark report: statistics over repeats, the goals of issue 9, the Markdown tables.

Every figure is a :class:`Stat`: the median of the repeats with their min and
max (and the raw values, kept in the JSON).  Nothing here does I/O except
:func:`replace_between_markers`, which rewrites one block of a text.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TABLE_START = "<!-- bench-table:start -->"
TABLE_END = "<!-- bench-table:end -->"

#: Repeats whose (max - min) / median exceeds this are flagged: the figure cannot tell 0.9x from 1.0x.
SPREAD_LIMIT = 0.10
#: Bootstrap resamples behind a median's confidence interval (seeded: the same values give the same interval).
_RESAMPLES = 4000
#: Fewer repeats than this give no confidence interval: a resampled median of 3 or 4 values says little.
_CI_MIN_REPEATS = 5
NOISY_MARK = "⚠"


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

    def cell(self, digits: int = 2, scale: float = 1.0, thousands: bool = False, show_spread: bool = False) -> str:
        """``median (min-max)``, or ``n/a`` when no run produced a value.

        ``show_spread`` adds the spread as a percentage of the median: ``median (min-max, 4 %)``.
        """
        if self.median is None or self.low is None or self.high is None:
            return "n/a"

        def num(v: float) -> str:
            return f"{v * scale:,.{digits}f}" if thousands else f"{v * scale:.{digits}f}"

        if self.n == 1:
            return f"{num(self.median)} (n=1)"
        flag = f" {NOISY_MARK}" if self.noisy() else ""
        spread = self.spread
        pct = f", {spread * 100:.0f} %" if show_spread and spread is not None else ""
        return f"{num(self.median)} ({num(self.low)}-{num(self.high)}{pct}){flag}"

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the repeats: how far they disagree (None below two runs or at median 0)."""
        if self.n < 2 or not self.median or self.low is None or self.high is None:
            return None
        return (self.high - self.low) / abs(self.median)

    def noisy(self, limit: float = SPREAD_LIMIT) -> bool:
        """True when the repeats disagree by more than ``limit`` (relative to the median)."""
        spread = self.spread
        return spread is not None and spread > limit

    def ci95(self) -> tuple[float, float] | None:
        """A 95 % confidence interval of the median (percentile bootstrap); None below five repeats.

        The spread says how far single repeats disagree; this says how well the median is pinned down.
        A noisy figure whose interval lies wholly on one side of a goal's threshold still decides it.
        """
        if self.n < _CI_MIN_REPEATS:
            return None
        draw = random.Random(0)
        medians = sorted(statistics.median(draw.choices(self.values, k=self.n)) for _ in range(_RESAMPLES))
        return medians[int(0.025 * _RESAMPLES)], medians[int(0.975 * _RESAMPLES) - 1]


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


# -- the matrix ---------------------------------------------------------------------------------------

MODES = ("plain", "fastrecover")
PATTERN_LABELS = {
    "auto": "auto-commit",
    "msg-async": "commit(message=m, asynchronous=True) per record",
    "msg-sync": "commit(message=m, asynchronous=False) per record",
    "batch-async": "commit() async per consume(500)",
    "batch-sync": "commit(asynchronous=False) per consume(500)",
    "store": "store_offsets(message=m) + auto-commit",
}
ASYNC_PATTERNS = ("auto", "msg-async", "batch-async", "store")
SYNC_MESSAGE_PATTERNS = ("msg-sync",)


def _pattern_label(name: str) -> str:
    return f"{name}: {PATTERN_LABELS[name]}" if name in PATTERN_LABELS else name


def restart_table(restart: Mapping[str, Any]) -> str:
    """Restart → drained per commit pattern and lag: times, records/s and the paired ratio."""
    rows = []
    for pattern, lags in (restart.get("patterns") or {}).items():
        for lag, per in lag_items(lags):
            plain, fast = per.get("plain", {}), per.get("fastrecover", {})
            rows.append(
                [
                    _pattern_label(pattern),
                    _lag_label(lag),
                    _stat(plain, "drain_s").cell(2),
                    _stat(fast, "drain_s").cell(2),
                    _stat(plain, "records_per_s").cell(0, thousands=True),
                    _stat(fast, "records_per_s").cell(0, thousands=True),
                    _stat(per, "ratio_records_per_s").cell(2),
                    _stat(plain, "cpu_us_per_record").cell(2),
                    _stat(fast, "cpu_us_per_record").cell(2),
                    _stat(per, "ratio_cpu_us_per_record").cell(2),
                ]
            )
    return markdown_table(
        [
            "commit pattern",
            "lag (records)",
            "plain: restart→drained (s)",
            "fastrecover: restart→drained (s)",
            "plain: records/s",
            "fastrecover: records/s",
            "fastrecover / plain (paired)",
            "plain: app thread µs/record",
            "fastrecover: app thread µs/record",
            "fastrecover / plain CPU (paired)",
        ],
        rows,
        align="lrrrrrrrrr",
    )


def ttf_table(restart: Mapping[str, Any], pattern: str = "auto") -> str:
    """Time to fresh per lag, from the restart runs of one pattern."""
    rows = []
    for lag, per in lag_items((restart.get("patterns") or {}).get(pattern) or {}):
        plain, fast = per.get("plain", {}), per.get("fastrecover", {})
        rows.append(
            [
                _lag_label(lag),
                _stat(plain, "total_s").cell(2),
                _stat(fast, "total_s").cell(2),
                fmt_ratio(ratio(_stat(plain, "total_s"), _stat(fast, "total_s")), 1),
                _stat(plain, "replay_s").cell(3),
                _stat(fast, "replay_s").cell(3),
                _stat(fast, "recovery_s").cell(3),
            ]
        )
    return markdown_table(
        [
            "lag (records)",
            "plain: restart→fresh (s)",
            "fastrecover: restart→fresh (s)",
            "plain / fastrecover",
            "plain: joined→fresh (s)",
            "fastrecover: joined→fresh (s)",
            "fastrecover: recovery (s)",
        ],
        rows,
    )


CRASH_SETUP_LABELS = {
    "default": "default settings",
    "static": "static membership (quickstart)",
    "kip848": "group.protocol=consumer",
    "kip848-static": "group.protocol=consumer, static",
}


def crash_items(crash: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(setup, lag, cell) of every crash cell, setups in run order, lags increasing."""
    out: list[tuple[str, str, Mapping[str, Any]]] = []
    for setup, lags in (crash.get("cells") or {}).items():
        if isinstance(lags, Mapping):
            out += [(setup, lag, per) for lag, per in lag_items(lags)]
    return out


def _fatal_cell(per: Mapping[str, Any]) -> str:
    runs = per.get("fatal_runs") or {}
    exits = per.get("fatal_exits") or {}
    if not any(exits.get(m) for m in MODES):
        return "none"
    return " / ".join(f"{int(exits.get(m) or 0)} in {int(runs.get(m) or 0)} runs" for m in MODES)


def crash_table(crash: Mapping[str, Any]) -> str:
    """Crash → first fresh record and process spawn → first fresh record, per setup and lag, both modes."""
    rows = []
    for setup, lag, per in crash_items(crash):
        plain, fast = per.get("plain", {}), per.get("fastrecover", {})
        rows.append(
            [
                CRASH_SETUP_LABELS.get(setup, setup),
                _lag_label(lag),
                _stat(plain, "crash_to_fresh_s").cell(2, show_spread=True),
                _stat(fast, "crash_to_fresh_s").cell(2, show_spread=True),
                _stat(per, "ratio_crash_to_fresh_s").cell(2),
                _stat(plain, "spawn_to_fresh_s").cell(2, show_spread=True),
                _stat(fast, "spawn_to_fresh_s").cell(2, show_spread=True),
                _stat(per, "ratio_spawn_to_fresh_s").cell(2),
                _stat(plain, "client_s").cell(3, show_spread=True),
                _stat(fast, "client_s").cell(3, show_spread=True),
                _stat(per, "ratio_client_s").cell(2),
                _fatal_cell(per),
            ]
        )
    return markdown_table(
        [
            "consumer settings",
            "lag (records)",
            "plain: crash→fresh (s)",
            "fastrecover: crash→fresh (s)",
            "fastrecover / plain (paired)",
            "plain: spawn→fresh (s)",
            "fastrecover: spawn→fresh (s)",
            "fastrecover / plain (paired)",
            "plain: ready→fresh (s)",
            "fastrecover: ready→fresh (s)",
            "fastrecover / plain (paired)",
            "fatal exits, plain / fastrecover",
        ],
        rows,
        align="lrrrrrrrrrrl",
    )


def crash_caption(crash: Mapping[str, Any]) -> str:
    """What the crash runs did, in two sentences, and the first fatal error seen."""
    down = crash.get("down_s", "?")
    group = crash.get("kip848_group") or {}
    text = (
        f"A consumer process SIGKILLed, restarted {down} s later; {crash.get('repeats', '?')} repeats. "
        "Cells: `median (min-max, spread % of the median)`. "
        "spawn→fresh is counted from the start of the process that delivered; ready→fresh from the moment that "
        "process had started its interpreter and imported what both clients share (confluent_kafka): the part "
        "each client's own code takes, without the interpreter's start, which varies by tens of milliseconds "
        "between runs and is the same for both. A process that exits on a fatal "
        f"error is restarted {crash.get('respawn_delay_s', '?')} s later. group.protocol=consumer groups: "
        f"consumer.session.timeout.ms {group.get('session_ms', '?')}, "
        f"consumer.heartbeat.interval.ms {group.get('heartbeat_ms', '?')}."
    )
    settings = crash.get("setups") or {}
    if settings:
        text += "\n\n" + "\n".join(f"- {CRASH_SETUP_LABELS.get(k, k)}: {v}" for k, v in settings.items())
    first = next((per.get("fatal_error") for _s, _l, per in crash_items(crash) if per.get("fatal_error")), None)
    if first:
        text += f"\n\nFatal error seen: `{str(first)[:300]}`"
    return text


def partition_items(section: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(partition count, cell) of the partitions runs, by increasing count."""
    return lag_items(section.get("cells") or {})


def _counted(stat: Stat) -> str:
    """A count's median and range, or its one value when the repeats agree."""
    if stat.median is None or stat.low is None or stat.high is None:
        return "n/a"
    if stat.low == stat.high:
        return f"{stat.median:,.0f}"
    return f"{stat.median:,.0f} ({stat.low:,.0f}-{stat.high:,.0f})"


#: The fastrecover arm that subscribes once its store is open: every partition gets its range.
STORE_OPEN_ARM = "fastrecover-store-open"


def partitions_table(section: Mapping[str, Any]) -> str:
    """Per partition count, the timeline users see: time to fresh, assignment, recovery, plain vs fastrecover."""
    rows = []
    for count, per in partition_items(section):
        plain, fast = per.get("plain", {}), per.get("fastrecover", {})
        rows.append(
            [
                f"{int(count):,}",
                _stat(plain, "spawn_to_fresh_s").cell(3),
                _stat(fast, "spawn_to_fresh_s").cell(3),
                _stat(per, "ratio_spawn_to_fresh_s").cell(2),
                _stat(plain, "subscribe_to_assigned_s").cell(3),
                _stat(fast, "subscribe_to_assigned_s").cell(3),
                _stat(plain, "recovery_s").cell(4),
                _stat(fast, "recovery_s").cell(3, show_spread=True),
                _counted(_stat(fast, "ranges_opened")),
            ]
        )
    return markdown_table(
        [
            "partitions per member",
            "plain: spawn→fresh (s)",
            "fastrecover: spawn→fresh (s)",
            "fastrecover / plain (paired)",
            "plain: subscribe→assigned (s)",
            "fastrecover: subscribe→assigned (s)",
            "plain: assign() in on_assign (s)",
            "fastrecover: recovery, assign() in on_assign (s)",
            "fastrecover: partitions given a range",
        ],
        rows,
        align="rrrrrrrrr",
    )


def partitions_store_table(section: Mapping[str, Any]) -> str:
    """Per partition count, the recovery with a range on every partition: its time and its store work."""
    rows = []
    for count, per in partition_items(section):
        arm = per.get(STORE_OPEN_ARM, {})
        if not isinstance(arm, Mapping) or not arm:
            continue
        rows.append(
            [
                f"{int(count):,}",
                _stat(arm, "recovery_s").cell(3, show_spread=True),
                _stat(arm, "subscribe_to_assigned_s").cell(3),
                _stat(arm, "joined_to_fresh_s").cell(3),
                _counted(_stat(arm, "ranges_opened")),
                _counted(_stat(arm, "rows")),
                f"{_counted(_stat(arm, 'recovery_statements'))} / {_counted(_stat(arm, 'recovery_commits'))}",
                f"{_counted(_stat(arm, 'statements'))} / {_counted(_stat(arm, 'store_commits'))}",
                _stat(arm, "spawn_to_lag_drained_s").cell(2),
            ]
        )
    return markdown_table(
        [
            "partitions per member",
            "recovery, assign() in on_assign (s)",
            "subscribe→assigned (s)",
            "joined→fresh (s)",
            "partitions given a range",
            "store rows",
            "store statements / transactions in the recovery",
            "store statements / transactions, to every range done",
            "spawn→lag delivered (s)",
        ],
        rows,
        align="rrrrrrrrr",
    )


def partitions_caption(section: Mapping[str, Any]) -> str:
    return (
        f"One consumer process per run on a topic of N partitions, {section.get('lag_per_partition', '?')} "
        f"records behind the committed offset on each; {section.get('repeats', '?')} repeats, the arms "
        f"interleaved. Settings: {section.get('settings', '?')}. spawn→fresh: from the process spawn to the "
        "first record produced after it; subscribe→assigned: subscribe() to the end of the application's "
        "on_assign, which calls assign() itself: with fastrecover that call is the recovery. A recovery that "
        "meets the store still opening (it opens on a thread after the first recovery) replays lags up to "
        "`fastrecover.recovery.replay.max.offsets` instead of opening ranges: the last column says how many "
        "partitions got one."
    )


def partitions_store_caption() -> str:
    return (
        "The same runs with a third arm: fastrecover subscribing once its store has opened, so every "
        "partition gets a range. Statements are the SQL statements the consumer process sent (counted from "
        "SQLAlchemy's engine events), transactions those it committed; rows are the store's rows once every "
        "range is done."
    )


def work_table(work: Mapping[str, Any]) -> str:
    plain, fast = work.get("plain", {}), work.get("fastrecover", {})
    row = [
        _pattern_label(str(work.get("pattern", "?"))),
        _lag_label(work.get("lag", 0)),
        str(work.get("work_us", "?")),
        _stat(plain, "drain_s").cell(2),
        _stat(fast, "drain_s").cell(2),
        _stat(work, "ratio_drain_s").cell(3),
    ]
    return markdown_table(
        [
            "commit pattern",
            "lag (records)",
            "work per record (µs)",
            "plain: restart→drained (s)",
            "fastrecover: restart→drained (s)",
            "fastrecover / plain time (paired)",
        ],
        [row],
        align="lrrrrr",
    )


def steady_table(steady: Mapping[str, Any]) -> str:
    rows = []
    for cell, per in (steady.get("cells") or {}).items():
        if not isinstance(per, Mapping):
            continue
        plain, fast = per.get("plain", {}), per.get("fastrecover", {})
        rows.append(
            [
                f"{per.get('api', cell)}, {_pattern_label(str(per.get('pattern', '?')))}",
                f"{int(per.get('records', 0)):,}",
                _stat(plain, "cpu_us_per_record").cell(3),
                _stat(fast, "cpu_us_per_record").cell(3),
                _stat(per, "cpu_ratio").cell(3),
                _stat(plain, "records_per_s").cell(0, thousands=True),
                _stat(fast, "records_per_s").cell(0, thousands=True),
                _stat(per, "wall_ratio").cell(3),
            ]
        )
    return markdown_table(
        [
            "API, commit pattern",
            "records per run",
            "plain: caller CPU µs/record",
            "fastrecover: caller CPU µs/record",
            "plain CPU / fastrecover CPU (paired)",
            "plain: records/s",
            "fastrecover: records/s",
            "fastrecover / plain wall clock (paired)",
        ],
        rows,
        align="lrrrrrrr",
    )


# -- goals ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """One goal of issue 9, evaluated on one run: ``value`` against ``threshold`` with ``op``."""

    name: str
    value: float | None
    op: str  # ">=" or "<="
    threshold: float
    spread: float | None = None
    failures: int = 0  # runs of the cell that failed (worker error, timeout): the goal is missed
    ci95: tuple[float, float] | None = None  # of the median value (Stat.ci95)

    @property
    def met(self) -> bool | None:
        if self.failures:
            return False
        if self.value is None:
            return None
        return self.value >= self.threshold if self.op == ">=" else self.value <= self.threshold

    @property
    def noisy(self) -> bool:
        return self.spread is not None and self.spread > SPREAD_LIMIT

    def to_dict(self) -> dict[str, Any]:
        return {
            "goal": self.name,
            "value": self.value,
            "target": f"{self.op} {self.threshold:g}",
            "met": self.met,
            "spread": self.spread,
            "noisy": self.noisy,
            "failures": self.failures,
            "ci95": None if self.ci95 is None else list(self.ci95),
        }


def failures(cell: Mapping[str, Any]) -> int:
    """How many runs of a cell failed (``errors``: mode -> list of messages)."""
    errors = cell.get("errors") or {}
    return sum(len(v) for v in errors.values() if isinstance(v, list)) if isinstance(errors, Mapping) else 0


def _goal(name: str, cell: Mapping[str, Any], metric: str, op: str, threshold: float) -> Goal:
    stat = _stat(cell, metric)
    return Goal(name, stat.median, op, threshold, stat.spread, failures(cell), stat.ci95())


def evaluate_goals(result: Mapping[str, Any]) -> list[Goal]:
    """The goals of issue 9, fastrecover against plain in the same run (paired medians).

    A goal whose figures were not measured has ``value`` None (met: None), so a
    partial run (``--only``) shows what it could not judge instead of passing it.
    """
    goals: list[Goal] = []
    patterns = (result.get("restart") or {}).get("patterns") or {}
    for pattern in (*ASYNC_PATTERNS, *SYNC_MESSAGE_PATTERNS):
        threshold = 0.95 if pattern in ASYNC_PATTERNS else 0.5
        cells = [
            (lag, per) for lag, per in lag_items(patterns.get(pattern) or {}) if per.get("role", "drain") == "drain"
        ]
        if not cells:
            goals.append(Goal(f"drain records/s, {pattern}: fastrecover / plain", None, ">=", threshold))
        for lag, per in cells:
            goals.append(
                _goal(
                    f"drain records/s, {pattern}, lag {_lag_label(lag)}: fastrecover / plain",
                    per,
                    "ratio_records_per_s",
                    ">=",
                    threshold,
                )
            )
    steady = (result.get("steady") or {}).get("cells") or {}
    for api in ("poll", "consume"):
        goals.append(
            _goal(
                f"steady state, {api}, auto-commit, mode on: plain CPU / fastrecover CPU per record",
                steady.get(f"{api}/auto") or {},
                "cpu_ratio",
                ">=",
                0.95,
            )
        )
    work = result.get("work") or {}
    goals.append(
        _goal(
            f"{work.get('work_us', 20)} µs work per record, restart→drained: fastrecover / plain time",
            work,
            "ratio_drain_s",
            "<=",
            1.05,
        )
    )
    goals.append(_ttf_goal(patterns.get("auto") or {}))
    crash = result.get("crash") or {}
    if crash.get("cells"):
        goals += crash_goals(crash)
    section = result.get("partitions") or {}
    if section.get("cells"):
        goals += partition_goals(section)
    return goals


#: Issue 31: the recovery of this many partitions per member takes at most RECOVERY_GOAL_S.
RECOVERY_GOAL_PARTITIONS = 2048
RECOVERY_GOAL_S = 1.0
#: Time to fresh is flat in the partition count: fastrecover's spawn→fresh at the most partitions over the fewest.
FLAT_LIMIT = 1.5


def partition_goals(section: Mapping[str, Any]) -> list[Goal]:
    """Issue 31's goals on the partitions runs: the recovery at 2,048 partitions, time to fresh flat."""
    items = {int(count): per for count, per in partition_items(section)}
    goals: list[Goal] = []
    per = items.get(RECOVERY_GOAL_PARTITIONS)
    for arm, how in (("fastrecover", "as it starts"), (STORE_OPEN_ARM, "a range on every partition")):
        name = f"recovery of {RECOVERY_GOAL_PARTITIONS:,} partitions per member, {how}: assign() in on_assign (s)"
        if per is None or not per.get(arm):
            goals.append(Goal(name, None, "<=", RECOVERY_GOAL_S))
            continue
        stat = _stat(per.get(arm, {}), "recovery_s")
        failed = len(((per.get("errors") or {}).get(arm)) or [])
        goals.append(Goal(name, stat.median, "<=", RECOVERY_GOAL_S, stat.spread, failed))
    flat = "time to fresh flat in partitions: fastrecover spawn→fresh, most / fewest partitions per member"
    if len(items) < 2:
        goals.append(Goal(flat, None, "<=", FLAT_LIMIT))
        return goals
    few, many = min(items), max(items)
    f_stat = _stat(items[few].get("fastrecover", {}), "spawn_to_fresh_s")
    m_stat = _stat(items[many].get("fastrecover", {}), "spawn_to_fresh_s")
    spreads = [x for x in (f_stat.spread, m_stat.spread) if x is not None]
    goals.append(
        Goal(
            f"{flat} ({many:,} / {few:,})",
            ratio(m_stat, f_stat),
            "<=",
            FLAT_LIMIT,
            max(spreads) if spreads else None,
            failures(items[few]) + failures(items[many]),
        )
    )
    return goals


#: Issue 31: process spawn → first fresh record, fastrecover / plain, at these lags (static membership).
SPAWN_GOALS = {1_000: 1.0, 10_000: 1.0, 1_000_000: 0.2, 10_000_000: 0.02}
#: Issue 31: crash → first fresh record with the quickstart's settings is at most the downtime plus this.
CRASH_MARGIN_S = 0.5


def crash_goals(crash: Mapping[str, Any], setup: str = "static") -> list[Goal]:
    """Issue 31's goals on the crash runs with the quickstart's settings (static membership)."""
    goals: list[Goal] = []
    cells = lag_items((crash.get("cells") or {}).get(setup) or {})
    down = float(crash.get("down_s") or 0.0)
    for lag, per in cells:
        stat = _stat(per.get("fastrecover", {}), "crash_to_fresh_s")
        goals.append(
            Goal(
                f"crash→fresh, quickstart settings, restart {down:g} s after the kill, lag {_lag_label(lag)}: "
                "fastrecover (s)",
                stat.median,
                "<=",
                down + CRASH_MARGIN_S,
                stat.spread,
                failures(per),
                stat.ci95(),
            )
        )
    for lag, per in cells:
        threshold = SPAWN_GOALS.get(int(lag))
        if threshold is None:
            continue
        label = _lag_label(lag)
        goals.append(
            _goal(
                f"spawn→fresh, quickstart settings, lag {label}: fastrecover / plain",
                per,
                "ratio_spawn_to_fresh_s",
                "<=",
                threshold,
            )
        )
        if threshold >= 1.0:  # plain's own time: the same comparison without the interpreter's noisy start
            goals.append(
                _goal(
                    f"ready→fresh (spawn→fresh less the shared start), lag {label}: fastrecover / plain",
                    per,
                    "ratio_client_s",
                    "<=",
                    threshold,
                )
            )
    return goals


def _ttf_goal(auto: Mapping[str, Any]) -> Goal:
    """fastrecover's restart→fresh at the largest lag over the smallest: flat means near 1."""
    items = lag_items(auto)
    name = "time to fresh flat: fastrecover restart→fresh, largest / smallest lag"
    if len(items) < 2:
        return Goal(name, None, "<=", 1.5)
    (small, s_per), (large, l_per) = items[0], items[-1]
    s_stat, l_stat = _stat(s_per.get("fastrecover", {}), "total_s"), _stat(l_per.get("fastrecover", {}), "total_s")
    spreads = [x for x in (s_stat.spread, l_stat.spread) if x is not None]
    return Goal(
        f"{name} ({_lag_label(large)} / {_lag_label(small)})",
        ratio(l_stat, s_stat),
        "<=",
        1.5,
        max(spreads) if spreads else None,
        failures(s_per) + failures(l_per),
    )


def goals_table(goals: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for g in goals:
        value = g.get("value")
        met = g.get("met")
        spread = g.get("spread")
        failed = int(g.get("failures") or 0)
        verdict = "not measured" if met is None else ("yes" if met else "**no**")
        if failed:
            verdict += f" ({failed} failed run{'s' if failed > 1 else ''})"
        ci = g.get("ci95")
        rows.append(
            [
                str(g.get("goal")),
                "n/a" if value is None else f"{value:.3f}",
                "n/a" if not ci else f"{ci[0]:.3f}-{ci[1]:.3f}",
                str(g.get("target")),
                verdict,
                "n/a" if spread is None else f"{spread * 100:.0f} %" + (f" {NOISY_MARK}" if g.get("noisy") else ""),
            ]
        )
    header = ["goal", "value", "95 % interval of the median", "target", "met?", "spread of repeats"]
    return markdown_table(header, rows, align="lrrlll")


def failed_cells(result: Mapping[str, Any]) -> list[str]:
    """Every cell with failed runs, with the first error of each: a missed goal must say why."""
    out: list[str] = []
    cells: list[tuple[str, Mapping[str, Any]]] = []
    for pattern, lags in ((result.get("restart") or {}).get("patterns") or {}).items():
        cells += [(f"restart {pattern} lag {_lag_label(lag)}", per) for lag, per in lag_items(lags)]
    cells += [(f"steady {cell}", per) for cell, per in ((result.get("steady") or {}).get("cells") or {}).items()]
    cells += [
        (f"crash {setup} lag {_lag_label(lag)}", per) for setup, lag, per in crash_items(result.get("crash") or {})
    ]
    cells += [(f"partitions {int(n):,}", per) for n, per in partition_items(result.get("partitions") or {})]
    if result.get("work"):
        cells.append(("work", result["work"]))
    for name, cell in cells:
        for mode, errors in (cell.get("errors") or {}).items():
            if errors:
                first = str(errors[0]).strip().splitlines()
                out.append(f"{name} {mode}: {len(errors)} failed, first: {first[-1] if first else '?'}")
        for mode, count in (cell.get("rebalanced") or {}).items():
            if count:
                out.append(f"{name} {mode}: {count} run(s) rebalanced mid-run (records redelivered; figures suspect)")
    return out


def noisy_cells(result: Mapping[str, Any]) -> list[str]:
    """Every headline figure whose repeats disagree by more than SPREAD_LIMIT, by name."""
    out: list[str] = []
    for pattern, lags in ((result.get("restart") or {}).get("patterns") or {}).items():
        for lag, per in lag_items(lags):
            for mode in MODES:
                if _stat(per.get(mode, {}), "records_per_s").noisy():
                    out.append(f"restart {pattern} lag {_lag_label(lag)} {mode} records/s")
            if _stat(per, "ratio_records_per_s").noisy():
                out.append(f"restart {pattern} lag {_lag_label(lag)} ratio")
    for cell, per in ((result.get("steady") or {}).get("cells") or {}).items():
        for mode in MODES:
            for metric in ("cpu_us_per_record", "records_per_s"):
                if _stat(per.get(mode, {}), metric).noisy():
                    out.append(f"steady {cell} {mode} {metric}")
    for setup, lag, per in crash_items(result.get("crash") or {}):
        for mode in MODES:
            for metric in ("crash_to_fresh_s", "spawn_to_fresh_s"):
                if _stat(per.get(mode, {}), metric).noisy():
                    out.append(f"crash {setup} lag {_lag_label(lag)} {mode} {metric}")
    for count, per in partition_items(result.get("partitions") or {}):
        for mode in MODES:
            if _stat(per.get(mode, {}), "spawn_to_fresh_s").noisy():
                out.append(f"partitions {int(count):,} {mode} spawn_to_fresh_s")
        for arm in ("fastrecover", STORE_OPEN_ARM):
            if _stat(per.get(arm, {}), "recovery_s").noisy():
                out.append(f"partitions {int(count):,} {arm} recovery_s")
    work = result.get("work") or {}
    for mode in MODES:
        if _stat(work.get(mode, {}), "drain_s").noisy():
            out.append(f"work {mode} drain_s")
    return out


def format_report(result: Mapping[str, Any]) -> str:
    """All sections present in ``result`` as Markdown (headings and tables), goals last."""
    parts: list[str] = []
    restart = result.get("restart") or {}
    if restart.get("patterns"):
        parts.append(
            "#### Restart → drained, per commit pattern (lag behind the last commit, then live records)\n\n"
            "records/s and the application thread's CPU per record are counted from just before `subscribe()` "
            "to the last record delivered (the thread that calls `consume()` and commits).\n\n" + restart_table(restart)
        )
        if (restart.get("patterns") or {}).get("auto"):
            parts.append("#### Time to fresh data after a restart (auto-commit)\n\n" + ttf_table(restart))
    crash = result.get("crash") or {}
    if crash.get("cells"):
        parts.append(
            "#### Crash → first fresh record (SIGKILL, restart after a downtime)\n\n"
            + crash_caption(crash)
            + "\n\n"
            + crash_table(crash)
        )
    section = result.get("partitions") or {}
    if section.get("cells"):
        parts.append(
            "#### Scale in partitions: one member recovering N partitions\n\n"
            + partitions_caption(section)
            + "\n\n"
            + partitions_table(section)
        )
        store_table_text = partitions_store_table(section)
        if store_table_text.count("\n") > 1:
            parts.append(
                "#### Scale in partitions: the recovery with a range on every partition\n\n"
                + partitions_store_caption()
                + "\n\n"
                + store_table_text
            )
    if result.get("work"):
        parts.append("#### With CPU work per record\n\n" + work_table(result["work"]))
    if (result.get("steady") or {}).get("cells"):
        parts.append("#### Steady state, no crash, mode on with no open range\n\n" + steady_table(result["steady"]))
    if result.get("store"):
        parts.append("#### Cost of the range store (backfill commits)\n\n" + store_table(result["store"]))
    if result.get("memory"):
        parts.append("#### Memory while backfilling\n\n" + memory_table(result["memory"]))
    spark = result.get("spark")
    if isinstance(spark, Mapping) and spark.get("table"):
        parts.append(f"#### Spark source after downtime\n\n{spark['table']}")
    if result.get("goals"):
        parts.append("#### Goals (fastrecover / plain, same run)\n\n" + goals_table(result["goals"]))
    failed = failed_cells(result)
    if failed:
        parts.append(
            "Failed or disturbed runs (a failed run misses its cell's goal):\n\n" + "\n".join(f"- {f}" for f in failed)
        )
    noisy = result.get("noisy")
    if noisy:
        parts.append(
            f"{NOISY_MARK} = repeats disagree by more than {SPREAD_LIMIT:.0%} ((max - min) / median): "
            + "; ".join(noisy)
            + "."
        )
    return "\n\n".join(parts)


def replace_between_markers(text: str, block: str, start: str = TABLE_START, end: str = TABLE_END) -> str:
    """Put ``block`` between the two marker lines of ``text`` (ValueError if they are missing)."""
    i, j = text.find(start), text.find(end)
    if i < 0 or j < 0 or j < i:
        raise ValueError(f"markers {start!r} ... {end!r} not found")
    return text[: i + len(start)] + "\n" + block.strip("\n") + "\n" + text[j:]
