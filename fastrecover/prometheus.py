"""Prometheus exposition of :meth:`fastrecover.Consumer.metrics` (``pip install 'fastrecover[prometheus]'``).

Why Prometheus' own client rather than OpenTelemetry: an operator *scrapes* a
consumer process, which is the pull model ``prometheus_client`` serves with
one small pure-Python dependency and no SDK pipeline to configure; an
OpenTelemetry collector can scrape the same endpoint with its Prometheus
receiver.  The collector reads a fresh :class:`~fastrecover.metrics.ConsumerMetrics`
at every scrape, so nothing runs on the consumer's data path.

Usage::

    from prometheus_client import start_http_server
    from fastrecover.prometheus import register

    register(consumer, consumer_id="orders-1")
    start_http_server(9108)
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

from fastrecover.metrics import ConsumerMetrics

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from fastrecover.consumer import Consumer

log = logging.getLogger("fastrecover.prometheus")

__all__ = ["ConsumerCollector", "register"]


class ConsumerCollector(Collector):
    """Turns one consumer's metrics snapshot into Prometheus metric families at scrape time.

    The scrape runs on the HTTP server's thread: ``Consumer.metrics()`` only reads
    counters and copies small containers, so it is safe to call from there.
    """

    def __init__(self, consumer: Consumer, consumer_id: str) -> None:
        self._consumer = consumer
        self._id = consumer_id

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot()
        if snapshot is None:
            return
        yield from families(snapshot, self._id)

    def _snapshot(self) -> ConsumerMetrics | None:
        for _ in range(3):  # a container resized by the consumer's thread mid-copy: read again
            try:
                return self._consumer.metrics()
            except RuntimeError as exc:
                last = exc
        log.warning("metrics snapshot of %s failed: %s", self._id, last)
        return None


def register(consumer: Consumer, consumer_id: str, registry: CollectorRegistry = REGISTRY) -> ConsumerCollector:
    """Expose ``consumer``'s metrics in ``registry`` (the default one unless given), labelled ``consumer``.

    Args:
        consumer: the ``fastrecover.Consumer`` to report.
        consumer_id: the ``consumer`` label value; unique per consumer in the process.
        registry: where to register; ``prometheus_client``'s default registry if omitted.

    Returns:
        The collector; ``registry.unregister(collector)`` removes it (for instance after ``close()``).
    """
    collector = ConsumerCollector(consumer, consumer_id)
    registry.register(collector)
    return collector


def families(m: ConsumerMetrics, consumer_id: str) -> Iterator[Metric]:
    """The metric families of one snapshot (names follow Prometheus conventions: base units, ``_total``)."""
    labels = ["consumer"]
    ident = [consumer_id]

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(f"fastrecover_{name}", doc, labels=labels)
        family.add_metric(ident, value)
        return family

    def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(f"fastrecover_{name}", doc, labels=labels)
        family.add_metric(ident, value)
        return family

    yield gauge("parallel_rebalance_enabled", "1 when enable.parallel.rebalance is on", float(m.parallel_rebalance))
    yield gauge("ranges_open", "Backfill ranges this consumer holds and has not finished", m.ranges_open)
    yield counter("ranges_done", "Backfill ranges this consumer finished", m.ranges_done)
    remaining = GaugeMetricFamily(
        "fastrecover_backfill_remaining_offsets",
        "Offsets of open ranges not yet committed, per partition (an upper bound on records left)",
        labels=[*labels, "topic", "partition"],
    )
    for p in m.backfill:
        remaining.add_metric([consumer_id, p.topic, str(p.partition)], p.remaining)
    yield remaining
    delivered = CounterMetricFamily(
        "fastrecover_delivered_messages",
        "Messages returned to the application, by stream (primary: live; child: backfilled)",
        labels=[*labels, "stream"],
    )
    delivered.add_metric([consumer_id, "primary"], m.primary_messages)
    delivered.add_metric([consumer_id, "child"], m.child_records)
    yield delivered
    yield gauge("child_alive", "1 while the child consumer's handle exists and is healthy", float(m.child_alive))
    yield counter("child_restarts", "Child consumer handles re-created after a failure", m.child_restarts)
    yield counter("recoveries", "Partition assignments that opened or resumed backfill ranges", m.recoveries)
    yield counter("degraded_recoveries", "Recoveries that fell back to replaying the lag", m.degraded_recoveries)
    yield counter("fencings", "Ranges taken over by another owner while held here", m.fencings)
    yield counter(
        "mirror_degradations", "Commit-metadata mirrors that dropped maps or merged ranges", m.mirror_degradations
    )
    yield counter("store_commits", "Range-store commit transactions that succeeded", m.store_commits)
    yield counter("store_commit_failures", "Range-store commit transactions that failed", m.store_commit_failures)
    lat = m.store_commit_latency
    histogram = HistogramMetricFamily(
        "fastrecover_store_commit_duration_seconds", "Duration of range-store commit transactions", labels=labels
    )
    buckets = [(format(bound, "g"), float(n)) for bound, n in lat.buckets] + [("+Inf", float(lat.count))]
    histogram.add_metric(ident, buckets, lat.sum_seconds)
    yield histogram
