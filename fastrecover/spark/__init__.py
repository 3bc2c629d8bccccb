"""KIP-333 for Apache Spark (PySpark >= 4.2 Python Data Source API).

* ``format("fastrecover")``: a Structured Streaming Kafka source that, restarted
  after downtime, delivers fresh records first and backfills the lag in
  parallel tasks (:mod:`fastrecover.spark.source`).
* ``format("fastrecover-ranges")``: a batch source that drains a consumer
  group's open range tokens, with :func:`complete_ranges` to hand them back as
  done (:mod:`fastrecover.spark.ranges`).

Call :func:`register` once per SparkSession before using either format.
"""

from __future__ import annotations

from typing import Any

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "fastrecover.spark needs PySpark >= 4.2 with its SQL extras: pip install 'fastrecover[spark]'"
    ) from exc

from fastrecover.spark.ranges import (
    FastRecoverRangesDataSource,
    RangeCompletion,
    abandon_ranges,
    complete_ranges,
)
from fastrecover.spark.source import SCHEMA, FastRecoverDataSource

__all__ = [
    "SCHEMA",
    "FastRecoverDataSource",
    "FastRecoverRangesDataSource",
    "RangeCompletion",
    "abandon_ranges",
    "complete_ranges",
    "register",
]


def register(spark: Any) -> None:
    """Make ``format("fastrecover")`` and ``format("fastrecover-ranges")`` available in ``spark``."""
    spark.dataSource.register(FastRecoverDataSource)
    spark.dataSource.register(FastRecoverRangesDataSource)
