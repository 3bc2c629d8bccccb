"""The test tiers of tests/conftest.py hold: a broker-free run starts no broker, whatever a test tries.

Each case runs pytest in a scratch directory whose conftest takes tests/conftest.py's
hooks and fixtures and replaces the broker fixture with a stub that leaves a file
behind when it runs, so "the broker fixture was never instantiated" is a fact the
test reads, not an assumption.  The scratch runs are subprocesses: the hooks keep
per-session state and an audit hook, which must not leak into this session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import *  # noqa: F403  (the tier hooks and the shared fixtures)

STARTED = Path(__file__).with_name("broker-started")


@pytest.fixture(scope="session")
def kafka_broker():
    STARTED.write_text("the broker fixture ran")
    yield SimpleNamespace(bootstrap="stub", running=True)
"""

INI = """
[pytest]
addopts = -p no:cacheprovider --strict-markers
markers =
    integration: any external system
    broker: Kafka
    postgres: PostgreSQL
    spark: Spark
"""


def _pytest(tmp_path: Path, tests: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text(INI, encoding="utf-8")
    (tmp_path / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    (tmp_path / "test_scratch.py").write_text(textwrap.dedent(tests), encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tools")]),
        "FASTRECOVER_PG_URL": "postgresql+psycopg://nobody@127.0.0.1:1/nowhere",  # no PostgreSQL for the header
        "COLUMNS": "1000",  # summary lines whole, messages included
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _outcome(run: subprocess.CompletedProcess[str], test: str) -> str:
    """The short summary line of one test (-rA): PASSED/FAILED/ERROR with its message."""
    lines = [line for line in run.stdout.splitlines() if f"test_scratch.py::{test}" in line and " " in line]
    assert lines, run.stdout + run.stderr
    return lines[-1]


def test_the_fast_tier_never_starts_the_broker(tmp_path: Path) -> None:
    run = _pytest(
        tmp_path,
        """
        import subprocess
        import sys

        def test_plain():
            assert True

        def test_asks_for_the_broker_at_run_time(request):
            request.getfixturevalue("bootstrap")

        def test_starts_java():
            subprocess.run(["java", "-version"], check=False)

        def test_starts_the_demo_without_a_broker_address():
            subprocess.run([sys.executable, "-m", "fastrecover", "demo"], check=False)

        def test_uses_the_broker(bootstrap):
            assert bootstrap == "stub"
        """,
        "-m",
        "not integration",
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert _outcome(run, "test_plain").startswith("PASSED")
    dynamic = _outcome(run, "test_asks_for_the_broker_at_run_time")
    assert dynamic.startswith("FAILED") and "sets up 'kafka_broker' (the broker) but is not marked broker" in dynamic
    java = _outcome(run, "test_starts_java")
    assert java.startswith("FAILED") and "the broker-free tier started java (java -version)" in java
    demo = _outcome(run, "test_starts_the_demo_without_a_broker_address")
    assert demo.startswith("FAILED") and "fastrecover demo without --bootstrap-servers" in demo
    assert "1 deselected" in run.stdout  # test_uses_the_broker: derived integration, left to make test
    assert not (tmp_path / "broker-started").exists()


def test_the_full_run_marks_from_fixtures_and_declarations(tmp_path: Path) -> None:
    run = _pytest(
        tmp_path,
        """
        import pytest

        def test_uses_the_broker(bootstrap, request):
            assert {"broker", "integration"} <= {m.name for m in request.node.iter_markers()}

        @pytest.mark.broker
        def test_declares_the_broker(request):
            assert request.getfixturevalue("bootstrap") == "stub"
            assert request.node.get_closest_marker("integration") is not None

        def test_needs_nothing(request):
            assert not {"broker", "integration"} & {m.name for m in request.node.iter_markers()}
        """,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout
    assert (tmp_path / "broker-started").exists()


def test_markers_that_contradict_the_fixtures_are_a_usage_error(tmp_path: Path) -> None:
    run = _pytest(
        tmp_path,
        """
        import pytest

        @pytest.mark.integration
        def test_marked_integration_but_needs_nothing():
            assert True

        @pytest.mark.spark
        def test_declares_spark_and_cannot_ask_for_it():
            assert True
        """,
    )
    assert run.returncode == 4, run.stdout + run.stderr  # pytest's usage error
    err = run.stderr
    assert "test_marked_integration_but_needs_nothing: marked integration, but uses no broker" in err
    assert "test_declares_spark_and_cannot_ask_for_it: marked spark, but uses no such fixture" in err
    assert not (tmp_path / "broker-started").exists()
