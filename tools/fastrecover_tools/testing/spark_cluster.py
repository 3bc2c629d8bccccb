"""A real Spark standalone cluster for tests and benchmarks: a master and N workers, each its own JVM.

The JVMs are started from the installed PySpark distribution (``bin/spark-class``
with ``org.apache.spark.deploy.master.Master`` and ``...worker.Worker``), the way
:mod:`fastrecover_tools.testing.broker` starts a Kafka broker from jars. Every
process binds to and advertises the loopback address only: ``SPARK_LOCAL_IP`` and
``SPARK_LOCAL_HOSTNAME`` are ``127.0.0.1`` and every daemon gets ``--host 127.0.0.1``
(a driver must set ``spark.driver.host`` and ``spark.driver.bindAddress`` too:
:meth:`SparkCluster.driver_conf`).

Nothing falls back to ``local[*]``: if the cluster cannot start, :meth:`SparkCluster.start`
raises ``RuntimeError`` with the tail of the daemons' logs. Waits are on conditions
(the master's ``/json`` status) with deadlines. Workers can be SIGKILLed and started
again, which the executor-loss tests use. The daemons' logs and work directories
(executors' stdout and stderr) stay under the cluster's root for failure reports.

Run ``python -m fastrecover_tools.testing.spark_cluster`` for a cluster to use by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from fastrecover_tools.testing.waiting import Deadline, wait_for

__all__ = ["LOOPBACK", "SparkCluster", "Worker", "spark_home"]

_log = logging.getLogger("fastrecover_tools.testing.spark_cluster")

LOOPBACK = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
#: A lost worker (SIGKILL) is declared dead by the master after this many seconds (Spark's default is 60).
#: Workers heartbeat every quarter of it, so master and workers must both be given it.
WORKER_TIMEOUT_S = 12


def spark_home() -> Path:
    """The installed PySpark distribution (it ships ``bin/spark-class`` and the jars)."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise RuntimeError(f"the PySpark at {home} has no bin/spark-class: cannot start a standalone cluster")
    return home


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return f"({path} does not exist)"
    return "\n".join(text[-lines:])


@dataclass
class Worker:
    """One worker JVM: its ports, work directory (executors' logs) and log file."""

    index: int
    port: int
    webui_port: int
    work_dir: Path
    log_file: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class SparkCluster:
    """A master and ``workers`` workers (``cores`` cores and ``memory`` each) on the loopback address."""

    root: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    daemon_memory: str = "256m"
    ready_timeout: float = 120.0
    master_port: int = field(default_factory=_free_port)
    master_webui_port: int = field(default_factory=_free_port)
    _master: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _workers: list[Worker] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.conf_dir = self.root / "conf"  # empty: no spark-env.sh or defaults from the machine
        self.conf_dir.mkdir(exist_ok=True)
        self.log_dir = self.root / "logs"
        self.log_dir.mkdir(exist_ok=True)
        for i in range(self.workers):
            self._workers.append(
                Worker(
                    index=i,
                    port=_free_port(),
                    webui_port=_free_port(),
                    work_dir=self.root / f"worker-{i}" / "work",
                    log_file=self.log_dir / f"worker-{i}.log",
                )
            )

    # ------------------------------------------------------------------ addresses

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.master_port}"

    @property
    def status_url(self) -> str:
        return f"http://{LOOPBACK}:{self.master_webui_port}/json/"

    def worker(self, index: int) -> Worker:
        return self._workers[index]

    def driver_conf(self) -> dict[str, str]:
        """What a driver needs to run on this cluster over the loopback address only."""
        return {
            "spark.master": self.master_url,
            "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK,
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * self.workers),
        }

    # ------------------------------------------------------------------ processes

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_CONF_DIR=str(self.conf_dir),
            SPARK_LOG_DIR=str(self.log_dir),
            SPARK_LOCAL_IP=LOOPBACK,
            SPARK_LOCAL_HOSTNAME=LOOPBACK,
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            SPARK_MASTER_OPTS=f"-Dspark.worker.timeout={WORKER_TIMEOUT_S} -Dspark.master.rest.enabled=false",
            # Keep finished applications' directories (executors' logs) for the reports and the secrets check.
            SPARK_WORKER_OPTS=f"-Dspark.worker.timeout={WORKER_TIMEOUT_S} -Dspark.worker.cleanup.enabled=false",
            # The executors a worker launches inherit this environment: their Python workers run this
            # interpreter (the driver's spark.pyspark.python says so too).
            PYSPARK_PYTHON=sys.executable,
        )
        return env

    def _spawn(self, args: list[str], log_file: Path) -> subprocess.Popen[bytes]:
        command = [str(spark_home() / "bin" / "spark-class"), *args]
        _log.info("starting %s (log %s)", " ".join(command), log_file)
        with open(log_file, "ab") as log:
            # spark-class execs the JVM, so the pid is the JVM's; a session of its own, so stopping the
            # cluster can end the executors (the worker's children) with it.
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=self.root,
                start_new_session=True,
            )

    def status(self) -> dict[str, object]:
        """The master's ``/json`` status (workers, applications)."""
        with urllib.request.urlopen(self.status_url, timeout=5) as response:
            data: dict[str, object] = json.loads(response.read())
            return data

    def alive_workers(self) -> set[int]:
        """Ports of the workers the master has as ALIVE."""
        workers = self.status().get("workers", [])
        assert isinstance(workers, list)
        return {int(w["port"]) for w in workers if w.get("state") == "ALIVE"}

    def start(self) -> None:
        """Start the master and every worker; return when the master has them all as ALIVE."""
        began = time.monotonic()
        deadline = Deadline(self.ready_timeout)
        if self._master is None or self._master.poll() is not None:
            self._master = self._spawn(
                [
                    MASTER_CLASS,
                    "--host",
                    LOOPBACK,
                    "--port",
                    str(self.master_port),
                    "--webui-port",
                    str(self.master_webui_port),
                ],
                self.log_dir / "master.log",
            )
            self._wait(lambda: self.status().get("status") == "ALIVE", deadline, "the Spark master to be ALIVE")
        for worker in self._workers:
            self._spawn_worker(worker)
        self.wait_workers({w.index for w in self._workers}, deadline)
        _log.info("Spark cluster %s up in %.1f s", self.describe(), time.monotonic() - began)

    def _spawn_worker(self, worker: Worker) -> None:
        if worker.alive:
            return
        worker.work_dir.mkdir(parents=True, exist_ok=True)
        worker.starts += 1
        worker.process = self._spawn(
            [
                WORKER_CLASS,
                "--host",
                LOOPBACK,
                "--port",
                str(worker.port),
                "--webui-port",
                str(worker.webui_port),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(worker.work_dir),
                self.master_url,
            ],
            worker.log_file,
        )

    def wait_workers(self, indexes: set[int], deadline: Deadline) -> None:
        ports = {self._workers[i].port for i in indexes}
        self._wait(lambda: ports <= self.alive_workers(), deadline, f"worker(s) {sorted(indexes)} to register ALIVE")

    def _wait(self, predicate: Callable[[], object], deadline: Deadline, what: str) -> None:
        def check() -> bool:
            if self._master is not None and self._master.poll() is not None:
                raise RuntimeError(f"the Spark master exited ({self._master.returncode}):\n{self.log_tails()}")
            for w in self._workers:
                if w.process is not None and w.process.poll() is not None and w.process.returncode != -signal.SIGKILL:
                    raise RuntimeError(f"Spark worker {w.index} exited ({w.process.returncode}):\n{self.log_tails()}")
            return bool(predicate())

        try:
            wait_for(check, deadline.remaining(), 0.2, what, ignore=(OSError,))
        except TimeoutError as exc:
            raise RuntimeError(f"Spark cluster: {exc}\n{self.log_tails()}") from exc

    def kill_worker(self, index: int) -> int:
        """SIGKILL worker ``index``'s JVM (a crash, not a shutdown); returns its pid once it is gone.

        Its executors are left alone: they notice the lost worker themselves (as on a real host whose
        worker daemon died) or die with their host in the executor-loss tests' own kill.
        """
        worker = self._workers[index]
        if worker.process is None or not worker.alive:
            raise RuntimeError(f"worker {index} is not running")
        pid = worker.process.pid
        os.kill(pid, signal.SIGKILL)
        worker.process.wait(timeout=30)
        _log.info("SIGKILLed Spark worker %d (pid %d)", index, pid)
        return pid

    def restart_worker(self, index: int, timeout: float = 120.0) -> None:
        """Start worker ``index`` again (after :meth:`kill_worker`) and wait until the master has it ALIVE."""
        worker = self._workers[index]
        self._spawn_worker(worker)
        self.wait_workers({index}, Deadline(timeout))

    def executor_pids(self, index: int) -> list[int]:
        """Pids of the executor JVMs worker ``index`` launched that are still running (from /proc)."""
        worker = self._workers[index]
        pids: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmdline and any(
                arg.startswith(f"spark://Worker@{LOOPBACK}:{worker.port}".encode()) for arg in cmdline
            ):
                pids.append(int(entry.name))
        return pids

    def pids(self) -> list[int]:
        """Every running JVM of the cluster: the master, the workers and their executors."""
        pids = [
            p.pid for p in (self._master, *(w.process for w in self._workers)) if p is not None and p.poll() is None
        ]
        for w in self._workers:
            pids.extend(self.executor_pids(w.index))
        return pids

    def listening_addresses(self) -> set[tuple[int, str, int]]:
        """(pid, address, port) of every socket the cluster's JVMs listen on."""
        import psutil

        found: set[tuple[int, str, int]] = set()
        for pid in self.pids():
            with contextlib.suppress(psutil.NoSuchProcess):
                for conn in psutil.Process(pid).net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN:
                        found.add((pid, conn.laddr.ip, conn.laddr.port))
        return found

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every daemon's process group (workers first, with their executors), SIGKILL what stays."""
        processes = [w.process for w in self._workers if w.process is not None]
        if self._master is not None:
            processes.append(self._master)
        for proc in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = Deadline(timeout)
        for proc in processes:
            try:
                proc.wait(timeout=deadline.remaining())
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # Executors of a worker killed earlier were in that worker's group; end any still there.
        for w in self._workers:
            for pid in self.executor_pids(w.index):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._master = None
        for w in self._workers:
            w.process = None

    def log_tails(self, lines: int = 30) -> str:
        parts = [f"--- master.log ---\n{_tail(self.log_dir / 'master.log', lines)}"]
        for w in self._workers:
            parts.append(f"--- worker-{w.index}.log ---\n{_tail(w.log_file, lines)}")
        return "\n".join(parts)

    def describe(self) -> str:
        return (
            f"Spark standalone {self.master_url}: {self.workers} worker(s) x {self.cores} core(s), "
            f"{self.memory} each, root {self.root}"
        )

    def executor_logs(self) -> Iterator[Path]:
        """Every file under the workers' work directories (executors' stdout/stderr, fetched jars)."""
        for w in self._workers:
            if w.work_dir.exists():
                yield from (p for p in w.work_dir.rglob("*") if p.is_file())

    def worker_logs(self) -> Iterator[Path]:
        """The workers' own log files."""
        for w in self._workers:
            yield w.log_file

    def __enter__(self) -> SparkCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def session_conf(cluster: SparkCluster, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A driver's conf for ``cluster``: loopback, the executors' Python, modest memory; ``extra`` last."""
    conf = {
        **cluster.driver_conf(),
        "spark.executor.memory": "640m",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.ui.enabled": "false",
    }
    conf.update(extra or {})
    return conf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A Spark standalone cluster on 127.0.0.1 (Ctrl-C stops it).")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--memory", default="1g")
    parser.add_argument("--root", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    root = args.root or Path(tempfile.mkdtemp(prefix="fastrecover-spark-"))
    with SparkCluster(root, workers=args.workers, cores=args.cores, memory=args.memory) as cluster:
        print(f"{cluster.describe()}\nmaster: {cluster.master_url}  status: {cluster.status_url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
