"""KIP-333 for Apache Spark (PySpark >= 4.2 Python Data Source API).

* ``format("fastrecover")``: a Structured Streaming Kafka source that, restarted
  after downtime, delivers fresh records first and backfills the lag in
  parallel tasks (:mod:`fastrecover.spark.source`).
* :func:`start_stream` (deprecated, to be removed): the same planning, with each
  batch's records read by Spark's JVM Kafka reader; :func:`start_kafka_stream` replaces it.
* :func:`start_kafka_stream`: Spark's own Kafka source reads the live records;
  after a restart the driver jumps the checkpoint to the log end and each later
  batch carries a chunk of the lag (no Python planning process: Spark's own
  start-up cost and steady state).
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
    "start_kafka_stream",
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
    "start_kafka_stream": "fastrecover.spark.controller",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastrecover.spark' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


#: Modules the streaming source's planning needs, pickled by value into the planning process.
_PLANNER_MODULES = (
    "fastrecover.errors",
    "fastrecover.config",
    "fastrecover.ranges",
    "fastrecover.tokens",
    "fastrecover.spark.client_conf",
    "fastrecover.spark.options",
    "fastrecover.spark.offsets",
    "fastrecover.spark.planning",
    "fastrecover.spark.kafka",
    "fastrecover.spark.commit_mirror",
    "fastrecover.spark.source",
)


def register(spark: Any) -> None:
    """Make ``format("fastrecover")`` and ``format("fastrecover-ranges")`` available in ``spark``.

    The streaming source's class is pickled BY VALUE, with the few modules its
    planning uses: Spark starts a fresh Python process to plan a query at every
    query start, and unpickling by reference would import the ``fastrecover``
    package, whose ``__init__`` imports the consumer and the store (SQLAlchemy):
    0.85 s on an idle core, several seconds on a loaded one, on the path from
    ``start()`` to the first batch (docs/spark.md, "Profile").  Reading
    (tasks) and the store mirror still import their modules by reference.
    """
    import importlib

    from pyspark import cloudpickle

    from fastrecover.spark.ranges import FastRecoverRangesDataSource
    from fastrecover.spark.source import FastRecoverDataSource

    modules = [importlib.import_module(name) for name in _PLANNER_MODULES]
    for module in modules:
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    try:
        spark.dataSource.register(FastRecoverDataSource)
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)  # type: ignore[no-untyped-call]
    spark.dataSource.register(FastRecoverRangesDataSource)
