"""``fastrecover status``: the range table, and ``--watch``, which redraws it with progress bars and ETAs.

Everything but :func:`watch` is pure formatting (values in, strings out), so
it is unit-tested without a store or a terminal.  :func:`watch` is the loop:
it reads the ranges through a callable the CLI gives it, measures each open
range's progress rate between refreshes (:class:`RateTracker`), and redraws
the table in place on a terminal (cursor home, each line cleared to its end,
the rest of the screen cleared) or, without one, prints successive tables.
Ctrl-C ends it normally.
"""

from __future__ import annotations

import math
import shutil
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from fastrecover.tables import format_table, printable
from fastrecover.tokens import Token

STATUS_HEADER = (
    "GROUP",
    "TOPIC",
    "PART",
    "ID",
    "RANGE",
    "COMMITTED",
    "PROGRESS",
    "REMAINING",
    "SKIPPED",
    "OWNER",
    "EPOCH",
    "STATE",
)
WATCH_HEADER = ("GROUP", "TOPIC", "PART", "ID", "PROGRESS", "REMAINING", "RATE", "ETA", "RANGE", "OWNER", "STATE")
_RIGHT_ALIGNED = frozenset({"PART", "ID", "COMMITTED", "PROGRESS", "REMAINING", "SKIPPED", "EPOCH"})
_WATCH_RIGHT_ALIGNED = frozenset({"PART", "ID", "REMAINING", "RATE", "ETA"})  # the bars line up on the left

#: Shown where an estimate is not known yet (first refresh, or no progress in the window).
UNKNOWN = "—"
BAR_WIDTH = 20

# Terminal control sequences (ECMA-48): cursor home, clear to end of line / of screen, hide / show cursor.
HOME = "\x1b[H"
CLEAR_SCREEN = "\x1b[2J"
CLEAR_LINE = "\x1b[K"
CLEAR_BELOW = "\x1b[J"
HIDE_CURSOR = "\x1b[?25l"
SHOW_CURSOR = "\x1b[?25h"


def fraction_done(token: Token) -> float:
    """0.0 .. 1.0: finished records of the range (committed prefix and out-of-order ones) over its size."""
    p = token.progress
    size = p.end - p.start
    return 1.0 if size == 0 else (size - p.remaining) / size


def progress_bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """``[#########-----------]``: ``width`` cells, a cell filled only when it is fully earned.

    Rounding down means a bar is full only at 100 %; NaN and values outside
    0..1 are clamped.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    f = 0.0 if math.isnan(fraction) else min(1.0, max(0.0, fraction))
    filled = math.floor(f * width + 1e-9)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def format_duration(seconds: float | None) -> str:
    """``—`` (unknown), ``42 s``, ``3 min 05 s``, ``2 h 03 min``, ``>99 h``."""
    if seconds is None or math.isnan(seconds) or seconds < 0 or math.isinf(seconds):
        return UNKNOWN
    s = math.ceil(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 100 * 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return ">99 h"


def format_rate(rate: float | None) -> str:
    """Records per second, ``—`` when unknown."""
    if rate is None:
        return UNKNOWN
    return f"{rate:,.0f}/s" if rate >= 10 else f"{rate:.1f}/s"


def eta_seconds(remaining: int, rate: float | None) -> float | None:
    """Seconds until ``remaining`` records are done at ``rate`` per second; None when it cannot be told."""
    if remaining <= 0:
        return 0.0
    if rate is None or rate <= 0:
        return None
    return remaining / rate


@dataclass(frozen=True)
class _Sample:
    at: float
    finished: int


class RateTracker:
    """Progress rate of each range from what successive refreshes observed.

    The rate of a range is the records it finished between its oldest and
    newest sample within the last ``window_s`` seconds.  It is None until two
    samples exist, and None (unknown, not zero) while nothing moved in the
    window: the write-behind commits every 200 ms, so a short pause between
    flushes says nothing about the time left.  Clock values come from the
    caller, so the tracker is pure.
    """

    def __init__(self, window_s: float = 30.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._samples: dict[int, deque[_Sample]] = {}

    def observe(self, tokens: Sequence[Token], now: float) -> None:
        """Record what ``tokens`` show at time ``now``; ranges no longer listed are forgotten."""
        seen = set()
        for token in tokens:
            seen.add(token.id)
            p = token.progress
            samples = self._samples.setdefault(token.id, deque())
            samples.append(_Sample(now, p.end - p.start - p.remaining))
            # keep one sample older than the window, so the window is always spanned once it can be
            while len(samples) > 2 and samples[1].at <= now - self.window_s:
                samples.popleft()
        for gone in set(self._samples) - seen:
            del self._samples[gone]

    def rate(self, token_id: int) -> float | None:
        samples = self._samples.get(token_id)
        if not samples or len(samples) < 2:
            return None
        first, last = samples[0], samples[-1]
        elapsed = last.at - first.at
        moved = last.finished - first.finished
        if elapsed <= 0 or moved <= 0:
            return None
        return moved / elapsed


def status_row(token: Token) -> tuple[str, ...]:
    p = token.progress
    return (
        printable(token.group),
        printable(token.topic),
        str(token.partition),
        str(token.id),
        f"[{p.start}, {p.end})",
        str(p.committed),
        f"{100.0 * fraction_done(token):.1f}%",
        str(p.remaining),
        str(token.skipped),
        printable(token.owner) if token.owner else "-",
        str(token.epoch),
        token.state.value,
    )


def _ordered(tokens: Sequence[Token]) -> list[Token]:
    return sorted(tokens, key=lambda t: (t.group, t.topic, t.partition, t.span.start))


def format_status(tokens: Sequence[Token]) -> str:
    """A plain-text table, one line per range, sorted by group/topic/partition/offset."""
    return format_table(STATUS_HEADER, [status_row(t) for t in _ordered(tokens)], _RIGHT_ALIGNED)


def summary(tokens: Sequence[Token], *, include_done: bool, scope: str) -> str:
    """``3 open ranges of group 'g': 3342 records left to backfill, 0 skipped (lost to retention)``."""
    what = "ranges" if include_done else "open ranges"
    open_tokens = [t for t in tokens if t.is_open]
    remaining = sum(t.progress.remaining for t in open_tokens)
    skipped = sum(t.skipped for t in tokens)
    counts = f"{len(tokens)} {what}{scope}"
    if include_done:
        superseded = sum(1 for t in tokens if t.is_superseded)
        counts += f" ({len(open_tokens)} open" + (f", {superseded} superseded" if superseded else "") + ")"
    return f"{counts}: {remaining} records left to backfill, {skipped} skipped (lost to retention)"


def watch_row(token: Token, rate: float | None) -> tuple[str, ...]:
    p = token.progress
    fraction = fraction_done(token)
    running = token.is_open
    return (
        printable(token.group),
        printable(token.topic),
        str(token.partition),
        str(token.id),
        f"{progress_bar(fraction)} {100.0 * fraction:5.1f}%",
        str(p.remaining),
        format_rate(rate) if running else "-",
        format_duration(eta_seconds(p.remaining, rate)) if running else "-",
        f"[{p.start}, {p.end})",
        printable(token.owner) if token.owner else "-",
        token.state.value,
    )


def format_watch(
    tokens: Sequence[Token],
    tracker: RateTracker,
    *,
    title: str,
    include_done: bool,
    scope: str,
    width: int | None = None,
    height: int | None = None,
) -> str:
    """One screen of ``status --watch``: title, table with bars and ETAs, summary and total ETA.

    With ``width``/``height`` (a terminal's size) lines are cut to the width and
    rows that do not fit are summarised, so redrawing in place never scrolls.
    """
    ordered = _ordered(tokens)
    rows = [watch_row(t, tracker.rate(t.id)) for t in ordered]
    open_tokens = [t for t in ordered if t.is_open]
    rates = [tracker.rate(t.id) for t in open_tokens]
    remaining = sum(t.progress.remaining for t in open_tokens)
    total_rate = sum(r for r in rates if r is not None) if any(r is not None for r in rates) else None
    eta = format_duration(eta_seconds(remaining, total_rate))
    footer = [
        summary(tokens, include_done=include_done, scope=scope),
        f"backfill rate {format_rate(total_rate)}, estimated time left {eta}",
    ]
    hidden = 0
    if height is not None:
        # rows that fit beside the title, blank, header, blank, two footer lines and the cursor's line
        room = max(1, height - 7)
        if len(rows) > room:
            shown = max(1, room - 1)  # one line goes to "... more"
            hidden = len(rows) - shown
            rows = rows[:shown]
    lines = [title, ""]
    lines += format_table(WATCH_HEADER, rows, _WATCH_RIGHT_ALIGNED).splitlines() if ordered else ["no ranges" + scope]
    if hidden:
        lines.append(f"... {hidden} more range(s) not shown (a taller terminal shows them)")
    lines += ["", *footer]
    if width is not None:
        lines = [line[:width] for line in lines]
    return "\n".join(lines)


def _encodable(text: str, encoding: str | None) -> str:
    """``text`` as the stream can take it: ``—`` becomes ``-``, other characters ``?``, never an error."""
    try:
        text.encode(encoding or "utf-8")
        return text
    except (UnicodeEncodeError, LookupError):
        text = text.replace(UNKNOWN, "-")
        return text.encode(encoding or "ascii", errors="replace").decode(encoding or "ascii")


def watch(
    fetch: Callable[[], Sequence[Token]],
    *,
    interval: float,
    out: TextIO,
    tty: bool,
    title: str,
    include_done: bool,
    scope: str,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Refresh the table every ``interval`` seconds until Ctrl-C (KeyboardInterrupt), which returns normally.

    On a terminal each refresh redraws the screen in place; otherwise each one
    prints a complete table followed by a blank line, so the output can be
    piped or logged.  Errors from ``fetch`` propagate.
    """
    tracker = RateTracker(window_s=max(30.0, 5 * interval))
    if tty:
        out.write(HIDE_CURSOR + HOME + CLEAR_SCREEN)
    try:
        while True:
            tokens = fetch()
            tracker.observe(tokens, clock())
            stamp = time.strftime("%H:%M:%S")
            head = f"{title}  {stamp}, every {interval:g} s; Ctrl-C to quit"
            if tty:
                size = shutil.get_terminal_size()
                screen = format_watch(
                    tokens,
                    tracker,
                    title=head,
                    include_done=include_done,
                    scope=scope,
                    width=size.columns,
                    height=size.lines,
                )
                text = HOME + "".join(line + CLEAR_LINE + "\n" for line in screen.split("\n")) + CLEAR_BELOW
            else:
                text = format_watch(tokens, tracker, title=head, include_done=include_done, scope=scope) + "\n\n"
            out.write(_encodable(text, getattr(out, "encoding", None)))
            out.flush()
            sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        if tty:
            out.write(SHOW_CURSOR)
            out.flush()
