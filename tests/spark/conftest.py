"""Fixtures of the Spark suite: one local SparkSession for the whole session, and a row sink.

PySpark is required: a missing PySpark is an import error (a failure), never a skip.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark  # noqa: F401  (fail loudly, not skip, when PySpark is missing)
import pytest
from pyspark.sql import SparkSession

import fastrecover.spark

REPO_ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] session (3 attempts per task, so a task failure is retried), UI off, tiny shuffles."""
    # Python workers are started by the JVM: they need this interpreter and this checkout.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH", "")
    if REPO_ROOT not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, path) if p)
    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("fastrecover-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.pollingDelay", "50ms")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    fastrecover.spark.register(session)
    yield session
    session.stop()


@dataclass(frozen=True)
class Row:
    partition: int
    offset: int
    backfill: bool
    value: str


@dataclass
class Sink:
    """What foreachBatch saw: every attempt of every batch id, in arrival order."""

    attempts: list[tuple[int, list[Row]]] = field(default_factory=list)
    fail_batches: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [
            Row(r.partition, r.offset, r.backfill, (r.value or b"").decode())
            for r in df.select("partition", "offset", "backfill", "value").collect()
        ]
        with self.lock:
            self.attempts.append((batch_id, rows))
            if batch_id in self.fail_batches:
                self.fail_batches.discard(batch_id)
                raise RuntimeError(f"sink fails batch {batch_id} once (test)")

    def rows(self) -> list[Row]:
        with self.lock:
            return [r for _, rows in self.attempts for r in rows]

    def batches(self) -> list[tuple[int, list[Row]]]:
        with self.lock:
            return list(self.attempts)

    def count(self) -> int:
        return len(self.rows())


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def spark_store_url(tmp_path: Path) -> str:
    """A SQLite store for the streaming tests (the ranges test runs on every backend)."""
    return f"sqlite:///{tmp_path / 'fastrecover.db'}"
