"""Fixtures of the Spark suite: one local SparkSession for the whole session, and a row sink.

PySpark is required: a missing PySpark is an import error (a failure), never a skip.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark  # noqa: F401  (fail loudly, not skip, when PySpark is missing)
import pytest
from pyspark.sql import SparkSession

import fastrecover.spark
from fastrecover.spark.jvm import connector_package
from tests.spark.helpers import Sink

REPO_ROOT = str(Path(__file__).resolve().parents[2])
TOOLS_ROOT = str(Path(__file__).resolve().parents[2] / "tools")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] session (3 attempts per task, so a task failure is retried), UI off, tiny shuffles,
    with Spark's Kafka connector."""
    # Python workers are started by the JVM: they need this interpreter and this checkout.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH", "")
    missing = [p for p in (REPO_ROOT, TOOLS_ROOT) if p not in path.split(os.pathsep)]
    if missing:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (*missing, path) if p)
    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("fastrecover-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.pollingDelay", "50ms")
        .config("spark.python.worker.reuse", "true")
        # Spark's Kafka connector (Maven Central): start_stream reads with it.
        .config("spark.jars.packages", connector_package())
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    fastrecover.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def spark_store_url(tmp_path: Path) -> str:
    """A SQLite store for the streaming tests (the ranges test runs on every backend)."""
    return f"sqlite:///{tmp_path / 'fastrecover.db'}"
