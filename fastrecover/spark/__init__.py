"""KIP-333 for Apache Spark (PySpark >= 4.2 Python Data Source API).

* ``format("fastrecover")``: a Structured Streaming Kafka source that, restarted
  after downtime, delivers fresh records first and backfills the lag in
  parallel tasks (:mod:`fastrecover.spark.source`).
* :func:`start_stream`: the same planning, with each batch's records read by
  Spark's JVM Kafka reader (the fast path; needs spark-sql-kafka-0-10).
* ``format("fastrecover-ranges")``: a batch source that drains a consumer
  group's open range tokens, with :func:`complete_ranges` to hand them back as
  done (:mod:`fastrecover.spark.ranges`).

Call :func:`register` once per SparkSession before using either format.

The names are imported lazily (PEP 562): Spark's planning process unpickles
``fastrecover.spark.source`` and must not pay for the store's imports
(SQLAlchemy) on every query start.
"""

from __future__ import annotations

from typing import Any

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "fastrecover.spark needs PySpark >= 4.2 with its SQL extras: pip install 'fastrecover[spark]'"
    ) from exc

__all__ = [
    "SCHEMA",
    "FastRecoverDataSource",
    "FastRecoverRangesDataSource",
    "RangeCompletion",
    "abandon_ranges",
    "complete_ranges",
    "register",
    "start_stream",
]

_LAZY = {
    "SCHEMA": "fastrecover.spark.source",
    "FastRecoverDataSource": "fastrecover.spark.source",
    "FastRecoverRangesDataSource": "fastrecover.spark.ranges",
    "RangeCompletion": "fastrecover.spark.ranges",
    "abandon_ranges": "fastrecover.spark.ranges",
    "complete_ranges": "fastrecover.spark.ranges",
    "start_stream": "fastrecover.spark.jvm",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastrecover.spark' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def register(spark: Any) -> None:
    """Make ``format("fastrecover")`` and ``format("fastrecover-ranges")`` available in ``spark``."""
    from fastrecover.spark.ranges import FastRecoverRangesDataSource
    from fastrecover.spark.source import FastRecoverDataSource

    spark.dataSource.register(FastRecoverDataSource)
    spark.dataSource.register(FastRecoverRangesDataSource)
