"""Crash runs: a real SIGKILL of a consumer process and its restart, timed from the crash.

The timeline a user feels after a crash is *crash → first fresh record*: the
downtime (how long the crashed process takes to come back), the process start,
the group join (which, for a member that was not static, waits for the dead
member's session to expire) and the recovery.  One run:

1. a new topic (``PARTITIONS`` partitions) and group, its offsets committed at
   the log start; with ``group.protocol=consumer`` the group's session and
   heartbeat are set as group configs (Kafka's defaults unless told otherwise);
2. the first consumer process (``python -m fastrecover_tools.bench.worker``,
   the same mode and settings as the restarted one) joins and reads live
   records; told ``hold``, it stops reading and commits what it delivered;
3. ``lag`` records are produced as fast as the broker takes them, then the
   first process is SIGKILLed: the **crash** (its committed offsets are the
   checkpoint, the lag is everything after them);
4. ``down_s`` later a new process is spawned (**spawn**) and a producer starts
   writing live records; a record at or past the log end of the moment before
   the spawn was produced after the restart began: the first one delivered is
   the **first fresh record**;
5. a process that exits on a fatal consumer error (with
   ``group.protocol=consumer``, a static member restarted while the broker still
   holds its instance ID: UNRELEASED_INSTANCE_ID) is restarted after
   ``RESPAWN_DELAY_S``, as a supervisor would; every fatal error is recorded.

Every wait has a deadline; a run that misses one is recorded with its error and
whatever it saw (fatal errors, restarts), never left hanging.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition

from fastrecover.store import upgrade
from fastrecover_tools.bench.scenarios import (
    LIVE_RATE,
    PARTITIONS,
    VALUE_SIZE,
    _store_url_in_environment,
    _tail,
    _wait_event,
    commit_offsets,
    log_ends,
    produce_fast,
)
from fastrecover_tools.quickstart import QUICKSTART
from fastrecover_tools.testing.broker import create_topic, delete_topic
from fastrecover_tools.testing.driver import EventProcess, SteadyProducer
from fastrecover_tools.testing.waiting import Deadline, wait_for

_WORKER = "fastrecover_tools.bench.worker"

#: Seconds between a fatal exit and the next process, like a supervisor's restart delay.
RESPAWN_DELAY_S = 1.0
#: Budget of the first process: start, join a new group, deliver a live record.
FIRST_TIMEOUT_S = 60.0
#: Kafka's defaults for KIP-848 groups (broker settings group.consumer.session.timeout.ms and
#: group.consumer.heartbeat.interval.ms); the bench sets them on its groups unless told otherwise.
KIP848_SESSION_MS = 45_000
KIP848_HEARTBEAT_MS = 5_000


@dataclass(frozen=True)
class Setup:
    """Consumer settings of one crash cell (on top of the bench's own)."""

    name: str
    label: str
    config: tuple[tuple[str, str], ...]
    static: bool  # group.instance.id set (one per run, the same for the crashed and the restarted process)

    @property
    def kip848(self) -> bool:
        return dict(self.config).get("group.protocol") == "consumer"


SETUPS: dict[str, Setup] = {
    s.name: s
    for s in (
        Setup("default", "no group.instance.id, librdkafka's defaults (session.timeout.ms 45 s)", (), False),
        Setup(
            "static",
            "group.instance.id, session.timeout.ms 10 s, reconnect.backoff.ms 20 (the README quickstart's)",
            tuple(QUICKSTART.items()),
            True,
        ),
        Setup("kip848", "group.protocol=consumer, no group.instance.id", (("group.protocol", "consumer"),), False),
        Setup(
            "kip848-static", "group.protocol=consumer with group.instance.id", (("group.protocol", "consumer"),), True
        ),
    )
}


def setup_config(setup: str, instance_id: str) -> dict[str, str]:
    """The consumer properties of ``setup`` (KeyError for an unknown one)."""
    s = SETUPS[setup]
    config = dict(s.config)
    if s.static:
        config["group.instance.id"] = instance_id
    return config


@dataclass(frozen=True)
class CrashSpec:
    bootstrap: str
    setup: str  # a key of SETUPS
    lag: int
    mode: str  # "plain" or "fastrecover"
    store_url: str
    down_s: float = 3.0
    timeout_s: float = 120.0  # from the crash to the first fresh record, restarts after fatal errors included
    partitions: int = PARTITIONS
    live_rate: int = LIVE_RATE
    kip848_session_ms: int = KIP848_SESSION_MS  # 0: the broker's setting
    kip848_heartbeat_ms: int = KIP848_HEARTBEAT_MS  # 0: the broker's setting


def group_settings(bootstrap: str, group: str, session_ms: int, heartbeat_ms: int) -> dict[str, str]:
    """Set a KIP-848 group's session and heartbeat (0: leave the broker's); returns the values in force."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    keys = {"consumer.session.timeout.ms": session_ms, "consumer.heartbeat.interval.ms": heartbeat_ms}
    op = AlterConfigOpType.SET
    entries = [ConfigEntry(key, str(value), incremental_operation=op) for key, value in keys.items() if value]
    if entries:
        resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(15)
    described = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)])
    values: dict[str, str] = {}
    for future in described.values():
        values = {name: str(entry.value) for name, entry in future.result(15).items() if name in keys}
    return values


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets (-1001 where none), read without joining the group."""
    consumer = RawConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=15)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


def _outcome(proc: EventProcess) -> str | None:
    """What the restarted process came to: "fresh", "fatal", "exited", or None (not yet)."""
    if proc.event("fresh") is not None:
        return "fresh"
    if proc.event("fatal") is not None:
        return "fatal"
    return None if proc.alive() else "exited"


def crash_run(spec: CrashSpec, log_file: TextIO) -> dict[str, Any]:
    """One crash and restart; times in seconds from the crash (SIGKILL) or from the spawn of a process."""
    tag = uuid.uuid4().hex[:6]
    topic, group = f"bench-crash-{spec.setup}-{spec.mode}-{spec.lag}-{tag}", f"bench-crash-{spec.mode}-{tag}"
    extra = setup_config(spec.setup, f"bench-member-{tag}")
    create_topic(spec.bootstrap, topic, spec.partitions)
    result: dict[str, Any] = {"setup": spec.setup, "lag_asked": spec.lag}
    try:
        commit_offsets(spec.bootstrap, group, topic, dict.fromkeys(range(spec.partitions), 0))
        if SETUPS[spec.setup].kip848:
            result["group_config"] = group_settings(
                spec.bootstrap, group, spec.kip848_session_ms, spec.kip848_heartbeat_ms
            )
        if spec.mode == "fastrecover" and spec.store_url:
            upgrade(spec.store_url)  # the crashed process had created the store's schema
        base = ["--bootstrap", spec.bootstrap, "--topic", topic, "--group", group, "--mode", spec.mode]
        base += ["--pattern", "auto", *(f"--set={k}={v}" for k, v in extra.items())]

        def spawn(lag_end: dict[int, int]) -> EventProcess:
            args = [*base, "--lag-end", ",".join(f"{p}:{o}" for p, o in lag_end.items())]
            with _store_url_in_environment(spec.store_url if spec.mode == "fastrecover" else None):
                return EventProcess(_WORKER, args, log_file, stdin=True)

        # -- the consumer that crashes: it joins, reads live records, holds, the lag builds, SIGKILL
        first = spawn(dict.fromkeys(range(spec.partitions), 0))
        try:
            with SteadyProducer(
                spec.bootstrap, topic, spec.live_rate, value_size=VALUE_SIZE, partitions=spec.partitions
            ):
                _wait_event(first, "fresh", FIRST_TIMEOUT_S, log_file)
            first.tell("hold")
            _wait_event(first, "held", 30, log_file)
            result["produce_records_per_s"] = round(produce_fast(spec.bootstrap, topic, spec.lag, spec.partitions))
            lag_end = log_ends(spec.bootstrap, topic, spec.partitions)
            committed = committed_offsets(spec.bootstrap, group, topic, spec.partitions)
        except BaseException:
            first.kill(signal.SIGKILL)
            raise
        result["lag"] = sum(end - max(0, committed.get(p, 0)) for p, end in lag_end.items())
        crash = time.time()
        first.kill(signal.SIGKILL)
        result["kill_s"] = time.time() - crash
        down = Deadline(spec.down_s)
        wait_for(down.expired, spec.down_s + 5, 0.005, f"the downtime of {spec.down_s:g} s")
        result.update(_restart(spec, lambda: spawn(lag_end), topic, crash, log_file))
        return result
    finally:
        try:
            delete_topic(spec.bootstrap, topic)
        except Exception as exc:  # a leftover topic must not lose the measurements
            log_file.write(f"bench crash: could not delete {topic}: {exc}\n")


def timeline(events: list[dict[str, Any]], crash: float, spawned: float, down_s: float) -> dict[str, float | None]:
    """The figures of a run from the delivering process's events (wall-clock ``t``); None where one is missing."""
    t: dict[str, float] = {}
    for e in events:
        t.setdefault(str(e.get("event")), float(e["t"]))

    def span(start: float | str, end: str) -> float | None:
        a = t.get(start) if isinstance(start, str) else start
        b = t.get(end)
        return None if a is None or b is None else b - a

    fresh_cpu = next((e.get("cpu") for e in events if e.get("event") == "fresh"), None)
    return {
        "crash_to_fresh_s": span(crash, "fresh"),
        # the process's CPU (all threads) from its start to the first fresh record: the work on the way,
        # without the wall clock's waits and a 2-core machine's scheduling noise
        "spawn_to_fresh_cpu_s": None if fresh_cpu is None else float(fresh_cpu),
        "spawn_to_fresh_s": span(spawned, "fresh"),
        "first_spawn_to_fresh_s": span(crash + down_s, "fresh"),
        "ready_s": span(spawned, "ready"),
        "client_s": span("ready", "fresh"),
        "imported_s": span(spawned, "imported"),
        "started_s": span(spawned, "started"),
        "join_s": span(spawned, "joined"),
        "crash_to_joined_s": span(crash, "joined"),
        "recovery_s": span("joined", "assigned"),
        "joined_to_fresh_s": span("joined", "fresh"),
    }


def _restart(
    spec: CrashSpec, spawn: Callable[[], EventProcess], topic: str, crash: float, log_file: TextIO
) -> dict[str, Any]:
    """Spawn the restarted process (again after each fatal exit) until it delivers a fresh record.

    Past the deadline the run is recorded as failed, with what it saw.
    """
    deadline = Deadline(spec.timeout_s)
    fatal: list[float] = []  # seconds from the crash to each fatal error
    out: dict[str, Any] = {"fatal_after_s": fatal}
    live = SteadyProducer(spec.bootstrap, topic, spec.live_rate, value_size=VALUE_SIZE, partitions=spec.partitions)
    proc: EventProcess | None = None
    producing = False
    try:
        while True:
            spawned = time.time()
            if proc is None:
                out["down_s"] = spawned - crash
            proc = spawn()
            if not producing:
                live.start()  # from the first spawn on: every record from here is fresh
                producing = True
            out["incarnations"] = len(fatal) + 1
            try:
                outcome = wait_for(
                    functools.partial(_outcome, proc),
                    deadline.remaining(),
                    0.005,
                    "the restarted consumer's first fresh record (or its fatal error)",
                )
            except TimeoutError as exc:
                out["error"] = f"TimeoutError: {exc}" + (f" ({len(fatal)} fatal exits before)" if fatal else "")
                return out
            if outcome == "fresh":
                break
            if outcome == "exited":
                raise RuntimeError(
                    f"bench worker exited (code {proc.proc.returncode}) before a fresh record; its stderr ends:\n"
                    + _tail(log_file)
                )
            event = proc.event("fatal") or {}
            fatal.append(round(float(event.get("t", time.time())) - crash, 3))
            out.setdefault("fatal_error", str(event.get("error")))
            # the process exits on its own (its close() returns); then a supervisor starts the next one
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.proc.wait(min(10.0, deadline.remaining()))
            proc.kill(signal.SIGKILL)
            if deadline.remaining() <= RESPAWN_DELAY_S:
                out["error"] = f"no fresh record within {spec.timeout_s:g} s of the crash ({len(fatal)} fatal exits)"
                return out
            pause = Deadline(RESPAWN_DELAY_S)
            wait_for(pause.expired, RESPAWN_DELAY_S + 5, 0.01, "the supervisor's restart delay")
        out.update(timeline(proc.events, crash, spawned, out["down_s"]))
        return out
    finally:
        if producing:
            live.stop()
        if proc is not None:
            proc.kill(signal.SIGKILL)
