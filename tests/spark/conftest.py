"""Fixtures of the Spark suite: a local SparkSession or one on a standalone cluster, and a row sink.

PySpark is required: a missing PySpark is an import error (a failure), never a skip.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pyspark  # noqa: F401  (fail loudly, not skip, when PySpark is missing)
import pytest
from pyspark.sql import SparkSession

import fastrecover.spark
from fastrecover.spark.jvm import connector_package
from fastrecover_tools.testing.spark_cluster import LOOPBACK, SparkCluster, session_conf
from fastrecover_tools.testing.waiting import wait_for
from tests.spark.helpers import Sink

REPO_ROOT = str(Path(__file__).resolve().parents[2])
TOOLS_ROOT = str(Path(__file__).resolve().parents[2] / "tools")


class SparkSessions:
    """The one SparkSession this process may have at a time (one SparkContext per JVM), local or on the cluster.

    Asking for the other kind stops the current session first. The cluster tests live in one module, so a
    run switches at most twice."""

    def __init__(self) -> None:
        self.current: tuple[str, SparkSession] | None = None

    def get(self, master: str, conf: dict[str, str]) -> SparkSession:
        if self.current is not None and self.current[0] == master:
            return self.current[1]
        self.stop()
        _python_env()
        builder = SparkSession.builder.master(master).appName("fastrecover-tests")
        for key, value in {**BASE_CONF, **conf}.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        fastrecover.spark.register(session)
        self.current = (master, session)
        return session

    def stop(self) -> None:
        if self.current is not None:
            self.current[1].stop()
            self.current = None


BASE_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.memory": "1g",
    "spark.sql.streaming.pollingDelay": "50ms",
    "spark.python.worker.reuse": "true",
    # Spark's Kafka connector (Maven Central): start_stream and start_kafka_stream read with it.
    "spark.jars.packages": connector_package(),
    # Every Spark process, the driver included, binds to and talks over the loopback address only.
    "spark.driver.host": LOOPBACK,
    "spark.driver.bindAddress": LOOPBACK,
}


def _python_env() -> None:
    # Python workers are started by the JVM: they need this interpreter and this checkout.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    path = os.environ.get("PYTHONPATH", "")
    missing = [p for p in (REPO_ROOT, TOOLS_ROOT) if p not in path.split(os.pathsep)]
    if missing:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (*missing, path) if p)


@pytest.fixture(scope="session")
def spark_sessions() -> Iterator[SparkSessions]:
    sessions = SparkSessions()
    yield sessions
    sessions.stop()


@pytest.fixture(scope="module")
def spark(spark_sessions: SparkSessions) -> SparkSession:
    """A local[2] session (3 attempts per task, so a task failure is retried), UI off, tiny shuffles,
    with Spark's Kafka connector."""
    return spark_sessions.get("local[2,3]", {})


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory, spark_sessions: SparkSessions) -> Iterator[SparkCluster]:
    """A Spark standalone cluster: a master and 2 workers (1 core, 1 GiB each), each its own JVM, on 127.0.0.1.

    Started once per test session; a cluster that cannot start fails the tests that need it (never a skip).
    Its logs and the executors' work directories stay under the session's temporary directory."""
    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1g")
    try:
        cluster.start()
    except RuntimeError as exc:
        cluster.stop()
        pytest.fail(f"the Spark standalone cluster did not start: {exc}", pytrace=False)
    yield cluster
    if spark_sessions.current is not None and spark_sessions.current[0] == cluster.master_url:
        spark_sessions.stop()  # the driver first, so it does not watch its executors vanish
    cluster.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A failed test that ran on the cluster carries the tails of the master's and workers' logs, and says
    where the executors' logs are."""
    outcome = yield
    report = outcome.get_result()
    cluster = getattr(item, "funcargs", {}).get("spark_cluster")
    if report.failed and isinstance(cluster, SparkCluster):
        report.sections.append(
            ("spark cluster", f"{cluster.describe()}\nexecutors' logs under {cluster.root}\n{cluster.log_tails()}")
        )


@pytest.fixture(scope="module")
def cluster_spark(spark_sessions: SparkSessions, spark_cluster: SparkCluster) -> SparkSession:
    """A driver (this process) on the standalone cluster, with its 2 executors registered."""
    conf = session_conf(
        spark_cluster,
        {
            "spark.executorEnv.PYTHONPATH": os.pathsep.join((REPO_ROOT, TOOLS_ROOT)),
            "spark.task.maxFailures": "4",
        },
    )
    session = spark_sessions.get(spark_cluster.master_url, conf)
    wait_executors(session, 2, 120)
    return session


def executor_count(session: SparkSession) -> int:
    """Executors registered with the driver (the driver's own entry not counted)."""
    infos = session.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return len(infos) - 1


def wait_executors(session: SparkSession, count: int, timeout: float) -> None:
    wait_for(lambda: executor_count(session) >= count, timeout, 0.2, f"{count} executor(s) registered with the driver")


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def spark_store_url(tmp_path: Path) -> str:
    """A SQLite store for the streaming tests (the ranges test runs on every backend)."""
    return f"sqlite:///{tmp_path / 'fastrecover.db'}"
