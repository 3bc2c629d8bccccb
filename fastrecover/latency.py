"""The store-commit latency distribution, counted on the committer's thread.

Apart from :mod:`fastrecover.metrics` so that the mode's start does not create the snapshot
types: a mode-on consumer imports its units while its group join runs, and every class made
then delays a restart's first fresh record.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastrecover.metrics import Latency

#: Upper bounds (seconds) of the store-commit latency buckets: a store transaction takes
#: from well under a millisecond (SQLite, a few rows) to seconds (a PostgreSQL failover).
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LatencyRecorder:
    """Accumulates durations into fixed buckets; cheap enough for every store transaction."""

    __slots__ = ("_counts", "count", "maximum", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.maximum = 0.0
        self._counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        if seconds > self.maximum:
            self.maximum = seconds
        self._counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1

    def snapshot(self) -> Latency:
        from fastrecover.metrics import Latency  # the snapshot types are made when metrics() is first called

        cumulative = accumulate(self._counts[:-1])  # observations <= each bound; +Inf is ``count``
        return Latency(self.count, self.total, self.maximum, tuple(zip(LATENCY_BUCKETS, cumulative, strict=True)))
