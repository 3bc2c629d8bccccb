"""What an operator watches on a KIP-333 consumer: a snapshot of plain data, no I/O.

``Consumer.metrics()`` returns a :class:`ConsumerMetrics`.  Counters only grow
over the consumer's life; gauges (``ranges_open``, ``backfill``,
``child_alive``) are the state at the moment of the call.  The Prometheus
exporter (:mod:`fastrecover.prometheus`) turns one snapshot into one scrape; any
other exporter can read :meth:`ConsumerMetrics.as_dict`.

The snapshot is built from plain counters the consumer's own thread updates,
so taking one costs a few attribute reads and never blocks the data path.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Latency:
    """A latency distribution: ``buckets`` holds (upper bound in s, observations ≤ it), cumulative."""

    count: int = 0
    sum_seconds: float = 0.0
    max_seconds: float = 0.0
    buckets: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class PartitionBackfill:
    """The backfill this member still owes on one partition."""

    topic: str
    partition: int
    ranges: int
    remaining: int  # offsets of its open ranges not yet committed (an upper bound on records left)


@dataclass(frozen=True)
class ConsumerMetrics:
    """One snapshot of a consumer; every field is plain data (see docs/operations.md, "Metrics")."""

    parallel_rebalance: bool
    ranges_open: int = 0
    ranges_done: int = 0
    backfill: tuple[PartitionBackfill, ...] = ()
    primary_messages: int = 0
    child_records: int = 0
    child_alive: bool = False
    child_restarts: int = 0
    recoveries: int = 0
    degraded_recoveries: int = 0
    fencings: int = 0
    mirror_degradations: int = 0
    store_commits: int = 0
    store_commit_failures: int = 0
    store_commit_latency: Latency = field(default_factory=Latency)

    @property
    def backfill_remaining(self) -> int:
        return sum(p.remaining for p in self.backfill)

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as JSON-ready nested dicts and lists."""
        out = asdict(self)
        out["backfill_remaining"] = self.backfill_remaining
        return out


def backfill_by_partition(spans: list[tuple[str, int, int, int]]) -> tuple[PartitionBackfill, ...]:
    """Sum ``(topic, partition, committed, end)`` of open ranges per partition, in partition order."""
    acc: dict[tuple[str, int], list[int]] = {}
    for topic, partition, committed, end in spans:
        slot = acc.setdefault((topic, partition), [0, 0])
        slot[0] += 1
        slot[1] += max(0, end - committed)
    return tuple(PartitionBackfill(t, p, n, left) for (t, p), (n, left) in sorted(acc.items()))
