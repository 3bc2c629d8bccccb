"""Shared fixtures: a real Kafka broker and real stores (SQLite file, PostgreSQL); the test tiers.

The fixtures live in tests/fixtures/ (one module per external system) and are
re-exported here so every suite sees them.

Tiers.  A test's markers say which external systems it needs, and they are
derived here from the fixtures it uses, never written by hand file by file:

* ``broker``: the Kafka broker (``kafka_broker`` and everything built on it:
  ``bootstrap``, ``topic_factory``, the KIP-848 broker, the fault campaign's
  drivers), or a private broker (``private_broker``);
* ``postgres``: the PostgreSQL server (``pg_url``, ``pg_admin_engine``, the
  ``postgresql`` parameter of ``store_url``/``store``);
* ``spark``: the local SparkSession, a JVM (``spark``);
* ``integration``: any of the three.  ``make check`` runs ``-m "not integration"``:
  every test that needs none of them (SQLite files and subprocesses included), and
  ``make test`` runs everything.

A test that asks for such a fixture at run time (``request.getfixturevalue``)
cannot be seen from its signature: it declares the need with the marker
(``@pytest.mark.broker``).  Exactness is enforced, not hoped for:

* a hand-written ``integration`` marker on a test that needs nothing external is
  a collection error, and so is a declared need on a test that has no fixture of
  it and no ``request`` to ask for one;
* setting up one of the external fixtures for a test whose markers do not name
  that system fails the test at once, with the marker to add;
* a run with no ``integration`` test selected (``make check``, or any run of
  broker-free files) refuses to start a process of an external system (Java,
  Docker, PostgreSQL, Spark, the test broker or a tool command without a broker
  address) and fails the session if a SparkContext or a broker still came up.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import PurePath
from typing import Any

import pytest

from tests.fixtures.broker import *  # noqa: F403
from tests.fixtures.stores import *  # noqa: F403

#: The fixtures that start or reach an external system, and the marker naming it. Only the roots are
#: listed: every fixture built on one (bootstrap, topic_factory, pg_admin_engine, chaos_driver...) has the
#: root in its closure.
EXTERNAL_FIXTURES = {
    "kafka_broker": "broker",
    "private_broker": "broker",  # tests/faults/test_broker_outage.py: a broker of its own to stop and start
    "pg_url": "postgres",
    "spark": "spark",
    "spark_sessions": "spark",
    "spark_cluster": "spark",  # tests/spark/test_cluster.py: a master and worker JVMs
    "cluster_spark": "spark",
}
NEEDS = ("broker", "postgres", "spark")
INTEGRATION = "integration"

#: Executables of the external systems: a run without integration tests must start none of them.
_EXTERNAL_PROGRAMS = frozenset(
    {"java", "docker", "podman", "postgres", "pg_ctl", "pg_ctlcluster", "initdb", "spark-submit", "spark-class"}
)
#: Python modules that start an external system when run as a process.
_EXTERNAL_MODULES = frozenset({"fastrecover_tools.testing.broker", "fastrecover_tools.spark_bench"})
#: ``fastrecover`` commands that start a broker of their own unless they are given one.
_BROKER_COMMANDS = frozenset({"demo", "bench", "chaos"})

_state: dict[str, Any] = {"fast": False, "item": None}


def _fixture_needs(item: pytest.Item) -> set[str]:
    """The external systems ``item``'s fixtures (its closure and their parameters) bring up."""
    needs = {EXTERNAL_FIXTURES[name] for name in getattr(item, "fixturenames", ()) if name in EXTERNAL_FIXTURES}
    callspec = getattr(item, "callspec", None)
    # store_url (and store on it) asks for the PostgreSQL fixtures at run time, for its "postgresql" parameter
    if callspec is not None and callspec.params.get("store_url") == "postgresql":
        needs.add("postgres")
    return needs


def _needs(item: pytest.Item) -> set[str]:
    """The external systems ``item`` needs: from its fixtures, and the ones it declares (asked for at run time)."""
    return _fixture_needs(item) | {need for need in NEEDS if item.get_closest_marker(need) is not None}


@pytest.hookimpl(tryfirst=True)  # before the mark plugin deselects with -m
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with the systems it needs, and ``integration`` when it needs any."""
    wrong: list[str] = []
    for item in items:
        needs = _needs(item)
        if not needs and item.get_closest_marker(INTEGRATION) is not None:
            wrong.append(f"{item.nodeid}: marked integration, but uses no broker, PostgreSQL or Spark fixture")
        declared = {need for need in NEEDS if item.get_closest_marker(need) is not None}
        if declared - _fixture_needs(item) and "request" not in getattr(item, "fixturenames", ()):
            wrong.append(
                f"{item.nodeid}: marked {', '.join(sorted(declared - _fixture_needs(item)))}, but uses no such "
                "fixture and cannot ask for one at run time (no request fixture)"
            )
        for need in sorted(needs):
            if item.get_closest_marker(need) is None:
                item.add_marker(need)
        if needs and item.get_closest_marker(INTEGRATION) is None:
            item.add_marker(INTEGRATION)
    if wrong:
        raise pytest.UsageError("test markers disagree with the fixtures the tests use:\n  " + "\n  ".join(wrong))


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run without integration tests (``make check``) arms the guards against starting external systems."""
    if session.items and not any(item.get_closest_marker(INTEGRATION) for item in session.items):
        _state["fast"] = True
        sys.addaudithook(_refuse_external_processes)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> None:
    """Remember the running test, for the fixture guard (session fixtures are set up by their first user)."""
    _state["item"] = item


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> None:
    """Fail a test that brings up an external system its markers do not name."""
    need = EXTERNAL_FIXTURES.get(fixturedef.argname)
    item = _state["item"]
    if need is None or item is None:
        return
    if item.get_closest_marker(need) is None:
        pytest.fail(
            f"{item.nodeid} sets up {fixturedef.argname!r} (the {need}) but is not marked {need}: "
            f"it asks for the fixture at run time, so declare it with @pytest.mark.{need}",
            pytrace=False,
        )


def _refuse_external_processes(event: str, args: tuple[Any, ...]) -> None:
    """Audit hook of a run without integration tests: no process of an external system may start."""
    if not _state["fast"]:
        return
    if event == "subprocess.Popen":
        executable, argv, _cwd, env = args
        words = [os.fsdecode(w) for w in ([argv] if isinstance(argv, (str, bytes)) else list(argv or []))]
        reason = _external_process(os.fsdecode(executable) if executable else None, words, env)
    elif event == "os.system":
        reason = _external_process(None, os.fsdecode(args[0]).split(), None)
    else:
        return
    if reason:
        raise RuntimeError(f"a test of the broker-free tier started {reason}; it needs the integration tier")


def _external_process(executable: str | None, argv: Sequence[str], env: Any) -> str | None:
    """What external system the command would start, or None."""
    program = PurePath(executable or (argv[0] if argv else "")).name
    if program in _EXTERNAL_PROGRAMS:
        return f"{program} ({' '.join(argv)[:200]})"
    for at, word in enumerate(argv[:-1]):
        if word != "-m":
            continue
        module, rest = argv[at + 1], argv[at + 2 :]
        if module in _EXTERNAL_MODULES:
            return f"an external system ({' '.join(argv)[:200]})"
        if module == "fastrecover" and rest and rest[0] in _BROKER_COMMANDS:
            environ = os.environ if env is None else {os.fsdecode(k): v for k, v in dict(env).items()}
            given = any(w == "--bootstrap-servers" or w.startswith("--bootstrap-servers=") for w in rest) or any(
                environ.get(var) for var in ("FASTRECOVER_BOOTSTRAP", "KAFKA_BOOTSTRAP_SERVERS")
            )
            if not given:
                return f"a Kafka broker (fastrecover {rest[0]} without --bootstrap-servers)"
    return None


@pytest.fixture(scope="session", autouse=True)
def _nothing_external_came_up() -> Iterator[None]:
    """At the end of a run without integration tests: no SparkContext and no test broker exist."""
    yield
    if not _state["fast"]:
        return
    pyspark = sys.modules.get("pyspark")
    if pyspark is not None and pyspark.SparkContext._active_spark_context is not None:
        pytest.fail("a SparkContext was started in the broker-free tier", pytrace=False)
    from tests.fixtures import broker

    if broker._report.broker is not None:
        pytest.fail("a Kafka broker was started in the broker-free tier", pytrace=False)
