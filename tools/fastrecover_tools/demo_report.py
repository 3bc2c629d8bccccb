"""What ``fastrecover demo`` measured: the ledgers read back, the comparison table and the latency plot.

Every figure comes from two records of the run: what the producer's delivery
callbacks acknowledged (``(partition, offset) -> create timestamp``), and the
ledger each consumer process appended to for every record it finished
(``topic partition offset done_ms produced_ms member token epoch``, the worker's
``--member`` format).  Nothing here talks to Kafka or the store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

#: The member name the demo gives the restarted consumer process (the first one is "first").
RESTARTED = "second"
#: A record delivered later than this after it was produced is part of the lag; once no such
#: delivery comes any more, the consumer has caught up.
LATE_MS = 1000
#: The one definition of "caught up" the demo prints, in its progress lines and in its table.
CAUGHT_UP_MEANING = f"the last record delivered more than {LATE_MS / 1000:g} s after it was produced"
CAUGHT_UP = f"caught up: {CAUGHT_UP_MEANING}"


@dataclass
class Delivery:
    done_ms: int
    produced_ms: int
    member: str
    backfill: bool  # read from a backfill range by the child (fastrecover), not by the primary


class Ledger:
    """A worker ledger, read incrementally while the consumers still append to it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 0
        self._partial = ""
        self.first: dict[tuple[int, int], int] = {}  # (partition, offset) -> first delivery (ms)
        self.deliveries = 0
        self.after_restart: list[Delivery] = []
        self.last_late_ms = 0  # the restarted consumer's latest delivery of a record older than LATE_MS
        self.last_done_ms = 0

    def read(self) -> None:
        """Take in the lines appended since the last call (a line still being written waits)."""
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as f:
            f.seek(self._pos)
            chunk = f.read()
            self._pos = f.tell()
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()
        for line in lines:
            parts = line.split()
            if len(parts) != 8:
                continue
            _topic, partition, offset, done_ms, produced_ms, member, token, _epoch = parts
            key = (int(partition), int(offset))
            done = int(done_ms)
            self.deliveries += 1
            if key not in self.first or done < self.first[key]:
                self.first[key] = done
            if member == RESTARTED:
                self.after_restart.append(Delivery(done, int(produced_ms), member, token != "-"))
                self.last_done_ms = max(self.last_done_ms, done)
                if done - int(produced_ms) > LATE_MS:
                    self.last_late_ms = max(self.last_late_ms, done)

    def missing(self, acked: Mapping[tuple[int, int], int], produced_before_ms: float | None = None) -> int:
        """Acknowledged records (produced before ``produced_before_ms``, if given) not delivered yet."""
        return sum(
            1
            for key, ts in acked.items()
            if (produced_before_ms is None or ts < produced_before_ms) and key not in self.first
        )


def caught_up_s(ledger: Ledger, restart_wall: float) -> float | None:
    """Seconds from the restart to the last delivery later than LATE_MS (None: no late delivery yet)."""
    return (ledger.last_late_ms - restart_wall * 1000) / 1000 if ledger.last_late_ms else None


def lag_at(acked: Mapping[tuple[int, int], int], committed: Mapping[int, int], wall: float) -> int:
    """Records produced before ``wall`` (epoch s) at or past the committed offset of their partition."""
    wall_ms = wall * 1000
    return sum(1 for (p, o), ts in acked.items() if ts < wall_ms and o >= committed.get(p, 0))


@dataclass
class StoryResult:
    """One run of the story, measured."""

    label: str  # "plain" or "fastrecover"
    consumer: str
    lag_at_restart: int
    time_to_fresh_s: float | None
    backlog_delivered_s: float | None  # every record produced before the restart delivered
    caught_up_s: float | None  # the last record delivered more than LATE_MS after it was produced
    acked: int
    delivered: int  # distinct acknowledged records delivered
    lost: int
    duplicates: int
    open_ranges_left: int | None  # None: no store (the plain consumer)
    crash_to_fresh_s: float | None = None  # from the SIGKILL to the first record produced after the restart
    down_s: float | None = None  # from the SIGKILL to the restart (the new process started)
    samples: list[tuple[float, float, bool]] = field(default_factory=list, repr=False)  # (t, latency, backfill)

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        del out["samples"]
        return out


def measure(
    label: str,
    consumer: str,
    ledger: Ledger,
    acked: Mapping[tuple[int, int], int],
    *,
    restart_wall: float,
    lag_at_restart: int,
    open_ranges_left: int | None,
    crash_wall: float | None = None,
) -> StoryResult:
    """The story's numbers from the producer's acknowledgements and the finished ledger."""
    ledger.read()
    restart_ms = restart_wall * 1000
    first = ledger.first
    fresh = [first[k] for k, ts in acked.items() if ts >= restart_ms and k in first]
    # the lag: records produced before the restart that nobody had delivered by then
    backlog = [first[k] for k, ts in acked.items() if ts < restart_ms and k in first and first[k] >= restart_ms]
    delivered = sum(1 for k in acked if k in first)
    samples = [
        ((d.done_ms - restart_ms) / 1000, (d.done_ms - d.produced_ms) / 1000, d.backfill) for d in ledger.after_restart
    ]
    return StoryResult(
        label=label,
        consumer=consumer,
        lag_at_restart=lag_at_restart,
        time_to_fresh_s=(min(fresh) - restart_ms) / 1000 if fresh else None,
        crash_to_fresh_s=(min(fresh) - crash_wall * 1000) / 1000 if fresh and crash_wall is not None else None,
        down_s=restart_wall - crash_wall if crash_wall is not None else None,
        backlog_delivered_s=(max(backlog) - restart_ms) / 1000 if backlog else None,
        caught_up_s=caught_up_s(ledger, restart_wall),
        acked=len(acked),
        delivered=delivered,
        lost=len(acked) - delivered,
        duplicates=ledger.deliveries - len(first),
        open_ranges_left=open_ranges_left,
        samples=samples,
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def format_table(results: Sequence[StoryResult]) -> str:
    """The side-by-side comparison the demo prints."""
    rows: list[tuple[str, ...]] = [
        ("measured from the SIGKILL", *(r.label for r in results)),
        ("restart (a new process started)", *(_seconds(r.down_s) for r in results)),
        ("crash to the first fresh record", *(_seconds(r.crash_to_fresh_s) for r in results)),
        ("measured from the restart", *("" for _ in results)),
        ("lag at the restart (records)", *(str(r.lag_at_restart) for r in results)),
        ("time to the first fresh record", *(_seconds(r.time_to_fresh_s) for r in results)),
        ("every record produced before the restart delivered", *(_seconds(r.backlog_delivered_s) for r in results)),
        (CAUGHT_UP, *(_seconds(r.caught_up_s) for r in results)),
        ("records acknowledged by Kafka", *(str(r.acked) for r in results)),
        ("records lost (acknowledged, never delivered)", *(str(r.lost) for r in results)),
        ("duplicates (deliveries of a record after its first)", *(str(r.duplicates) for r in results)),
        (
            "open ranges left in the store",
            *("-" if r.open_ranges_left is None else str(r.open_ranges_left) for r in results),
        ),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0]), *(c.rjust(max(w, 12)) for c, w in zip(row[1:], widths[1:], strict=True))]
        lines.append("  " + "  ".join(cells))
    legend = [f"  {r.label}: {r.consumer}" for r in results]
    return "\n".join([*lines, "", *legend])


def write_json(results: Sequence[StoryResult], path: Path, story: Mapping[str, object]) -> None:
    path.write_text(
        json.dumps({"story": dict(story), "results": [r.to_json() for r in results]}, indent=2) + "\n",
        encoding="utf-8",
    )


def _thin(samples: list[tuple[float, float, bool]], limit: int = 20_000) -> list[tuple[float, float, bool]]:
    """Every k-th sample, at most ``limit``: the shape stays, the PNG stays small."""
    step = max(1, len(samples) // limit)
    return samples[::step]


def plot(results: Sequence[StoryResult], path: Path, subtitle: str) -> None:
    """A PNG: delivery latency of each record over time since the restart, one panel per consumer."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed, none opened
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.6), sharex=True, sharey=True, squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        samples = _thin(r.samples)
        series = [("records", False, "tab:red")] if r.open_ranges_left is None else []
        if r.open_ranges_left is not None:
            series = [("fresh records (primary)", False, "tab:blue"), ("backfilled lag (child)", True, "tab:orange")]
        for name, backfill, colour in series:
            xs = [t for t, _lat, b in samples if b == backfill]
            ys = [lat for _t, lat, b in samples if b == backfill]
            ax.scatter(xs, ys, s=2, color=colour, label=name, rasterized=True, linewidths=0)
        if r.time_to_fresh_s is not None:
            ax.axvline(r.time_to_fresh_s, color="tab:green", linestyle="--", linewidth=1, label="first fresh record")
        if r.caught_up_s is not None:
            ax.axvline(r.caught_up_s, color="grey", linestyle=":", linewidth=1, label="caught up")
        ax.set_title(
            f"{r.label}: fresh after {_seconds(r.time_to_fresh_s)}, caught up after {_seconds(r.caught_up_s)}",
            fontsize=10,
        )
        ax.set_xlabel("seconds since the restart")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8, markerscale=4, framealpha=0.6)
    right = max((t for r in results for t, _lat, _b in r.samples), default=1.0)
    axes[0][0].set_xlim(0, right * 1.02)
    axes[0][0].set_ylabel("delivery latency: delivered - produced (s)")
    fig.suptitle(f"fastrecover demo: each record's latency after a crash and restart\n{subtitle}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_report(results: Sequence[StoryResult], out: TextIO) -> None:
    print("\n" + format_table(results), file=out, flush=True)
