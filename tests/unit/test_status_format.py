"""The pure parts of ``fastrecover status [--watch]``: progress bar, durations, ETA, the rate tracker, the screen."""

from __future__ import annotations

import math

import pytest

from fastrecover.ranges import RangeProgress
from fastrecover.status import (
    UNKNOWN,
    RateTracker,
    eta_seconds,
    format_duration,
    format_rate,
    format_status,
    format_watch,
    fraction_done,
    progress_bar,
)
from fastrecover.tables import format_table, printable
from fastrecover.tokens import Token, TokenState


def _token(done: int, *, id: int = 1, start: int = 0, end: int = 1000, group: str = "g") -> Token:
    """A range of ``[start, end)`` with its first ``done`` records committed."""
    state = TokenState.DONE if start + done >= end else TokenState.OPEN
    progress = RangeProgress(start, end, start + done)
    return Token(id, group, "orders", 0, progress, owner="host-1", epoch=1, state=state)


@pytest.mark.parametrize(
    ("fraction", "bar"),
    [
        (0.0, "[--------------------]"),
        (0.05, "[#-------------------]"),
        (0.5, "[##########----------]"),
        (0.999, "[###################-]"),  # full only at 100 %
        (1.0, "[####################]"),
        (-0.5, "[--------------------]"),
        (7.0, "[####################]"),
        (math.nan, "[--------------------]"),
    ],
)
def test_progress_bar(fraction: float, bar: str) -> None:
    assert progress_bar(fraction) == bar


def test_progress_bar_width() -> None:
    assert progress_bar(0.5, width=4) == "[##--]"
    with pytest.raises(ValueError):
        progress_bar(0.5, width=0)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, UNKNOWN),
        (-1.0, UNKNOWN),
        (math.inf, UNKNOWN),
        (math.nan, UNKNOWN),
        (0.0, "0 s"),
        (0.2, "1 s"),  # rounded up: "0 s" would claim it is done
        (42.0, "42 s"),
        (59.5, "1 min 00 s"),
        (185.0, "3 min 05 s"),
        (7380.0, "2 h 03 min"),
        (1e9, ">99 h"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_rate() -> None:
    assert format_rate(None) == UNKNOWN
    assert format_rate(2.25) == "2.2/s"
    assert format_rate(12345.6) == "12,346/s"


def test_eta_seconds() -> None:
    assert eta_seconds(0, None) == 0.0  # nothing left: done, whatever the rate
    assert eta_seconds(100, None) is None
    assert eta_seconds(100, 0.0) is None
    assert eta_seconds(100, 50.0) == 2.0


def test_fraction_done_counts_out_of_order_completions() -> None:
    token = Token(1, "g", "t", 0, RangeProgress(100, 200, 150, frozenset({160, 170})))
    assert fraction_done(token) == pytest.approx(0.52)
    assert fraction_done(Token(2, "g", "t", 0, RangeProgress(5, 5, 5))) == 1.0


def test_rate_is_unknown_until_progress_is_seen_twice() -> None:
    tracker = RateTracker(window_s=30)
    tracker.observe([_token(0)], now=100.0)
    assert tracker.rate(1) is None  # one sample
    tracker.observe([_token(0)], now=102.0)
    assert tracker.rate(1) is None  # no movement: unknown, not "never"
    tracker.observe([_token(200)], now=104.0)
    assert tracker.rate(1) == pytest.approx(50.0)  # 200 records over the 4 s since the first sample
    assert tracker.rate(99) is None


def test_rate_uses_the_recent_window_and_forgets_finished_ranges() -> None:
    tracker = RateTracker(window_s=10)
    tracker.observe([_token(0, end=2000)], now=0.0)
    tracker.observe([_token(10, end=2000)], now=10.0)  # slow at first
    tracker.observe([_token(510, end=2000)], now=20.0)  # then 50/s
    tracker.observe([_token(1010, end=2000)], now=30.0)
    assert tracker.rate(1) == pytest.approx(50.0)
    tracker.observe([], now=31.0)
    assert tracker.rate(1) is None


def test_rate_tracker_rejects_a_bad_window() -> None:
    with pytest.raises(ValueError):
        RateTracker(window_s=0)


def test_watch_screen_shows_bar_rate_and_eta() -> None:
    tracker = RateTracker()
    tokens = [_token(0)]
    tracker.observe(tokens, now=0.0)
    first = format_watch(tokens, tracker, title="T", include_done=False, scope="")
    assert "[--------------------]   0.0%" in first
    assert f"estimated time left {UNKNOWN}" in first
    tokens = [_token(250)]
    tracker.observe(tokens, now=5.0)
    second = format_watch(tokens, tracker, title="T", include_done=False, scope="")
    row = second.splitlines()[3]
    assert "[#####---------------]  25.0%" in row
    assert "50/s" in row and "15 s" in row  # 750 left at 50/s
    assert second.splitlines()[-1] == "backfill rate 50/s, estimated time left 15 s"
    assert "1 open ranges: 750 records left to backfill" in second


def test_watch_screen_done_ranges_and_untrusted_names() -> None:
    tracker = RateTracker()
    tokens = [_token(1000, id=1), _token(0, id=2, start=1000, end=2000, group="evil\x1b[2J")]
    tracker.observe(tokens, now=0.0)
    screen = format_watch(tokens, tracker, title="T", include_done=True, scope="")
    assert "\x1b" not in screen and "evil\\x1b[2J" in screen
    done_row = next(line for line in screen.splitlines() if line.startswith("g "))
    assert "[####################] 100.0%" in done_row and done_row.split()[-1] == "done"


def test_watch_screen_fits_a_small_terminal() -> None:
    tracker = RateTracker()
    tokens = [_token(0, id=i, start=i * 1000, end=i * 1000 + 1000) for i in range(1, 30)]
    tracker.observe(tokens, now=0.0)
    screen = format_watch(tokens, tracker, title="T" * 200, include_done=False, scope="", width=60, height=12)
    lines = screen.splitlines()
    assert len(lines) == 11  # the 12th line is where the cursor rests
    assert all(len(line) <= 60 for line in lines)
    assert any("more range(s) not shown" in line for line in lines)


def test_format_status_is_the_plain_table() -> None:
    text = format_status([_token(300, start=100, end=1100)])
    header, row = text.splitlines()
    assert header.split() == [
        "GROUP", "TOPIC", "PART", "ID", "RANGE", "COMMITTED", "PROGRESS", "REMAINING", "SKIPPED", "OWNER",
        "EPOCH", "STATE",
    ]  # fmt: skip
    assert "30.0%" in row


def test_format_table_and_printable() -> None:
    assert format_table(("A", "NUM"), [("x", "1"), ("long", "100")], {"NUM"}) == "A     NUM\nx       1\nlong  100"
    assert printable("ok") == "ok"
    assert printable("a\nb\x1b") == "a\\nb\\x1b"
