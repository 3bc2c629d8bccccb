"""The chaos driver: consumer processes in parallel-rebalance mode, killed and restarted at random.

Each *member* of the group is a :mod:`fastrecover_tools.testing.worker` process; each
time a member is (re)started it is a new *incarnation* (``m2#7``) with its own
ledger file, event log and stderr log in the work directory.  While the
:class:`~fastrecover_tools.chaos.producer.SequencedProducer` writes at a steady rate,
every live incarnation is SIGKILLed once its random uptime is over (or, for a share of them,
*frozen*: SIGSTOPped for a while and then let go on, as a process paused by the machine, a long
garbage collection or a frozen network comes back as a zombie; or, given each member its own
proxy to Kafka, its *network* is frozen while the process runs on and its store stays reachable),
or, for the
share of incarnations started with a stall point (``--stall-at``: mid-batch, in
the token-writing transaction, mid range-commit, between the store and the
Kafka commit, ...), as soon as it reports that it is blocked there; it comes
back after a random downtime with a randomly chosen commit style (per message,
sync, async, auto-commit).  With several members, rebalances move partitions and
their ranges between them; with static membership a quick restart gets its
partitions back without a rebalance, a slow one loses them.

After ``cycles`` kills the driver *drains*: it stops the producer, restarts every
member without faults, waits until every acknowledged record is in the ledger,
stops the members gracefully (their final commit), and repeats until the store
has no open range.  Then :func:`fastrecover_tools.chaos.checker.analyze` gives the
verdict.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import KafkaException, TopicPartition
from sqlalchemy.exc import SQLAlchemyError

import fastrecover
import fastrecover_tools
from fastrecover.errors import StoreError
from fastrecover.secrets import mask_url
from fastrecover.store import open_store
from fastrecover.store.engine import url_for_child
from fastrecover.tokens import Token
from fastrecover_tools.chaos.checker import (
    Effect,
    Incarnation,
    Key,
    OperatorLog,
    Produced,
    Verdict,
    analyze,
    not_reread,
    parse_ledger_line,
    parse_produced_line,
    read_ledgers,
    read_produced,
)
from fastrecover_tools.chaos.operator import ACTIONS, NEEDS_STOP, Operator
from fastrecover_tools.chaos.producer import SequencedProducer, read_topic
from fastrecover_tools.testing.broker import create_topic, group_is_empty
from fastrecover_tools.testing.proxy import FreezableProxy
from fastrecover_tools.testing.waiting import Deadline, wait_for
from fastrecover_tools.testing.worker import APIS, STALL_POINTS

log = logging.getLogger("fastrecover_tools.chaos")

COMMIT_MODES = ("message", "message-async", "store", "sync", "async", "auto")
#: group.protocol values a campaign can run with (classic groups, or KIP-848 consumer groups)
GROUP_PROTOCOLS = ("classic", "consumer")
_TICK_S = 0.02
#: How many arrivals at a stall point before blocking there, per point: (low, high).
_STALL_AFTER = {
    "batch": (1, 30),
    "backfill": (1, 300),
    "token-write": (1, 3),
    "claim": (1, 3),
    "store-commit": (1, 20),
    "between-commits": (1, 20),
}


#: fastrecover.recovery.replay.max.offsets of the replay-share incarnations: the library's default, and a
#: limit most lags of a campaign pass
REPLAY_LIMITS = (10_000, 50)


@dataclass
class ChaosConfig:
    """What to run; the defaults are the bounded CI campaign's."""

    bootstrap: str
    store_url: str = field(repr=False)  # may carry a password: left out of repr()
    workdir: Path
    cycles: int = 20
    members: int = 1
    topics: int = 3
    partitions: int = 6
    rate: float = 300.0
    commit_modes: Sequence[str] = COMMIT_MODES
    #: consume() alone by default, so a seed gives the schedule it gave before poll() was added (the fault
    #: tests fix their seeds); `fastrecover chaos` draws both unless told otherwise
    apis: Sequence[str] = ("consume",)
    #: the members' group.protocol; with "consumer" the broker's group.consumer.session.timeout.ms decides
    #: when a dead member's partitions move (session_ms is a classic-group setting)
    group_protocol: str = "classic"
    commit_every: int = 50
    batch: int = 100
    min_offsets: int = 20
    session_ms: int = 3000
    static: bool = True
    up_s: tuple[float, float] = (1.0, 4.0)
    down_s: tuple[float, float] = (0.0, 3.0)
    stall_share: float = 0.3
    stall_points: Sequence[str] = STALL_POINTS
    fail_child_share: float = 0.1
    work_us: int = 0
    seed: int | None = None
    drain_timeout_s: float = 240.0
    group: str | None = None
    topic_names: Sequence[str] | None = None
    worker_args: Sequence[str] = ()
    #: the member process's module (tests swap in a shim, e.g. for group.protocol=consumer)
    worker_module: str = "fastrecover_tools.testing.worker"
    #: operator actions (:data:`fastrecover_tools.chaos.operator.ACTIONS`) mixed into the kill schedule;
    #: none by default, so a fault test's seed gives the schedule it always gave
    operator_actions: Sequence[str] = ()
    #: one operator action every this many kills
    operator_every: int = 10
    #: share of incarnations that do not wait for the store at their first recovery: fastrecover.recovery.
    #: replay.max.offsets is one of REPLAY_LIMITS (a small lag is replayed, a larger one too while the store
    #: opens, then jumps late from where the replay got to); the others set 0 and open the store at once
    replay_share: float = 0.0
    #: share of uptimes that end in a freeze instead of a kill: the incarnation is SIGSTOPped for a time
    #: drawn from ``freeze_s`` (beyond ``session_ms`` the group moves its partitions on without it), then
    #: SIGCONTed, and it runs on, a zombie until it notices, to its next kill time; drawn from a generator
    #: of its own, so a seed's kill schedule does not change with it
    freeze_share: float = 0.0
    freeze_s: tuple[float, float] = (2.0, 8.0)
    #: share of the other uptimes that end in a frozen network instead of a kill: the member's proxy to
    #: Kafka stops the bytes for a time drawn from ``freeze_s`` while the process runs on and reaches its
    #: store (the driver needs ``networks``); then the bytes flow again and the member runs to its next
    #: kill time.  Drawn from the freeze generator, and only when above 0
    net_freeze_share: float = 0.0

    def __post_init__(self) -> None:
        if self.cycles < 0 or self.members < 1 or self.topics < 1 or self.partitions < 1:
            raise ValueError("cycles >= 0, members >= 1, topics >= 1 and partitions >= 1 are required")
        bad = [m for m in self.commit_modes if m not in COMMIT_MODES]
        if bad or not self.commit_modes:
            raise ValueError(f"commit modes must be among {COMMIT_MODES}, got {list(self.commit_modes)}")
        if not self.apis or any(a not in APIS for a in self.apis):
            raise ValueError(f"apis must be among {APIS}, got {list(self.apis)}")
        if self.group_protocol not in GROUP_PROTOCOLS:
            raise ValueError(f"group_protocol must be one of {GROUP_PROTOCOLS}, got {self.group_protocol!r}")
        bad = [p for p in self.stall_points if p not in STALL_POINTS]
        if bad:
            raise ValueError(f"stall points must be among {STALL_POINTS}, got {bad}")
        shares = (self.stall_share, self.fail_child_share, self.replay_share, self.freeze_share, self.net_freeze_share)
        if not all(0 <= share <= 1 for share in shares):
            raise ValueError(
                "stall_share, fail_child_share, replay_share, freeze_share and net_freeze_share are fractions in [0, 1]"
            )
        if not 0 < self.freeze_s[0] <= self.freeze_s[1]:
            raise ValueError(f"freeze_s must be (low, high) seconds with 0 < low <= high, got {self.freeze_s}")
        bad = [a for a in self.operator_actions if a not in ACTIONS]
        if bad:
            raise ValueError(f"operator actions must be among {ACTIONS}, got {bad}")
        if self.operator_every < 1:
            raise ValueError(f"operator_every must be >= 1, got {self.operator_every}")


@dataclass
class ChaosResult:
    """The verdict plus what the driver did to get it."""

    verdict: Verdict
    config: ChaosConfig
    group: str
    topics: list[str]
    seconds: float
    chaos_seconds: float
    drain_seconds: float
    drain_passes: int
    incarnations: list[Incarnation]
    stalls: Counter[str] = field(default_factory=Counter)
    stalls_missed: int = 0
    #: incarnations frozen (SIGSTOP) and let go on (SIGCONT), and how many of those freezes outlasted session_ms
    freezes: int = 0
    freezes_past_session: int = 0
    #: networks frozen (the member's proxy to Kafka stopped while the process ran on), and how many outlasted
    #: session_ms
    net_freezes: int = 0
    net_freezes_past_session: int = 0
    child_failures: int = 0
    #: incarnations that exited on a fatal consumer error (e.g. UNRELEASED_INSTANCE_ID) and were restarted
    fatal_exits: int = 0
    commit_failures: Counter[str] = field(default_factory=Counter)
    commit_modes: Counter[str] = field(default_factory=Counter)
    apis: Counter[str] = field(default_factory=Counter)
    recoveries: int = 0
    degraded_recoveries: int = 0
    produced_failed: int = 0
    notes: list[str] = field(default_factory=list)
    #: what the operator did, in order ("reset-earliest: t to [0]=0, ...")
    operator: list[str] = field(default_factory=list)
    #: and what each of those obliges or excuses (the checker's input)
    operator_effects: list[Effect] = field(default_factory=list)


class WorkerProc:
    """One incarnation: the worker subprocess and the events it printed (also saved to a file)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        workdir: Path,
        env: dict[str, str],
        commit_mode: str = "",
        module: str = "fastrecover_tools.testing.worker",
        api: str = "consume",
    ) -> None:
        self.name = name
        self.commit_mode = commit_mode
        self.api = api
        self.member = name.split("#", 1)[0]
        safe = name.replace("#", "-")
        self.ledger = workdir / "ledger" / f"{safe}.ledger"
        self.log_path = workdir / "logs" / f"{safe}.log"
        self._stderr: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115
        self._events_file = open(workdir / "events" / f"{safe}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self.started_ms = int(time.time() * 1000)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *argv, "--ledger", str(self.ledger)],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            text=True,
            cwd=str(workdir),
        )
        self._lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.ended_ms: int | None = None
        self.end = "running"
        self._reader = threading.Thread(target=self._read, name=f"events-{name}", daemon=True)
        self._reader.start()
        #: SIGSTOPped and not yet SIGCONTed
        self.frozen = False

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._events_file.write(line)
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self._lock:
                self.events.append(event)
        self._events_file.close()

    def has(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return next((e for e in self.events if e.get("event") == name), None)

    def count(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e.get("event") == name]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def dump_stacks(self, lines: int = 80) -> str:
        """Ask a live worker for every thread's stack (SIGUSR1, faulthandler) and return its log's tail."""
        if self.alive:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(0.5)  # faulthandler writes from the signal handler at once; give the pipe a moment
        self._stderr.flush()
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return f"--- {self.name} ({'alive' if self.alive else 'exited'}) log tail ---\n" + "\n".join(text[-lines:])

    def freeze(self) -> None:
        """SIGSTOP: every thread stops where it is; sockets and the store's connections stay open."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)
            self.frozen = True

    def thaw(self) -> None:
        """SIGCONT: the incarnation runs on from where it stopped, whatever the group did meanwhile."""
        if self.frozen:
            self.frozen = False
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGCONT)

    def kill(self, how: str = "killed") -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)  # a stopped process dies of it too
        self.proc.wait(30)
        self._finish(how)

    def terminate(self, timeout: float = 60.0) -> bool:
        """SIGTERM (final commit and close); SIGKILL after ``timeout``. True if it stopped on its own."""
        self.thaw()  # a stopped process would hold SIGTERM until SIGCONT
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
            clean = True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            clean = False
        self._finish("stopped" if clean else "killed")
        return clean

    def _finish(self, how: str) -> None:
        if self.ended_ms is None:
            self.ended_ms = int(time.time() * 1000)
            code = self.proc.returncode
            self.end = how if how != "stopped" or code == 0 else f"exited:{code}"
        self._reader.join(10)
        self._stderr.close()

    def incarnation(self) -> Incarnation:
        return Incarnation(self.name, self.started_ms, self.ended_ms, self.end)


class _Tail:
    """Incremental reader of growing line files (ledgers, the producer log)."""

    def __init__(self) -> None:
        self._pos: dict[Path, int] = {}

    def new_lines(self, paths: Sequence[Path]) -> list[str]:
        out: list[str] = []
        for path in paths:
            pos = self._pos.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(pos)
                    data = f.read()
            except FileNotFoundError:
                continue
            cut = data.rfind(b"\n")
            if cut < 0:
                continue
            self._pos[path] = pos + cut + 1
            out.extend(data[: cut + 1].decode("utf-8", "replace").splitlines())
        return out


@dataclass
class _Member:
    name: str
    incarnations: int = 0
    proc: WorkerProc | None = None
    kill_at: float | None = None
    uptime: float = 0.0
    stall: str | None = None
    stall_deadline: float | None = None
    restart_at: float | None = None
    #: frozen until then (SIGCONT is due); None: not frozen
    thaw_at: float | None = None
    #: this incarnation was frozen once already (it is killed at its next kill time)
    froze: bool = False
    #: the member's own proxy to Kafka (ChaosDriver's ``networks``); None: it reaches the broker directly
    network: FreezableProxy | None = None
    #: the member's network to Kafka is frozen until then; None: flowing
    net_thaw_at: float | None = None
    net_frozen_since: float = 0.0


class ChaosDriver:
    """Run one campaign (see the module docstring).

    ``on_kill(driver, incarnation)`` runs right after each kill, before the
    member's restart is scheduled: fault tests use it to take the store or the
    broker away at that moment.  ``networks`` are the members' own proxies to Kafka
    (:func:`~fastrecover_tools.testing.proxy.proxied_listeners`): member ``i`` bootstraps on
    proxy ``i``, and ``net_freeze_share`` freezes them.
    """

    def __init__(
        self,
        config: ChaosConfig,
        *,
        on_kill: Callable[[ChaosDriver, WorkerProc], None] | None = None,
        faults: Callable[[ChaosDriver, str], list[str]] | None = None,
        networks: Sequence[FreezableProxy] = (),
    ) -> None:
        if networks and len(networks) != config.members:
            raise ValueError(f"one network per member: {len(networks)} networks for {config.members} members")
        if config.net_freeze_share and not networks:
            raise ValueError("net_freeze_share needs networks: a proxy to Kafka per member")
        self.config = config
        self.rng = random.Random(config.seed)
        self.on_kill = on_kill
        self.faults_for = faults
        self.workdir = config.workdir
        for sub in ("ledger", "logs", "events"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        tag = uuid.uuid4().hex[:8]
        self.group = config.group or f"chaos-{tag}"
        self.topics = list(config.topic_names or [f"chaos-{tag}-{i}" for i in range(config.topics)])
        self.members = [_Member(f"m{i + 1}", network=networks[i] if networks else None) for i in range(config.members)]
        self.procs: list[WorkerProc] = []
        self.kills = 0
        self.producer: SequencedProducer | None = None
        self.produced_log = self.workdir / "produced.log"
        self._env = dict(os.environ)
        # the workers import the library and these tools from where this process did
        roots = [str(Path(m.__file__ or "").resolve().parents[1]) for m in (fastrecover, fastrecover_tools)]
        self._env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [self._env.get("PYTHONPATH")])])
        # secrets of the store URL go to the workers through their environment, never argv (ps shows argv)
        self._argv_store_url, secret_env = url_for_child(config.store_url)
        self._env.update(secret_env)
        self.notes: list[str] = []
        self.stalls_missed = 0
        self.freezes = 0
        self.freezes_past_session = 0
        self.net_freezes = 0
        self.net_freezes_past_session = 0
        #: every freeze, by incarnation: (stopped, let go on), wall-clock ms (the checker's input)
        self.frozen: dict[str, list[tuple[int, int]]] = {}
        self._stopped_ms: dict[str, int] = {}
        self._target = 0
        self._began = time.monotonic()
        self.partitions = {t: config.partitions for t in self.topics}
        self.operator: Operator | None = None
        if config.operator_actions:
            # its own generator: the kill schedule of a seed does not depend on the operator's draws
            rng = random.Random(f"operator-{config.seed}") if config.seed is not None else random.Random()
            self.operator = Operator(
                config.bootstrap,
                self.group,
                self.topics,
                self.partitions,
                config.store_url,
                rng,
                max_partitions=2 * config.partitions,
                on_partitions=self._partitions_added,
            )
        self._next_act = config.operator_every
        # its own generator too, for the same reason
        self._startup_rng = random.Random(f"startup-{config.seed}") if config.seed is not None else random.Random()
        self._freeze_rng = random.Random(f"freeze-{config.seed}") if config.seed is not None else random.Random()

    # ---- members -------------------------------------------------------------------------------

    def _argv(self, member: _Member, faults: bool) -> tuple[list[str], str | None, str, str]:
        c = self.config
        mode = self.rng.choice(list(c.commit_modes))
        # drawn only when there is a choice: a single API leaves the seed's schedule as it was before --apis
        api = self.rng.choice(list(c.apis)) if len(c.apis) > 1 else c.apis[0]
        argv = [
            "--bootstrap",
            c.bootstrap if member.network is None else f"127.0.0.1:{member.network.port}",
            "--group",
            self.group,
            "--parallel",
            "--store-url",
            self._argv_store_url,
            "--min-offsets",
            str(c.min_offsets),
            "--commit",
            mode,
            "--commit-every",
            str(c.commit_every),
            "--session-ms",
            str(c.session_ms),
            "--batch",
            str(c.batch),
            "--work-us",
            str(c.work_us),
            "--api",
            api,
        ]
        for t in self.topics:
            argv += ["--topic", t]
        if c.static:
            argv += ["--group-instance-id", f"{self.group}-{member.name}"]
        stall = None
        if faults and c.stall_points and self.rng.random() < c.stall_share:
            stall = self.rng.choice(list(c.stall_points))
            low, high = _STALL_AFTER[stall]
            argv += ["--stall-at", stall, "--stall-after", str(self.rng.randint(low, high))]
        if faults and self.rng.random() < c.fail_child_share:
            argv += ["--fail-child-after", str(self.rng.randint(1, 5))]
        if c.replay_share and self._startup_rng.random() < c.replay_share:
            # half with the library's default (a chaos lag is rarely above it: a replay), half with a limit the
            # lags pass, so that the recovery replays while the store opens and then jumps late
            limit = REPLAY_LIMITS[self._startup_rng.randrange(len(REPLAY_LIMITS))]
            argv += ["--set", f"fastrecover.recovery.replay.max.offsets={limit}"]
        if c.group_protocol != "classic":
            argv += ["--set", f"group.protocol={c.group_protocol}"]  # the worker drops the classic-only keys
        argv += list(c.worker_args)
        return argv, stall, mode, api

    def spawn(self, member: _Member | int, *, faults: bool = True, extra: Sequence[str] = ()) -> WorkerProc:
        """Start a new incarnation of ``member`` (a member or its index)."""
        if isinstance(member, int):
            member = self.members[member]
        member.incarnations += 1
        name = f"{member.name}#{member.incarnations}"
        argv, stall, mode, api = self._argv(member, faults)
        if faults and self.faults_for is not None:
            argv += self.faults_for(self, name)
        argv += [*extra, "--member", name]
        proc = WorkerProc(name, argv, self.workdir, self._env, mode, module=self.config.worker_module, api=api)
        self.procs.append(proc)
        member.proc = proc
        member.restart_at = None
        member.stall = stall
        member.uptime = self.rng.uniform(*self.config.up_s)
        member.kill_at = None  # set once the consumer is up: uptime counts from its "started"
        member.stall_deadline = time.monotonic() + self.config.up_s[1] + 15 if stall else None
        member.thaw_at, member.froze = None, False
        log.info("started %s (commit=%s, %s%s)", name, mode, api, f", stall at {stall}" if stall else "")
        return proc

    def _kill(self, member: _Member, how: str) -> None:
        proc = member.proc
        assert proc is not None
        proc.kill(how)
        self.kills += 1
        member.proc = None
        log.info("cycle %d: %s %s", self.kills, how, proc.name)
        if self.on_kill is not None:
            self.on_kill(self, proc)
        member.restart_at = time.monotonic() + self.rng.uniform(*self.config.down_s)

    def _step(self) -> None:
        now = time.monotonic()
        for m in self.members:
            if m.net_thaw_at is not None:
                if now < m.net_thaw_at:
                    continue  # a member cut off from Kafka runs on; neither killed nor frozen meanwhile
                self._net_thaw(m, now)
            proc = m.proc
            if proc is None:
                if m.restart_at is not None and now >= m.restart_at and self.kills < self._target:
                    self.spawn(m)
                continue
            if not proc.alive:
                proc.kill(f"exited:{proc.proc.returncode}")
                self.notes.append(f"{proc.name} exited by itself with code {proc.proc.returncode}")
                m.proc = None
                m.restart_at = now
                continue
            if m.thaw_at is not None:
                if now >= m.thaw_at:
                    self._thaw(m, now)
                continue
            if m.stall is not None:
                if proc.has("stalled"):
                    self._kill(m, f"stalled:{m.stall}")
                elif m.stall_deadline is not None and now >= m.stall_deadline:
                    self.stalls_missed += 1
                    self._kill(m, "killed")
            elif m.kill_at is None:
                if proc.has("started"):
                    m.kill_at = now + m.uptime
            elif now >= m.kill_at:
                if not m.froze and self.config.freeze_share and self._freeze_rng.random() < self.config.freeze_share:
                    self._freeze(m, now)
                elif (
                    not m.froze
                    and self.config.net_freeze_share
                    and self._freeze_rng.random() < self.config.net_freeze_share
                ):
                    self._net_freeze(m, now)
                else:
                    self._kill(m, "killed")
            if self.kills >= self._target:
                return

    def freeze(self, index: int, seconds: float) -> WorkerProc:
        """SIGSTOP member ``index`` now for ``seconds`` (for tests that script the faults); the driver lets it go on."""
        m = self.members[index]
        if m.proc is None:
            raise RuntimeError(f"member {m.name} is not running")
        self._freeze(m, time.monotonic(), seconds)
        return m.proc

    def _freeze(self, member: _Member, now: float, took: float | None = None) -> None:
        proc = member.proc
        assert proc is not None
        if took is None:
            took = self._freeze_rng.uniform(*self.config.freeze_s)
        proc.freeze()
        self._stopped_ms[proc.name] = int(time.time() * 1000)
        member.froze, member.thaw_at = True, now + took
        member.kill_at = now  # when the freeze began: _thaw measures it from here
        log.info("frozen %s for %.1f s (session %d ms)", proc.name, took, self.config.session_ms)

    def _thaw(self, member: _Member, now: float) -> None:
        proc = member.proc
        assert proc is not None and member.thaw_at is not None
        proc.thaw()
        self.frozen.setdefault(proc.name, []).append((self._stopped_ms.pop(proc.name), int(time.time() * 1000)))
        self.freezes += 1
        # what the freeze was, measured (the driver's own steps may have made it longer than drawn)
        took = now - (member.kill_at or now)
        self.freezes_past_session += took * 1000 > self.config.session_ms
        member.thaw_at = None
        member.kill_at = now + self._freeze_rng.uniform(*self.config.up_s)
        log.info("thawed %s after %.1f s", proc.name, took)

    def net_freeze(self, index: int, seconds: float) -> None:
        """Cut member ``index`` off from Kafka now for ``seconds`` (for tests that script the faults)."""
        self._net_freeze(self.members[index], time.monotonic(), seconds)

    def _net_freeze(self, member: _Member, now: float, took: float | None = None) -> None:
        """Stop the bytes between the member and Kafka; the process runs on, and its store stays reachable.

        To the checker the incarnation is a zombie from this moment on (it is recorded as a freeze that
        let it go at once): it may hand out records it fetched before, from a range the group gave to
        another member meanwhile, exactly as a process let go after a SIGSTOP does; its writes must be
        fenced all the same.
        """
        if took is None:
            took = self._freeze_rng.uniform(*self.config.freeze_s)
        assert member.network is not None
        member.network.freeze()
        member.froze, member.net_thaw_at, member.net_frozen_since = True, now + took, now
        if member.proc is not None:
            at = int(time.time() * 1000)
            self.frozen.setdefault(member.proc.name, []).append((at, at))
        log.info("network of %s frozen for %.1f s (session %d ms)", member.name, took, self.config.session_ms)

    def _net_thaw(self, member: _Member, now: float) -> None:
        assert member.network is not None
        member.network.thaw()
        took = now - member.net_frozen_since
        self.net_freezes += 1
        self.net_freezes_past_session += took * 1000 > self.config.session_ms
        member.net_thaw_at = None
        member.kill_at = now + self._freeze_rng.uniform(*self.config.up_s)
        log.info("network of %s flowing again after %.1f s", member.name, took)

    # ---- the run -------------------------------------------------------------------------------

    def run(self, opening: Callable[[ChaosDriver], None] | None = None) -> ChaosResult:
        """The whole campaign: start, ``cycles`` kills, drain, verdict.

        ``opening`` is a scripted first act for a test that must make one event happen whatever the
        seed's schedule: it runs once the producer is up, spawns the members itself, and the random
        kills follow it.  Whatever fails, nothing the campaign started is left running.
        """
        try:
            self.start(spawn=opening is None)
            if opening is not None:
                opening(self)
            self.chaos(self.config.cycles)
        except BaseException:
            self.abort()
            raise
        return self.finish()

    def start(self, *, spawn: bool = True) -> None:
        """Create the topics, start the producer and (unless ``spawn`` is false) every member."""
        c = self.config
        self._began = time.monotonic()
        if c.topic_names is None:
            for t in self.topics:
                create_topic(c.bootstrap, t, c.partitions)
        log.info(
            "chaos: group %s, topics %s x %d partitions, %d members, %d cycles, store %s",
            self.group,
            self.topics,
            c.partitions,
            c.members,
            c.cycles,
            mask_url(c.store_url),
        )
        self.producer = SequencedProducer(c.bootstrap, self.topics, c.partitions, c.rate, self.produced_log)
        self.producer.start()
        if spawn:
            for m in self.members:
                self.spawn(m)

    def chaos(self, cycles: int) -> None:
        """Kill and restart members at random until ``cycles`` more kills happened."""
        target = self.kills + cycles
        self._target = target
        while self.kills < target:
            self._step()
            if self.operator is not None and self._next_act <= self.kills < target:
                self.operator_act()
                self._next_act = self.kills + self.config.operator_every
            time.sleep(_TICK_S)

    # ---- the operator --------------------------------------------------------------------------

    def operator_act(self, action: str | None = None) -> None:
        """One operator action (drawn from the configured ones unless given), the way an operator does it.

        Actions Kafka refuses for a live group (resets, deleting the group) and those an operator
        does with the application down (a topic re-created, the store restored) first stop every
        member, half the time with SIGKILL and half with SIGTERM, and wait until the group is
        empty; the members come back after the usual downtime.  The store is backed up at each
        stop, and ``restore-store`` goes back to the last backup.
        """
        op = self.operator
        if op is None:
            raise RuntimeError("no operator actions configured")
        action = action or op.rng.choice(list(self.config.operator_actions))
        if action in NEEDS_STOP:
            for m in self.members:
                if m.proc is not None:
                    if op.rng.random() < 0.5:
                        m.proc.kill("killed")
                    else:
                        m.proc.terminate(20)
                    m.proc = None
                m.restart_at = None
            wait = self.config.session_ms / 1000 + 30 if self.config.group_protocol == "classic" else 75.0
            try:
                wait_for(lambda: group_is_empty(self.config.bootstrap, self.group), wait, 0.2, "the group to empty")
            except TimeoutError as exc:
                self.notes.append(f"operator: {action} not done: {exc}")
                self._schedule_restarts()
                return
        try:
            if action in NEEDS_STOP and action != "restore-store":
                op.backup()
            if action == "recreate-topic" and self.producer is not None:
                self.producer.pause()
                try:
                    op.act(action)
                finally:
                    self.producer.resume()
            else:
                op.act(action)
        except (KafkaException, SQLAlchemyError, StoreError) as exc:
            # the campaign goes on (an action half done is still one an operator could have done); the note
            # is printed with the verdict
            self.notes.append(f"operator: {action} failed: {exc}")
            log.warning("operator: %s failed: %s", action, exc)
        self._schedule_restarts()

    def _schedule_restarts(self) -> None:
        now = time.monotonic()
        for m in self.members:
            if m.proc is None and m.restart_at is None:
                m.restart_at = now + self.rng.uniform(*self.config.down_s)

    def _partitions_added(self, topic: str, count: int) -> None:
        if self.producer is not None:
            self.producer.set_partitions(topic, count)

    def kill(self, index: int, how: str = "killed") -> WorkerProc:
        """SIGKILL member ``index`` now (for tests that script the faults); it is not restarted by itself."""
        m = self.members[index]
        proc = m.proc
        if proc is None:
            raise RuntimeError(f"member {m.name} is not running")
        self._kill(m, how)
        m.restart_at = None
        return proc

    def finish(self) -> ChaosResult:
        """Drain, stop everything and return the verdict."""
        chaos_end = time.monotonic()
        try:
            passes = self.drain()
        finally:
            self.abort()
        drain_end = time.monotonic()
        return self._result(self._began, chaos_end, drain_end, passes)

    def abort(self) -> None:
        """Kill whatever still runs (idempotent)."""
        for p in self.procs:
            if p.alive:
                p.kill("killed")
        if self.producer is not None and self.producer._thread.is_alive():
            self.producer.stop()

    def proc(self, index: int) -> WorkerProc | None:
        return self.members[index].proc

    def dump_stacks(self) -> str:
        """Every current incarnation's threads (if it still runs) and log tail: attach it to a failed wait."""
        return "\n".join(p.dump_stacks() for m in self.members if (p := m.proc) is not None)

    def finished_by(self, index: int, since_ms: int) -> int:
        """Ledger entries member ``index`` wrote with a finish time at or after ``since_ms``."""
        count = 0
        name = self.members[index].name
        for path in (self.workdir / "ledger").glob(f"{name}-*.ledger"):
            entries, _bad = read_ledgers([path])
            count += sum(1 for e in entries if e.done_ms >= since_ms)
        return count

    def stop_producer(self) -> None:
        if self.producer is not None:
            self.producer.stop()

    def drain(self) -> int:
        """Stop producing, then run every member without faults until everything is finished."""
        self.stop_producer()
        deadline = Deadline(self.config.drain_timeout_s)
        passes = 0
        while True:
            passes += 1
            for m in self.members:
                if m.proc is not None and m.stall is not None:
                    self._retire(m)  # a stalled incarnation makes no progress: replace it
                if m.proc is not None and m.thaw_at is not None:
                    self._thaw(m, time.monotonic())  # the drain runs without faults: a frozen one goes on
                if m.net_thaw_at is not None:
                    self._net_thaw(m, time.monotonic())
                if m.proc is None or not m.proc.alive:
                    self.spawn(m, faults=False)
            covered = self.wait_covered(deadline)
            # Every record may already be in the ledger (finished by an incarnation killed before its range
            # commit): the members still need the time to re-read and finish the open ranges.
            if covered:
                self.wait_ranges_finished(deadline)
            for m in self.members:
                if m.proc is not None:
                    m.proc.terminate()
                    m.proc = None
            open_ranges = self.open_ranges()
            if covered and not open_ranges:
                return passes
            if deadline.expired() or passes >= 5:
                self.notes.append(
                    f"drain ended after {passes} passes with {len(open_ranges)} open ranges"
                    f"{'' if covered else ' and records not finished'}"
                )
                return passes
            log.info("drain pass %d: %d ranges still open; running the members again", passes, len(open_ranges))

    def _retire(self, m: _Member) -> None:
        if m.proc is not None:
            m.proc.kill("killed")
            m.proc = None

    def open_ranges(self) -> list[Token]:
        try:
            with open_store(self.config.store_url) as store:
                return store.open_ranges(self.group, skip_corrupt=True)
        except StoreError as exc:
            self.notes.append(f"could not read the store: {exc}")
            return []

    def wait_covered(self, deadline: Deadline) -> bool:
        """Wait until every acknowledged record (that retention left) is in the ledger.

        With operator actions, as the verdict counts (:class:`OperatorLog`): records of a deleted
        topic generation or skipped by a reset forward are not waited for, and records a reset
        moved the group back over must be finished again after it.
        """
        ops = self._operator_log()
        tail = _Tail()
        acked: dict[Key, Produced] = {}
        last_done: dict[Key, int] = {}
        rereads: dict[Key, int] | None = None
        watermarks = PlainConsumer({"bootstrap.servers": self.config.bootstrap, "group.id": self.group + "-wm"})
        try:
            lows: dict[tuple[str, int], int] = {}
            next_lows = 0.0
            while True:
                for line in tail.new_lines([self.produced_log]):
                    p = parse_produced_line(line)
                    if p is not None:
                        acked[(ops.name(p.topic, p.produced_ms), p.partition, p.offset)] = p
                ledgers = sorted((self.workdir / "ledger").glob("*.ledger"))
                for line in tail.new_lines(ledgers):
                    e = parse_ledger_line(line)
                    if e is not None:
                        k = (ops.name(e.topic, e.produced_ms), e.partition, e.offset)
                        last_done[k] = max(last_done.get(k, -1), e.done_ms)
                missing = {
                    k
                    for k, p in acked.items()
                    if k not in last_done
                    and not ops.ended(p.topic, p.produced_ms)
                    and not ops.skipped(p.topic, p.partition, p.offset, p.produced_ms)
                }
                # the producer stopped before the drain: the obligations are known once, then only shrink
                if rereads is None:
                    rereads = not_reread(acked, last_done, ops, lows)
                else:
                    rereads = {k: at for k, at in rereads.items() if last_done.get(k, -1) < at}
                missing.update(rereads)
                if missing and time.monotonic() >= next_lows:
                    next_lows = time.monotonic() + 2.0
                    for name, part in {(k[0], k[1]) for k in missing}:
                        topic = name.split("~", 1)[0]  # "~" is not allowed in a topic's name
                        try:
                            low, _high = watermarks.get_watermark_offsets(TopicPartition(topic, part), timeout=10)
                        except KafkaException as exc:  # a slow broker (e.g. just restarted): ask on the next pass
                            log.info("drain: log start of %s[%d] unknown for now: %s", topic, part, exc)
                            continue
                        lows[(name, part)] = low
                missing = {k for k in missing if k[2] >= lows.get((k[0], k[1]), 0)}
                if not missing:
                    return True
                if deadline.expired():
                    log.error("drain: %d records still not finished, e.g. %s", len(missing), sorted(missing)[:5])
                    return False
                self._respawn_exited()
                time.sleep(0.25)
        finally:
            watermarks.close()

    def wait_ranges_finished(self, deadline: Deadline) -> None:
        """Keep the members running until the store has no open range, or the deadline."""
        while True:
            if not self.open_ranges() or deadline.expired():
                return
            self._respawn_exited()
            time.sleep(0.5)

    def _respawn_exited(self) -> None:
        for m in self.members:
            if m.proc is not None and not m.proc.alive:
                self.notes.append(f"{m.proc.name} exited during the drain ({m.proc.proc.returncode})")
                m.proc.kill(f"exited:{m.proc.proc.returncode}")
                self.spawn(m, faults=False)

    # ---- the verdict ---------------------------------------------------------------------------

    def _operator_log(self) -> OperatorLog:
        return OperatorLog(self.operator.effects if self.operator is not None else ())

    def _ownership(self, tokens: Sequence[Token]) -> tuple[dict[str, str], dict[str, set[tuple[str, int]]]]:
        """Token owner id -> incarnation (owner ids are ``host:pid:suffix``), incarnation -> partitions."""
        by_pid = {int(e["pid"]): p.name for p in self.procs if (e := p.has("started")) is not None}
        owners: dict[str, str] = {}
        for t in tokens:
            if t.owner is None:
                continue
            parts = t.owner.rsplit(":", 2)
            if len(parts) == 3 and parts[1].isdigit() and int(parts[1]) in by_pid:
                owners[t.owner] = by_pid[int(parts[1])]
        assigned: dict[str, set[tuple[str, int]]] = {}
        for p in self.procs:
            got = assigned.setdefault(p.name, set())
            for e in p.count("assigned"):
                got.update((str(tp[0]), int(tp[1])) for tp in e.get("partitions", []))
        return owners, assigned

    def _result(self, began: float, chaos_end: float, drain_end: float, passes: int) -> ChaosResult:
        c = self.config
        produced = read_produced(self.produced_log)
        ledger, bad = read_ledgers(sorted((self.workdir / "ledger").glob("*.ledger")))
        try:
            with open_store(c.store_url) as store:
                tokens = [t for t in store.ranges(self.group, skip_corrupt=True)]
        except StoreError as exc:
            tokens = []
            self.notes.append(f"could not read the store for the verdict: {exc}")
        lows, present = read_topic(c.bootstrap, self.topics, self.partitions)
        incs = [p.incarnation() for p in self.procs]
        owners, assigned = self._ownership(tokens)
        verdict = analyze(
            produced,
            ledger,
            incarnations=incs,
            tokens=tokens,
            low_watermarks=lows,
            present=present,
            malformed_lines=bad,
            owners=owners,
            assigned=assigned,
            operator=self._operator_log(),
            frozen=self.frozen,
        )
        result = ChaosResult(
            verdict,
            c,
            self.group,
            self.topics,
            time.monotonic() - began,
            chaos_end - began,
            drain_end - chaos_end,
            passes,
            incs,
            stalls_missed=self.stalls_missed,
            freezes=self.freezes,
            freezes_past_session=self.freezes_past_session,
            net_freezes=self.net_freezes,
            net_freezes_past_session=self.net_freezes_past_session,
            notes=list(self.notes),
            operator=list(self.operator.done) if self.operator is not None else [],
            operator_effects=list(self.operator.effects) if self.operator is not None else [],
        )
        for p in self.procs:
            result.commit_modes[p.commit_mode] += 1
            result.apis[p.api] += 1
            for e in p.count("stalled"):
                result.stalls[str(e.get("point"))] += 1
            result.child_failures += len(p.count("child-failure-injected"))
            result.fatal_exits += len(p.count("fatal"))
            for e in p.count("commit-failed"):
                result.commit_failures[str(e.get("error", "")).split(":", 1)[0]] += 1
            recs = p.count("recovery")
            result.recoveries += sum(1 for r in recs if r.get("new_ranges") or r.get("resumed"))
            result.degraded_recoveries += sum(1 for r in recs if r.get("degraded"))
        if self.producer is not None:
            result.produced_failed = self.producer.failed
        return result
