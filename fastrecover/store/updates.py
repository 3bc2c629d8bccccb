"""The values a commit hands to the store and gets back, free of SQLAlchemy.

The data path builds these on every range commit; keeping them out of the
modules that import SQLAlchemy lets ``import fastrecover.consumer`` stay as
light as ``confluent_kafka`` for an application that runs with the mode off.
"""

from __future__ import annotations

from fastrecover.ranges import RangeProgress
from fastrecover.tokens import Token
from fastrecover.values import field, value


@value
class ProgressUpdate:
    """One range's new progress, written only if ``(owner, epoch)`` still holds it.

    ``skipped`` is the range's total of records lost to retention (not a delta);
    None leaves the stored count unchanged.
    """

    token_id: int
    owner: str
    epoch: int
    progress: RangeProgress
    skipped: int | None = None


@value
class CommitResult:
    """Outcome of a batch: the tokens as now stored, and the ids whose holder was fenced."""

    tokens: list[Token] = field(default_factory=list)
    fenced: list[int] = field(default_factory=list)
