"""Caller values checked before the database driver sees them.

A value the columns cannot hold would otherwise reach the driver and fail there
with an OverflowError or a truncation that differs per dialect (SQLite stores
what it is given, PostgreSQL raises); checking first gives one error type,
:class:`InvalidValueError`, with a message that names the field, and leaves the
row unchanged.
"""

from __future__ import annotations

from fastrecover.errors import InvalidValueError
from fastrecover.ranges import RangeProgress
from fastrecover.store.models import NAME_MAX

#: Largest offset the store's BIGINT columns hold.
BIGINT_MAX = 2**63 - 1
#: Largest value of the INTEGER columns (partition, epoch).
INT_MAX = 2**31 - 1


def check_name(what: str, value: object) -> str:
    """``value`` if it is a non-empty string that fits the VARCHAR(NAME_MAX) columns."""
    if not isinstance(value, str) or not value or len(value) > NAME_MAX:
        shown = value if not isinstance(value, str) or len(value) <= 80 else value[:80] + "..."
        raise InvalidValueError(
            f"{what} must be a non-empty string of at most {NAME_MAX} characters, got {shown!r}"
            + (f" ({len(value)} characters)" if isinstance(value, str) else "")
        )
    return value


def check_int(what: str, value: object, minimum: int = 0, maximum: int = BIGINT_MAX) -> int:
    """Refuse what the columns cannot hold before the driver sees it (it would raise OverflowError)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    if value > maximum:
        raise InvalidValueError(f"{what} must be an integer <= {maximum} (what the store can hold), got {value!r}")
    return value


def check_progress(what: str, progress: RangeProgress) -> None:
    """Every offset of ``progress`` fits a BIGINT column."""
    for name, value in (("start", progress.start), ("end", progress.end), ("committed", progress.committed)):
        check_int(f"{name} offset of {what}", value)
