"""A real Apache Kafka broker for tests, the demo and the benchmarks.

fastrecover's guarantees are about how a real group coordinator, real offset
commits and real rebalances behave, so nothing here ever falls back to a mock:
if no broker can be had, :func:`select_broker` raises ``RuntimeError``.

Where the broker comes from is decided in one place, :func:`select_broker`:

1. ``FASTRECOVER_BOOTSTRAP`` / ``KAFKA_BOOTSTRAP_SERVERS`` name an existing
   broker (e.g. the one in ``docker-compose.yml``);
2. otherwise a container (``apache/kafka`` via testcontainers) when a Docker
   engine answers;
3. otherwise a KRaft single node run straight from the Apache Kafka jars on
   Maven Central, resolved once into a cache directory.

``FASTRECOVER_BROKER=env|container|local-jars`` forces one of them.

Brokers we launch can be stopped and started again on the same ports and data
directory, which the fault tests use to take the broker away while clients run.

Run ``python -m fastrecover_tools.testing.broker`` to get a broker for manual work.
"""

from __future__ import annotations

import abc
import atexit
import base64
import contextlib
import fcntl
import hashlib
import importlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, TypeVar

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition

# NewTopic is public API but mypy cannot see the re-export from cimpl.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from fastrecover_tools.testing.waiting import Deadline, wait_for

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_KAFKA_VERSION",
    "KIP848_BROKER_CONFIG",
    "Broker",
    "ContainerBroker",
    "Delivered",
    "EnvBroker",
    "LocalJarBroker",
    "Record",
    "create_topic",
    "delete_topic",
    "docker_available",
    "ensure_kafka_jars",
    "group_is_empty",
    "kafka_cache_dir",
    "main",
    "produce",
    "select_broker",
]

_log = logging.getLogger("fastrecover_tools.testing.broker")

DEFAULT_KAFKA_VERSION = "4.1.1"
DEFAULT_IMAGE = f"apache/kafka:{DEFAULT_KAFKA_VERSION}"
SCALA_VERSION = "2.13"
DEFAULT_READY_TIMEOUT = 90.0

#: Broker settings the KIP-848 (group.protocol=consumer) tests need; also in BASE_BROKER_CONFIG.
KIP848_BROKER_CONFIG: Mapping[str, str] = {
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.session.timeout.ms": "3000",
    "group.consumer.min.heartbeat.interval.ms": "500",
    "group.consumer.heartbeat.interval.ms": "500",
}

# Settings every broker we launch gets. They favour fast start-up and the
# short timeouts the tests use over production durability.
BASE_BROKER_CONFIG: Mapping[str, str] = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "num.partitions": "1",
    "auto.create.topics.enable": "false",
    "group.min.session.timeout.ms": "1000",
    "log.retention.check.interval.ms": "1000",
    # The first retention check otherwise waits 30 s after start-up.
    "log.initial.task.delay.ms": "1000",
    # After a SIGKILL the restarted node cannot register until the dead
    # incarnation's session expires (default 9 s); keep that wait short.
    "broker.heartbeat.interval.ms": "1000",
    "broker.session.timeout.ms": "4000",
    # KIP-848 groups (group.protocol=consumer): session and heartbeat are the broker's settings,
    # not the client's. The defaults (45 s session, 5 s heartbeat) make every SIGKILL test wait
    # 45 s for the dead member to be fenced; use the classic tests' 3 s session instead.
    **KIP848_BROKER_CONFIG,
}

# Used to prove the group coordinator can serve groups before a broker is
# handed out, so the first test does not race the __consumer_offsets load.
PROBE_TOPIC = "_fastrecover_probe"
PROBE_GROUP = "_fastrecover_probe"

_BrokerT = TypeVar("_BrokerT", bound="Broker")

# The POM Maven resolves the broker jars from: one file, shipped as package data.
_POM_FILE = Path(__file__).with_name("kafka-pom.xml")

_LOG4J2_XML = """\
<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by fastrecover_tools.testing.broker: everything goes to the file, nothing to the console. -->
<Configuration status="WARN">
  <Appenders>
    <File name="file" fileName="{log_file}" append="true">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="org.apache.kafka.clients" level="WARN"/>
    <Root level="INFO">
      <AppenderRef ref="file"/>
    </Root>
  </Loggers>
</Configuration>
"""


# --------------------------------------------------------------------------- brokers


class Broker(abc.ABC):
    """A Kafka broker the caller may use until :meth:`close`.

    ``start`` and ``stop`` are idempotent, so fixtures can call them without
    tracking state; ``close`` releases everything and cannot be undone.
    """

    kind: str = ""

    def __init__(self, version: str) -> None:
        self.version = version
        #: Wall-clock seconds the last :meth:`start` took (``None`` before the first).
        self.last_start_seconds: float | None = None

    @property
    @abc.abstractmethod
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""

    @property
    @abc.abstractmethod
    def running(self) -> bool: ...

    @abc.abstractmethod
    def describe(self) -> str:
        """One line naming the Kafka version, how it runs and where, for test headers and logs."""

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def stop(self, *, graceful: bool = True, timeout: float = 30.0) -> None:
        """Take the broker away; ``graceful=False`` is a SIGKILL-style crash."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self: _BrokerT) -> _BrokerT:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


class EnvBroker(Broker):
    """A broker someone else runs, named by an environment variable.

    We do not own it, so it cannot be stopped or restarted: tests that need
    that must fail clearly instead of silently doing nothing.
    """

    kind = "env"

    def __init__(self, bootstrap: str, source: str, *, ready_timeout: float = DEFAULT_READY_TIMEOUT) -> None:
        super().__init__("unknown")
        self._bootstrap = bootstrap
        self._source = source
        self._ready_timeout = ready_timeout
        self._closed = False

    @property
    def bootstrap(self) -> str:
        return self._bootstrap

    @property
    def running(self) -> bool:
        return not self._closed and self.last_start_seconds is not None

    def describe(self) -> str:
        return f"Kafka (version unknown; external broker from ${self._source}) at {self._bootstrap}"

    def start(self) -> None:
        if self.running:
            return
        if self._closed:
            raise RuntimeError("broker is closed")
        began = time.monotonic()
        try:
            wait_until_serving(self._bootstrap, Deadline(self._ready_timeout))
        except TimeoutError as exc:
            raise RuntimeError(f"the broker named by ${self._source}={self._bootstrap} does not answer: {exc}") from exc
        self.last_start_seconds = time.monotonic() - began

    def stop(self, *, graceful: bool = True, timeout: float = 30.0) -> None:
        raise RuntimeError(
            f"cannot stop the external broker from ${self._source}; unset it to let the tests "
            "launch a broker they can stop and restart"
        )

    def close(self) -> None:
        self._closed = True


class LocalJarBroker(Broker):
    """A KRaft single node (broker + controller) running the Apache Kafka jars in a JVM.

    The process runs in its own session so a stop reaches the whole process
    group and a Ctrl-C aimed at the test runner does not kill the broker
    before the fixtures tear it down in order.
    """

    kind = "local-jars"

    def __init__(
        self,
        version: str = DEFAULT_KAFKA_VERSION,
        *,
        overrides: Mapping[str, str] | None = None,
        cache_dir: Path | None = None,
        heap: str = "768m",
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        extra_listeners: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        """``extra_listeners`` maps a listener name to (the port it listens on, the port it advertises):
        a client that bootstraps on the advertised port (a proxy in front of the listen port) is told
        to use that port for every connection, so all of its traffic goes through the proxy."""
        super().__init__(version)
        self._overrides = dict(overrides or {})
        self._extra_listeners = dict(extra_listeners or {})
        self._cache_dir = cache_dir
        self._heap = heap
        self._ready_timeout = ready_timeout
        self._libs: Path | None = None
        self._workdir: Path | None = None
        self._port: int | None = None
        self._controller_port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: Any = None
        self._closed = False
        self._atexit_registered = False
        self._cds_archive: Path | None = None
        self._cds_pending: Path | None = None

    # -- public ------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        if self._port is None:
            raise RuntimeError("broker was never started, so it has no port yet")
        return f"127.0.0.1:{self._port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def workdir(self) -> Path | None:
        """Temp dir with server.properties, data and logs (for debugging a failed test)."""
        return self._workdir

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def describe(self) -> str:
        where = self.bootstrap if self._port is not None else "(not started)"
        return f"Apache Kafka {self.version} (local jars, KRaft single node) at {where}"

    def start(self) -> None:
        if self._closed:
            raise RuntimeError("broker is closed")
        if self.running:
            return
        began = time.monotonic()
        if self._workdir is None:
            self._prepare()
        self._spawn()
        try:
            wait_until_serving(self.bootstrap, Deadline(self._ready_timeout), check_alive=self._check_alive)
        except TimeoutError as exc:
            tail = self.log_tail()
            self._terminate(graceful=False, timeout=10.0)
            raise RuntimeError(
                f"local Kafka broker did not become ready at {self.bootstrap}: {exc}\n"
                f"--- broker log tail ({self._workdir}) ---\n{tail}"
            ) from exc
        self.last_start_seconds = time.monotonic() - began
        _log.info("%s ready in %.1f s (pid %s)", self.describe(), self.last_start_seconds, self.pid)

    def stop(self, *, graceful: bool = True, timeout: float = 30.0) -> None:
        if self._proc is None:
            return
        self._terminate(graceful=graceful, timeout=timeout)
        _log.info("stopped %s (%s)", self.describe(), "SIGTERM" if graceful else "SIGKILL")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._terminate(graceful=True, timeout=30.0)
        if self._atexit_registered:
            atexit.unregister(self.close)
            self._atexit_registered = False
        if self._workdir is not None:
            if os.environ.get("FASTRECOVER_KEEP_BROKER_DIR"):
                _log.info("keeping broker dir %s (FASTRECOVER_KEEP_BROKER_DIR is set)", self._workdir)
                # Without an owner it is never mistaken for an abandoned dir.
                (self._workdir / _OWNER_FILE).unlink(missing_ok=True)
            else:
                shutil.rmtree(self._workdir, ignore_errors=True)

    def log_tail(self, lines: int = 60) -> str:
        """The end of the broker's stdout/stderr and log4j log: the evidence when start-up fails."""
        if self._workdir is None:
            return "(no broker directory)"
        parts = []
        for name in ("kafka.out", "logs/server.log"):
            path = self._workdir / name
            if path.exists():
                parts.append(f"[{name}]\n{_tail(path, lines)}")
        return "\n".join(parts) or "(no log output)"

    # -- internals ---------------------------------------------------------------

    def _prepare(self) -> None:
        self._libs = ensure_kafka_jars(self.version, self._cache_dir)
        self.version = _version_from_jars(self._libs) or self.version
        self._cds_archive = _cds_archive_path(self._libs)
        _remove_abandoned_workdirs()
        workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
        (workdir / _OWNER_FILE).write_text(f"{os.getpid()}\n", encoding="ascii")
        self._workdir = workdir
        if not self._atexit_registered:
            atexit.register(self.close)
            self._atexit_registered = True
        (workdir / "logs").mkdir()
        self._port, self._controller_port = free_ports(2)
        extra = self._extra_listeners
        config: dict[str, str] = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "listeners": ",".join(
                [
                    f"PLAINTEXT://127.0.0.1:{self._port}",
                    f"CONTROLLER://127.0.0.1:{self._controller_port}",
                    *(f"{name}://127.0.0.1:{listen}" for name, (listen, _) in extra.items()),
                ]
            ),
            "advertised.listeners": ",".join(
                [f"PLAINTEXT://127.0.0.1:{self._port}", *(f"{n}://127.0.0.1:{adv}" for n, (_, adv) in extra.items())]
            ),
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": ",".join(
                ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT", *(f"{name}:PLAINTEXT" for name in extra)]
            ),
            "inter.broker.listener.name": "PLAINTEXT",
            # A static voter set: formatting needs no --standalone/--initial-controllers.
            "controller.quorum.voters": f"1@127.0.0.1:{self._controller_port}",
            "log.dirs": str(workdir / "data"),
            **BASE_BROKER_CONFIG,
            **self._overrides,
        }
        (workdir / "server.properties").write_text(
            "".join(f"{key}={value}\n" for key, value in config.items()), encoding="utf-8"
        )
        (workdir / "log4j2.xml").write_text(
            _LOG4J2_XML.format(log_file=workdir / "logs" / "server.log"), encoding="utf-8"
        )
        cmd = [
            _java(),
            *self._jvm_options(),
            "-cp",
            self._classpath(),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            _cluster_id(),
            "-c",
            str(workdir / "server.properties"),
        ]
        _log.debug("formatting storage: %s", " ".join(cmd))
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"kafka StorageTool format failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}"
            )

    def _jvm_options(self, *, dump_cds: bool = False) -> list[str]:
        """Options shared by the format tool and the broker.

        A class-data-sharing archive of the broker's classes cuts JVM start-up
        by 1-2 s (of about 4). The first broker dumps it when it exits; later
        starts, restarts included, map it. A stale archive is merely ignored
        by the JVM, so the only cost of getting this wrong is speed.
        """
        assert self._workdir is not None
        cds: list[str] = []
        archive = self._cds_archive
        if archive is not None and archive.is_file():
            cds = [f"-XX:SharedArchiveFile={archive}"]
        elif archive is not None and dump_cds and self._cds_pending is None:
            self._cds_pending = archive.with_name(f"{archive.name}.{os.getpid()}-{id(self)}.tmp")
            cds = [f"-XX:ArchiveClassesAtExit={self._cds_pending}"]
        return [
            *cds,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self._workdir / 'log4j2.xml'}",
            f"-Dkafka.logs.dir={self._workdir / 'logs'}",
        ]

    def _classpath(self) -> str:
        assert self._libs is not None
        return f"{self._libs}{os.sep}*"

    def _spawn(self) -> None:
        assert self._workdir is not None
        cmd = [
            _java(),
            f"-Xmx{self._heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            *self._jvm_options(dump_cds=True),
            "-cp",
            self._classpath(),
            "kafka.Kafka",
            str(self._workdir / "server.properties"),
        ]
        cmd = _orphan_guard() + cmd
        _log.debug("starting broker: %s", " ".join(cmd))
        self._out = open(self._workdir / "kafka.out", "ab")  # noqa: SIM115 - lives as long as the process
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=self._workdir,
            start_new_session=True,
        )

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise RuntimeError(
                f"local Kafka broker exited with code {self._proc.returncode} during start-up\n"
                f"--- broker log tail ({self._workdir}) ---\n{self.log_tail()}"
            )

    def _terminate(self, *, graceful: bool, timeout: float) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM if graceful else signal.SIGKILL)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    _log.warning("broker pid %s ignored SIGTERM for %.0f s; killing it", proc.pid, timeout)
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
            # Reap stragglers in the group (there should be none: the JVM is the only member).
            _signal_group(proc.pid, signal.SIGKILL)
        finally:
            self._proc = None
            if self._out is not None:
                self._out.close()
                self._out = None
            self._publish_cds_archive()

    def _publish_cds_archive(self) -> None:
        pending, archive = self._cds_pending, self._cds_archive
        if pending is None or archive is None:
            return
        self._cds_pending = None
        try:
            if pending.is_file() and pending.stat().st_size > 0 and not archive.exists():
                os.replace(pending, archive)
                _log.info("saved JVM class-data archive %s for faster broker starts", archive)
        finally:
            with contextlib.suppress(FileNotFoundError):
                pending.unlink()


class ContainerBroker(Broker):
    """Apache Kafka in a container (``apache/kafka``), started with testcontainers.

    testcontainers' ``KafkaContainer`` only drives Confluent ``cp-kafka``
    images and maps a random host port each time a container starts, which
    breaks restarting on the same address. A plain ``DockerContainer`` with the
    official image and a fixed host port runs the same Apache Kafka as the jar
    broker and survives stop/start with its data intact.
    """

    kind = "container"

    def __init__(
        self,
        image: str = DEFAULT_IMAGE,
        *,
        overrides: Mapping[str, str] | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
    ) -> None:
        tag = image.rsplit(":", 1)[1] if ":" in image else ""
        super().__init__(tag if re.fullmatch(r"\d+\.\d+\.\d+", tag) else "unknown")
        self.image = image
        self._overrides = dict(overrides or {})
        self._ready_timeout = ready_timeout
        self._container: Any = None
        self._host = "127.0.0.1"
        self._port: int | None = None
        self._running = False
        self._closed = False

    @property
    def bootstrap(self) -> str:
        if self._port is None:
            raise RuntimeError("broker was never started, so it has no port yet")
        return f"{self._host}:{self._port}"

    @property
    def running(self) -> bool:
        return self._running

    def describe(self) -> str:
        where = self.bootstrap if self._port is not None else "(not started)"
        return f"Apache Kafka {self.version} (container {self.image}, KRaft single node) at {where}"

    def start(self) -> None:
        if self._closed:
            raise RuntimeError("broker is closed")
        if self._running:
            return
        began = time.monotonic()
        if self._container is None:
            self._create_and_start()
        else:
            self._container.get_wrapped_container().start()
        self._running = True
        try:
            wait_until_serving(self.bootstrap, Deadline(self._ready_timeout))
        except TimeoutError as exc:
            raise RuntimeError(
                f"Kafka container {self.image} did not become ready at {self.bootstrap}: {exc}\n"
                f"--- container log tail ---\n{self.log_tail()}"
            ) from exc
        self.last_start_seconds = time.monotonic() - began
        _log.info("%s ready in %.1f s", self.describe(), self.last_start_seconds)

    def stop(self, *, graceful: bool = True, timeout: float = 30.0) -> None:
        if self._container is None or not self._running:
            return
        wrapped = self._container.get_wrapped_container()
        if graceful:
            wrapped.stop(timeout=int(timeout))
        else:
            wrapped.kill()
        self._running = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._container is not None:
            with contextlib.suppress(Exception):
                atexit.unregister(self.close)
            try:
                self._container.stop()
            except Exception:
                _log.warning("could not remove Kafka container", exc_info=True)
            self._container = None
        self._running = False

    def log_tail(self, lines: int = 60) -> str:
        if self._container is None:
            return "(no container)"
        try:
            stdout, stderr = self._container.get_logs()
        except Exception as exc:
            return f"(could not read container logs: {exc!r})"
        text = (stdout + stderr).decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def _create_and_start(self) -> None:
        from testcontainers.core.container import DockerContainer

        container = DockerContainer(self.image)
        try:
            host = str(container.get_docker_client().host())
        except Exception:
            host = "localhost"
        self._host = "127.0.0.1" if host == "localhost" else host
        (self._port,) = free_ports(1)
        config: dict[str, str] = {
            "node.id": "1",
            "process.roles": "broker,controller",
            "listeners": "PLAINTEXT://0.0.0.0:9092,CONTROLLER://localhost:9093",
            "advertised.listeners": f"PLAINTEXT://{self._host}:{self._port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.quorum.voters": "1@localhost:9093",
            "log.dirs": "/tmp/kraft-combined-logs",
            **BASE_BROKER_CONFIG,
            **self._overrides,
        }
        container.with_env("CLUSTER_ID", _cluster_id())
        for key, value in config.items():
            container.with_env(_image_env_name(key), value)
        container.with_bind_ports(9092, self._port)
        self._container = container
        atexit.register(self.close)
        container.start()


def _image_env_name(key: str) -> str:
    """Map a broker setting to the env variable the official image turns back into it."""
    return "KAFKA_" + key.replace("_", "__").replace("-", "___").replace(".", "_").upper()


# --------------------------------------------------------------------------- selection


def docker_available(timeout: float = 2.0) -> bool:
    """Whether a Docker engine answers right now (a client binary alone is not enough)."""
    try:
        docker = importlib.import_module("docker")
        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception as exc:
        _log.debug("no Docker engine: %r", exc)
        return False


def select_broker(
    overrides: Mapping[str, str] | None = None,
    *,
    version: str = DEFAULT_KAFKA_VERSION,
    ready_timeout: float = DEFAULT_READY_TIMEOUT,
) -> Broker:
    """Return a started broker, chosen as the module docstring describes.

    ``overrides`` are extra broker settings (``server.properties`` keys); they
    cannot be applied to an external broker, which is logged.
    """
    forced = os.environ.get("FASTRECOVER_BROKER", "").strip() or None
    if forced not in (None, "env", "container", "local-jars"):
        raise RuntimeError(f"FASTRECOVER_BROKER={forced!r}: expected env, container or local-jars")

    for var in ("FASTRECOVER_BOOTSTRAP", "KAFKA_BOOTSTRAP_SERVERS"):
        value = os.environ.get(var, "").strip()
        if value and forced in (None, "env"):
            if overrides:
                _log.warning("ignoring broker overrides %s: the broker from $%s is not ours", overrides, var)
            broker: Broker = EnvBroker(value, var, ready_timeout=ready_timeout)
            broker.start()
            return broker
    if forced == "env":
        raise RuntimeError(
            "FASTRECOVER_BROKER=env but neither FASTRECOVER_BOOTSTRAP nor KAFKA_BOOTSTRAP_SERVERS is set"
        )

    failures: list[str] = []
    if forced in (None, "container"):
        if docker_available():
            image = os.environ.get("FASTRECOVER_KAFKA_IMAGE", f"apache/kafka:{version}")
            broker = ContainerBroker(image, overrides=overrides, ready_timeout=ready_timeout)
            try:
                broker.start()
                return broker
            except Exception as exc:
                broker.close()
                failures.append(f"container {image}: {exc}")
                _log.warning("Kafka container failed, trying the local jar broker: %s", exc)
        else:
            failures.append("container: no Docker engine answers")
        if forced == "container":
            raise RuntimeError("FASTRECOVER_BROKER=container but " + "; ".join(failures))

    broker = LocalJarBroker(version, overrides=overrides, ready_timeout=ready_timeout)
    try:
        broker.start()
    except Exception as exc:
        broker.close()
        failures.append(f"local jars: {exc}")
        raise RuntimeError(
            "no Kafka broker available. Set FASTRECOVER_BOOTSTRAP=host:port to use a running broker "
            "(e.g. `docker compose up -d`), start a Docker engine, or install Java 17+ and Maven "
            "for the local jar broker.\n" + "\n".join(failures)
        ) from exc
    return broker


# --------------------------------------------------------------------------- readiness


def wait_until_serving(
    bootstrap: str,
    deadline: Deadline,
    *,
    check_alive: Callable[[], None] | None = None,
) -> None:
    """Block until the broker answers metadata requests and its group coordinator commits offsets.

    Metadata alone is not enough: the first group operation creates
    ``__consumer_offsets`` and waits for its partitions to load, and a test
    that ran into that window would see coordinator errors unrelated to what
    it tests. ``check_alive`` lets a launcher fail fast when its process died.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})

    def answers() -> bool:
        if check_alive is not None:
            check_alive()
        metadata = admin.list_topics(timeout=min(2.0, max(0.1, deadline.remaining())))
        return bool(metadata.brokers)

    wait_for(
        answers,
        deadline.remaining(),
        0.2,
        f"broker at {bootstrap} to answer metadata",
        ignore=(KafkaException,),
    )

    def creates_probe() -> bool:
        if check_alive is not None:
            check_alive()
        request = admin.create_topics([NewTopic(PROBE_TOPIC, 1, 1)], request_timeout=min(5.0, deadline.remaining()))
        try:
            request[PROBE_TOPIC].result(timeout=max(0.1, deadline.remaining()))
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return True
            if not probe_error_is_transient(error):
                raise RuntimeError(f"the broker at {bootstrap} refused the probe topic {PROBE_TOPIC}: {error}") from exc
            raise
        return True

    # A broker that has just answered metadata can still drop the next connection (a listener
    # still binding, a controller still electing): one such failure is not a broken broker.
    wait_for(
        creates_probe,
        deadline.remaining(),
        0.2,
        f"broker at {bootstrap} to create the probe topic {PROBE_TOPIC}",
        ignore=(KafkaException,),
    )
    _wait_for_partitions(admin, PROBE_TOPIC, 1, deadline)

    def commits() -> bool:
        if check_alive is not None:
            check_alive()
        request = [ConsumerGroupTopicPartitions(PROBE_GROUP, [TopicPartition(PROBE_TOPIC, 0, 0)])]
        futures = admin.alter_consumer_group_offsets(request, request_timeout=min(5.0, deadline.remaining()))
        result = futures[PROBE_GROUP].result(timeout=max(0.1, deadline.remaining()))
        return all(tp.error is None for tp in result.topic_partitions)

    wait_for(
        commits,
        deadline.remaining(),
        0.2,
        f"group coordinator at {bootstrap} to commit offsets",
        ignore=(KafkaException,),
    )
    with contextlib.suppress(Exception):
        admin.delete_consumer_groups([PROBE_GROUP], request_timeout=5.0)[PROBE_GROUP].result(timeout=5.0)


_TRANSIENT_PROBE_ERRORS = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_CONTROLLER,
    }
)


def probe_error_is_transient(error: KafkaError) -> bool:
    """Whether a failed creation of the probe topic is worth another try before the deadline.

    librdkafka does not flag a dropped connection (``_TRANSPORT``) as retriable, yet that is
    exactly what a broker still settling after its first metadata answer produces.
    """
    return bool(error.retriable()) or error.code() in _TRANSIENT_PROBE_ERRORS


def _wait_for_partitions(admin: Any, topic: str, partitions: int, deadline: Deadline) -> None:
    def complete() -> bool:
        metadata = admin.list_topics(topic=topic, timeout=min(2.0, max(0.1, deadline.remaining())))
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            return False
        return len(described.partitions) == partitions and all(
            p.leader >= 0 and p.error is None for p in described.partitions.values()
        )

    wait_for(
        complete,
        deadline.remaining(),
        0.1,
        f"topic {topic} to have {partitions} partitions with leaders",
        ignore=(KafkaException,),
    )


# --------------------------------------------------------------------------- jars


def kafka_cache_dir() -> Path:
    """Where resolved jars live across runs: ``$FASTRECOVER_CACHE`` or ``~/.cache/fastrecover``."""
    configured = os.environ.get("FASTRECOVER_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "fastrecover"


def ensure_kafka_jars(version: str = DEFAULT_KAFKA_VERSION, cache_dir: Path | None = None) -> Path:
    """Return the directory holding the broker's jars, resolving them with Maven the first time.

    Maven runs only when the marker written after a successful resolution is
    missing, into a scratch directory renamed into place, under a file lock,
    so parallel test processes and interrupted runs never see half a classpath.
    """
    base = (cache_dir or kafka_cache_dir()) / f"kafka-{version}"
    libs = base / "libs"
    marker = base / ".complete"
    if _jars_complete(libs, marker, version):
        return libs
    base.mkdir(parents=True, exist_ok=True)
    with _file_lock(base / ".lock"):
        if _jars_complete(libs, marker, version):
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError(
                f"Apache Kafka {version} jars are not in {libs} and `mvn` is not on PATH to resolve them"
            )
        pom = _pom_path(base.parent)
        scratch = base / f"libs.partial-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={scratch}",
            f"-Dkafka.version={version}",
        ]
        _log.info("resolving Apache Kafka %s jars into %s (once): %s", version, libs, " ".join(cmd))
        began = time.monotonic()
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        if result.returncode != 0 or _kafka_jar(scratch, version) is None:
            shutil.rmtree(scratch, ignore_errors=True)
            output = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
            raise RuntimeError(
                f"resolving Kafka {version} jars with Maven failed (exit {result.returncode}):\n{output}"
            )
        shutil.rmtree(libs, ignore_errors=True)
        scratch.rename(libs)
        marker.write_text(f"kafka {version} resolved {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n", encoding="utf-8")
        _log.info("resolved Kafka %s jars in %.1f s", version, time.monotonic() - began)
    return libs


def _cds_archive_path(libs: Path) -> Path | None:
    """Where the class-data archive for this JVM and these jars lives (None when disabled).

    The name hashes the JVM binary and the jar set, so a JDK upgrade or new
    jars get a fresh archive instead of one the JVM would reject.
    """
    if os.environ.get("FASTRECOVER_BROKER_CDS", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    java = Path(_java()).resolve()
    digest = hashlib.sha256()
    digest.update(f"{java}:{java.stat().st_mtime_ns}".encode())
    for jar in sorted(libs.glob("*.jar")):
        digest.update(f"{jar.name}:{jar.stat().st_size}".encode())
    return libs.parent / f"cds-{digest.hexdigest()[:16]}.jsa"


def _jars_complete(libs: Path, marker: Path, version: str) -> bool:
    return marker.exists() and _kafka_jar(libs, version) is not None


def _kafka_jar(libs: Path, version: str) -> Path | None:
    jar = libs / f"kafka_{SCALA_VERSION}-{version}.jar"
    return jar if jar.is_file() else None


def _version_from_jars(libs: Path) -> str | None:
    """The Kafka version the jars actually contain, so describe() never reports what we merely asked for."""
    pattern = re.compile(r"kafka_\d+\.\d+-(\d+\.\d+\.\d+[\w.-]*?)\.jar")
    for jar in sorted(libs.glob("kafka_*.jar")):
        match = pattern.fullmatch(jar.name)
        if match and not match.group(1).endswith(("-test", "-sources", "-javadoc")):
            return match.group(1)
    return None


def _pom_path(cache: Path) -> Path:
    """A copy of the packaged POM in the cache, so Maven never writes next to an installed package."""
    text = _POM_FILE.read_text(encoding="utf-8")
    pom = cache / "kafka-pom" / "pom.xml"
    pom.parent.mkdir(parents=True, exist_ok=True)
    if not pom.exists() or pom.read_text(encoding="utf-8") != text:
        pom.write_text(text, encoding="utf-8")
    return pom


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- small utilities


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file():
            return str(candidate)
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("`java` (17+) is not on PATH and JAVA_HOME is not set: cannot run the local Kafka broker")
    return java


def _cluster_id() -> str:
    """A Kafka-style cluster id (base64url UUID); like Kafka, avoid a leading '-' that parses as an option."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


def free_ports(count: int) -> list[int]:
    """Ports the kernel just handed out on loopback; all sockets are held open together so they differ."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


_WORKDIR_PREFIX = "fastrecover-kafka-"
_OWNER_FILE = "owner.pid"


def _remove_abandoned_workdirs() -> None:
    """Delete broker dirs left by processes that died without cleaning up (crash, SIGKILL).

    Their brokers are already gone (see :func:`_orphan_guard`), but each dir
    holds logs and data; only dirs whose owning process no longer exists are touched.
    """
    for path in Path(tempfile.gettempdir()).glob(_WORKDIR_PREFIX + "*"):
        try:
            owner = int((path / _OWNER_FILE).read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            continue
        if owner == os.getpid() or _pid_alive(owner):
            continue
        _log.info("removing broker dir %s abandoned by dead process %d", path, owner)
        shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _orphan_guard() -> list[str]:
    """A command prefix that makes the broker exit if this process dies without cleaning up.

    atexit does not run when the Python process is SIGKILLed or crashes, and a
    forgotten 768 MB JVM per run quickly starves a small machine. ``setpriv
    --pdeathsig`` asks the kernel to SIGTERM the broker when its parent goes
    away. The kernel ties that to the *thread* that spawned the broker, so the
    guard is only used from the main thread, which lives as long as the process.
    """
    if threading.current_thread() is not threading.main_thread():
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _tail(path: Path, lines: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 256 * lines))
        data = handle.read().decode("utf-8", "replace")
    return "\n".join(data.splitlines()[-lines:])


# --------------------------------------------------------------------------- client helpers

Payload = bytes | str | None


@dataclass(frozen=True)
class Record:
    """A record for :func:`produce` when a bare value is not enough."""

    value: Payload
    key: Payload = None
    partition: int | None = None
    headers: list[tuple[str, bytes]] | None = None
    timestamp_ms: int | None = None


class Delivered(NamedTuple):
    partition: int
    offset: int


def _admin(bootstrap: str) -> Any:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    config: Mapping[str, str] | None = None,
    *,
    replication_factor: int = 1,
    exist_ok: bool = False,
    timeout: float = 30.0,
) -> None:
    """Create a topic and return only once every partition has a leader, so producing cannot race it."""
    admin = _admin(bootstrap)
    deadline = Deadline(timeout)
    topic = NewTopic(name, partitions, replication_factor, config=dict(config or {}))
    try:
        admin.create_topics([topic], request_timeout=min(timeout, 30.0))[name].result(timeout=deadline.remaining())
    except KafkaException as exc:
        if not (exist_ok and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise
    _wait_for_partitions(admin, name, partitions, deadline)


def delete_topic(bootstrap: str, name: str, *, missing_ok: bool = True, timeout: float = 30.0) -> None:
    """Delete a topic and wait until metadata no longer lists it, so the name can be reused at once."""
    admin = _admin(bootstrap)
    deadline = Deadline(timeout)
    try:
        admin.delete_topics([name], request_timeout=min(timeout, 30.0))[name].result(timeout=deadline.remaining())
    except KafkaException as exc:
        if not (missing_ok and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise

    def gone() -> bool:
        return name not in admin.list_topics(timeout=min(2.0, max(0.1, deadline.remaining()))).topics

    wait_for(gone, deadline.remaining(), 0.1, f"topic {name} to disappear", ignore=(KafkaException,))


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[Payload | Record],
    partition: int | None = None,
    *,
    key: Payload = None,
    config: Mapping[str, Any] | None = None,
    timeout: float = 30.0,
) -> list[Delivered]:
    """Produce, flush and return where each record landed, in input order.

    ``records`` are bare values (``str`` is UTF-8 encoded, ``None`` is a
    tombstone) or :class:`Record` objects; ``partition``/``key`` apply to bare
    values and to records that do not set their own.
    """
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **(config or {})})
    results: list[Delivered | None] = []
    errors: list[str] = []

    def on_delivery(index: int) -> Callable[[Any, Any], None]:
        def report(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(f"record {index}: {err}")
            else:
                results[index] = Delivered(msg.partition(), msg.offset())

        return report

    for index, item in enumerate(records):
        record = item if isinstance(item, Record) else Record(value=item)
        kwargs: dict[str, Any] = {}
        target = record.partition if record.partition is not None else partition
        if target is not None:
            kwargs["partition"] = target
        if record.headers is not None:
            kwargs["headers"] = record.headers
        if record.timestamp_ms is not None:
            kwargs["timestamp"] = record.timestamp_ms
        results.append(None)
        while True:
            try:
                producer.produce(
                    topic,
                    value=record.value,
                    key=record.key if record.key is not None else key,
                    on_delivery=on_delivery(index),
                    **kwargs,
                )
                break
            except BufferError:
                # Local queue full (large batches): let deliveries drain, then retry.
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(timeout)
    if remaining:
        raise TimeoutError(f"{remaining} record(s) to {topic} still undelivered after {timeout:g} s")
    if errors:
        raise RuntimeError(f"producing to {topic} failed: " + "; ".join(errors[:5]))
    delivered = [r for r in results if r is not None]
    if len(delivered) != len(results):
        raise RuntimeError(f"producing to {topic}: {len(results) - len(delivered)} record(s) got no delivery report")
    return delivered


def group_is_empty(bootstrap: str, group: str, *, timeout: float = 10.0) -> bool:
    """Whether the group has no members (an unknown group counts as empty).

    Tests use it to know a consumer really left before asserting on what a
    successor sees; transient coordinator errors are retried within ``timeout``.
    """
    admin = _admin(bootstrap)
    deadline = Deadline(timeout)
    while True:
        try:
            future = admin.describe_consumer_groups([group], request_timeout=min(5.0, max(0.1, timeout)))[group]
            description = future.result(timeout=max(0.1, deadline.remaining()))
            return len(description.members) == 0
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.GROUP_ID_NOT_FOUND:
                return True
            if not error.retriable() and error.code() not in (
                KafkaError.NOT_COORDINATOR,
                KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                KafkaError.COORDINATOR_NOT_AVAILABLE,
            ):
                raise
            if deadline.expired():
                raise TimeoutError(f"describing group {group} kept failing for {timeout:g} s: {error}") from exc
            time.sleep(min(0.2, deadline.remaining()))


# --------------------------------------------------------------------------- __main__


def main(argv: list[str] | None = None) -> int:
    """Run a broker until Ctrl-C or SIGTERM, for poking at it by hand."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fastrecover_tools.testing.broker", description=main.__doc__)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra broker setting (repeatable)"
    )
    parser.add_argument("--version", default=DEFAULT_KAFKA_VERSION, help="Apache Kafka version for local jars")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = value.strip()

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGTERM behaves like Ctrl-C so the `with` block (or, mid-start, atexit) tears the broker down.
    signal.signal(signal.SIGTERM, interrupt)
    try:
        with select_broker(overrides, version=args.version) as broker:
            print(broker.describe(), flush=True)
            print(f"started in {broker.last_start_seconds or 0:.1f} s; Ctrl-C to stop", flush=True)
            print(f"export FASTRECOVER_BOOTSTRAP={broker.bootstrap}", flush=True)
            while broker.running:
                time.sleep(0.5)
            print("broker exited on its own", file=sys.stderr, flush=True)
            return 1
    except KeyboardInterrupt:
        print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
