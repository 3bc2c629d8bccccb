"""Crashes in the mirror window: a recovery jumped on Kafka's marker while the store was still opening.

With ``fastrecover.recovery.jump.on.mirror`` (off by default), a recovery whose lag exceeds
``fastrecover.recovery.replay.max.offsets`` while the (deferred) store opens commits its ranges into
Kafka's commit metadata (the ``fr2:`` marker), moves the primary to the log end and lets the child read
the ranges early; the store gets the tokens later (``Recoverer.recover_pending``).
Until then the marker is the ranges' ONLY durable record.  Real worker processes (the test worker, its
store open held shut by tests/faults/mirror_worker.py) are SIGKILLed in that window on the real broker,
with a real SQLite store, and every record owed must still reach a successor:

* control: nothing else happens, the successor restores the ranges from the marker;
* the application commits its own metadata in the window (fastrecover's marker must stay);
* a second recovery reads the marker (it must write the store's tokens before its primary delivers a
  fresh record), is SIGKILLed, and an operator resets the offsets the way kafka-consumer-groups does;
* the same crash and reset after a first recovery with the default settings, which opens no window.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from fastrecover.book import mirror_context
from fastrecover.codec import read_marker
from fastrecover.store import open_store
from fastrecover.tokens import TopicPartitionKey
from fastrecover_tools.testing.broker import group_is_empty, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import SESSION_MS, group_offsets
from tests.integration.procs import WorkerProcess

pytestmark = pytest.mark.faults

COMMITTED = 100  # C: the group's offset when the first incarnation starts
LOG_END = 400  # E: the log end its recovery sees
FRESH = 10  # records produced after a jump: the primary's first fresh records
REPLAY_MAX = 100  # fastrecover.recovery.replay.max.offsets: every lag here is above it
LAG2 = 150  # records produced while nobody reads, before the second recovery (above REPLAY_MAX)
SHIFT = 5  # the operator's kafka-consumer-groups --reset-offsets --shift-by -SHIFT
APP_METADATA = "app-x"
DEADLINE = 60.0
#: the opt-in that opens the window (off by default: a first recovery waits for the store)
JUMP_ON_MIRROR = ("--set", "fastrecover.recovery.jump.on.mirror=true")
#: the first incarnation's pace: small batches of 10 ms records, so that its child has read only part of
#: the jumped range when the fresh records (the primary's half of each batch) reach the crash point
SLOW = ("--batch", "10", "--work-us", "10000")


def _span(ranges: Iterable[tuple[int, int]]) -> set[int]:
    return {o for start, end in ranges for o in range(start, end)}


def _runs(offsets: set[int]) -> str:
    """``offsets`` as half-open runs, ``[115, 400) [405, 410)``: a missing range reads at a glance."""
    runs: list[list[int]] = []
    for o in sorted(offsets):
        if runs and runs[-1][1] == o:
            runs[-1][1] = o + 1
        else:
            runs.append([o, o + 1])
    return " ".join(f"[{a}, {b})" for a, b in runs) or "none"


def _names(proc: WorkerProcess) -> list[str]:
    """The events the worker reported so far, in order (what it printed is pulled in first)."""
    with contextlib.suppress(TimeoutError):
        proc.wait_event("(drain)", 0.05)
    return [e["event"] for e in proc.events]


@dataclass
class Scene:
    """One partition, one group, one SQLite store, and the incarnations of a worker that crashes."""

    bootstrap: str
    topic: str
    group: str
    store_url: str
    workdir: Path
    procs: list[WorkerProcess] = field(default_factory=list)

    def spawn(
        self, *extra: str, hold: Path | None = None, async_app: bool = False, pause_at_fresh: Path | None = None
    ) -> WorkerProcess:
        """A new incarnation; ``hold``, ``pause_at_fresh``: its store's open, its first fresh record wait
        until that path exists (tests/faults/mirror_worker.py)."""
        n = len(self.procs) + 1
        ledger = self.workdir / f"inc{n}.ledger"
        ledger.touch()
        ours = ["--hold-store-open", str(hold)] if hold is not None else []
        ours += ["--async-app-commits"] if async_app else []
        ours += ["--pause-at-fresh", str(pause_at_fresh)] if pause_at_fresh is not None else []
        args = [
            *ours,
            "--",
            *("--bootstrap", self.bootstrap, "--topic", self.topic, "--group", self.group, "--parallel"),
            *("--store-url", self.store_url, "--min-offsets", "10", "--ledger", str(ledger)),
            *("--session-ms", str(SESSION_MS), "--set", f"fastrecover.recovery.replay.max.offsets={REPLAY_MAX}"),
            *("--set", "fastrecover.store.lock.timeout.ms=200", "--set", "fastrecover.store.statement.timeout.ms=200"),
            *extra,
        ]
        proc = WorkerProcess(args, self.workdir / f"inc{n}.log", module="tests.faults.mirror_worker")
        self.procs.append(proc)
        return proc

    def kill(self, proc: WorkerProcess) -> None:
        proc.sigkill()
        wait_for(lambda: group_is_empty(self.bootstrap, self.group), 30, 0.2, "the killed member to leave the group")

    def delivered(self) -> set[int]:
        """Every offset any incarnation finished (the ledgers; a line is written before its commit)."""
        out: set[int] = set()
        for ledger in self.workdir.glob("inc*.ledger"):
            out |= {int(line.split()[2]) for line in ledger.read_text().splitlines(keepends=True) if line[-1] == "\n"}
        return out

    def committed(self) -> TopicPartition:
        (tp,) = group_offsets(self.bootstrap, self.group, self.topic)
        return tp

    def marker(self) -> tuple[int, set[int]]:
        """Kafka's committed offset and the offsets its marker's ranges still owe (from their progress)."""
        tp = self.committed()
        marker = read_marker(tp.metadata, context=mirror_context(self.group, TopicPartitionKey(self.topic, 0)))
        assert marker is not None, f"no fastrecover marker in Kafka's metadata {tp.metadata!r} at {tp.offset}"
        return tp.offset, _span((r.committed, r.end) for r in marker.ranges)

    def open_tokens(self) -> set[int]:
        """The offsets the store's open ranges still owe (from their committed progress to their end)."""
        with open_store(self.store_url) as store:
            tokens = store.ranges(self.group)
        return _span((t.progress.committed, t.span.end) for t in tokens if t.is_open and t.partition == 0)

    def undelivered(self, owed: set[int], who: str) -> set[int]:
        """Wait (bounded) for every offset of ``owed`` in some ledger; what is still missing then."""
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: owed <= self.delivered(), DEADLINE, 0.2, f"{who} to deliver every owed record")
        return owed - self.delivered()

    def kafka(self) -> str:
        tp = self.committed()
        return f"Kafka's committed offset {tp.offset} {tp.metadata!r}"


@pytest.fixture
def scene(bootstrap: str, topic_factory: Any, unique_group: str, tmp_path: Path) -> Iterator[Scene]:
    """Records [0, E) on partition 0, the group's offset at C (a plain commit): a lag of E - C to recover."""
    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(LOG_END)], partition=0)
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": unique_group})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, COMMITTED)], asynchronous=False)
    finally:
        plain.close()
    made = Scene(bootstrap, topic, unique_group, f"sqlite:///{tmp_path / 'ranges.db'}", tmp_path)
    yield made
    for proc in made.procs:
        proc.terminate()


def _commit_fresh_and_crash(scene: Scene, proc: WorkerProcess, fresh_end: int) -> None:
    """The worker finished [.., ``fresh_end``) and committed ``fresh_end``; SIGKILL once the broker has it."""
    proc.wait_event("blocked", DEADLINE)
    wait_for(lambda: scene.committed().offset == fresh_end, DEADLINE, 0.1, "the primary's commit on the broker")
    scene.kill(proc)


def _crash_in_the_window(scene: Scene, metadata: str | None = None, async_app: bool = False) -> set[int]:
    """Incarnation 1 jumps on the mirror (its store never opens), delivers FRESH records, commits E + FRESH
    (with ``metadata`` when given) and is SIGKILLed; returns what no incarnation delivered."""
    fresh_end = LOG_END + FRESH
    app = ["--commit-metadata", metadata] if metadata is not None else []
    never = scene.workdir / "never-created"  # the store stays "opening" until the SIGKILL
    first = scene.spawn(*_commit_at(fresh_end), *app, *JUMP_ON_MIRROR, hold=never, async_app=async_app)
    report = first.wait_event("recovery", DEADLINE)
    # the precondition: it jumped to E on Kafka's marker alone, the store still opening
    assert (report["committed"], report["log_end"], report["primary_start"]) == (COMMITTED, LOG_END, LOG_END)
    assert _span(report["new_ranges"]) == set(range(COMMITTED, LOG_END))
    assert "mirror-jump" in _names(first), "the recovery committed its ranges' marker before jumping"
    assert scene.marker() == (COMMITTED, set(range(COMMITTED, LOG_END)))
    produce(scene.bootstrap, scene.topic, [f"f{i}" for i in range(FRESH)], partition=0)
    _commit_fresh_and_crash(scene, first, fresh_end)
    assert scene.open_tokens() == set(), "the store never opened: only Kafka's commit metadata knew the range"
    owed = set(range(COMMITTED, fresh_end)) - scene.delivered()
    assert owed & set(range(COMMITTED, LOG_END)), "the crash must leave records of the jumped range owed"
    return owed


def _commit_at(fresh_end: int) -> tuple[str, ...]:
    """Slowly, no commit but ``fresh_end``'s (synchronous), once the record before it is finished; then block."""
    return ("--commit", "none", "--commit-at", str(fresh_end), "--block-at", str(fresh_end), *SLOW)


def test_control_crash_in_the_mirror_window_successor_delivers_every_owed_record(scene: Scene) -> None:
    """The baseline: a plain SIGKILL in the window; the successor restores the ranges from the marker."""
    owed = _crash_in_the_window(scene)
    scene.spawn("--commit", "sync")
    missing = scene.undelivered(owed, "the successor")
    assert missing == set(), f"never delivered: {_runs(missing)}; {scene.kafka()}"


@pytest.mark.parametrize("async_app", [False, True], ids=["sync", "async"])
def test_app_metadata_commit_in_the_mirror_window_keeps_the_marker(scene: Scene, async_app: bool) -> None:
    """The application's own commit metadata inside the window must not erase the ranges' only record."""
    owed = _crash_in_the_window(scene, APP_METADATA, async_app)
    scene.spawn("--commit", "sync")
    missing = scene.undelivered(owed, "the successor")
    assert missing == set(), f"never delivered: {_runs(missing)}; {scene.kafka()}"


@pytest.mark.parametrize("reset", ["to-current", "shift-by"])
def test_second_recovery_stores_the_ranges_before_fresh_records_and_survives_an_operator_reset(
    scene: Scene, reset: str
) -> None:
    """A recovery that reads a marker of unfinished ranges waits for the store (no second jump on the
    mirror): once it is SIGKILLed, an operator's reset erases the marker and only the store knows the ranges."""
    _crash_in_the_window(scene)
    produce(scene.bootstrap, scene.topic, [f"l{i}" for i in range(LAG2)], partition=0)
    offset, mirrored = scene.marker()
    assert offset == LOG_END + FRESH
    assert set(range(COMMITTED, LOG_END)) - scene.delivered() <= mirrored, "the marker mirrors what is owed"
    _recover_crash_and_reset(scene, reset, LOG_END + FRESH, LOG_END + FRESH + LAG2)


@pytest.mark.parametrize("reset", ["to-current", "shift-by"])
def test_first_recovery_by_default_stores_the_ranges_before_fresh_records_and_survives_an_operator_reset(
    scene: Scene, reset: str
) -> None:
    """Without the opt-in a first recovery whose lag is above the replay limit replays while the store opens
    and jumps once its tokens are there: a SIGKILL right after its first fresh record, then an operator's
    reset, loses nothing."""
    _recover_crash_and_reset(scene, reset, COMMITTED, LOG_END)


def _recover_crash_and_reset(scene: Scene, reset: str, committed: int, log_end: int) -> None:
    """A new incarnation (default settings) recovers [committed, log_end), its store's open held until it
    began, is paused at its first fresh record (the store read then), commits past it, is SIGKILLed; an
    operator resets the offsets the way kafka-consumer-groups does; a successor must deliver every record."""
    release, resume = scene.workdir / "release-store", scene.workdir / "resume"
    fresh_after = ("--first-fresh-after", str(time.time()))  # every record produced from now on is fresh
    proc = scene.spawn(*_commit_at(log_end + FRESH), *fresh_after, hold=release, pause_at_fresh=resume)
    produced = False

    def first_fresh_delivered() -> bool:
        nonlocal produced
        names = _names(proc)
        if "store-open" in names:
            release.touch()
        if "recovery" in names and not produced:
            produce(scene.bootstrap, scene.topic, [f"g{i}" for i in range(FRESH)], partition=0)
            produced = True
        return "fresh" in names

    wait_for(first_fresh_delivered, DEADLINE, 0.01, "the incarnation's first fresh record")
    reports = [e for e in proc.events if e["event"] == "recovery"]
    assert (reports[0]["committed"], reports[0]["log_end"]) == (committed, log_end), "it recovered the lag"
    # at once (the recovery waited for the store), or from where its replay got to once the store opened
    assert any(r["primary_start"] == log_end for r in reports), f"it skipped part of the lag: {reports}"
    # paused right after it finished its first fresh record: the store as it was then
    unstored = set(range(COMMITTED, log_end)) - scene.delivered() - scene.open_tokens()
    jumped = "mirror-jump" in _names(proc)
    resume.touch()
    _commit_fresh_and_crash(scene, proc, log_end + FRESH)
    assert set(range(COMMITTED, log_end)) - scene.delivered(), "the crash must leave records of the ranges owed"

    target = log_end + FRESH - (SHIFT if reset == "shift-by" else 0)
    admin = AdminClient({"bootstrap.servers": scene.bootstrap})
    request = [ConsumerGroupTopicPartitions(scene.group, [TopicPartition(scene.topic, 0, target)])]
    for future in admin.alter_consumer_group_offsets(request).values():
        future.result(timeout=30)
    tp = scene.committed()
    assert (tp.offset, tp.metadata or "") == (target, ""), "the reset left no marker"

    owed = set(range(COMMITTED, log_end + FRESH)) - scene.delivered()
    scene.spawn("--commit", "sync")
    missing = scene.undelivered(owed, "the successor")
    assert missing == set(), f"never delivered after --reset-offsets {reset}: {_runs(missing)}; {scene.kafka()}"
    assert unstored == set(), (
        f"owed when the incarnation delivered its first fresh record, in no open range of the store:"
        f" {_runs(unstored)} (it jumped on the mirror: {jumped})"
    )
    assert not jumped, "no range may live in Kafka's commit metadata alone without the opt-in"
