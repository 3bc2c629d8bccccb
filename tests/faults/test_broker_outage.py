"""Fault 4: the broker is stopped and restarted while two consumers run.

Dynamic members must ride the outage out: nobody dies, nobody is restarted.

Static members (classic ``group.instance.id``) can fence *themselves* while the
coordinator is away: a JoinGroup the client gave up on still reaches the
restarted coordinator, the retry takes the instance id under a new member id,
and the older attempt comes back FENCED_INSTANCE_ID, which librdkafka raises as
a fatal error (confluent-kafka-go#494 shows it with a plain client; KAFKA-20985
is the same race in the Java client). fastrecover sends no group request of its
own (the child is assign-only in another group), so it cannot prevent this; it
must lose nothing when it happens and the application restarts the consumer,
which is what the static variant checks.

A member may also never come back while its thread waits, forever, inside
confluent_kafka's own synchronous ``commit()`` (the C call; fastrecover had
handed the commit straight to the plain client). Its coordinator connection
logs ``Timed out 0 in-flight, 0 retry-queued, 1 out-queue`` every
socket.timeout.ms and nothing else. The same wait was seen with fastrecover
off (docs/reliability.md, session 5; confluent-kafka-python#1801), and in 1 of
40 runs of this scenario with plain members (session 19), where librdkafka's
coordinator query found no usable broker for the whole wait. librdkafka's
commit has no timeout and a drop-in cannot add one, so the test does what a
liveness probe does: after the broker has been back for ``HUNG_S`` it
restarts a member whose main thread is in that call. It does the same for a
member that librdkafka never put back in the group after revoking its lost
assignment during the outage (``_never_rejoined``, seen once in CI). Any other
stuck member still fails the test, and every restart must be explained.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastrecover_tools.chaos.driver import ChaosDriver, WorkerProc
from fastrecover_tools.testing.broker import LocalJarBroker
from fastrecover_tools.testing.waiting import wait_for
from tests.faults.conftest import DriverFactory, verdict_ok, wait_or_report

pytestmark = pytest.mark.faults
log = logging.getLogger("fastrecover.tests.faults")

#: (group protocol, static members): the classic protocol is run both ways; KIP-848 dynamic only,
#: since its static members are exercised by the kill loops.
MEMBERSHIPS = [("classic", False), ("classic", True), ("consumer", False)]

#: How long after the broker is back a member may show no progress before its stacks are looked at.
HUNG_S = 30.0


@pytest.fixture
def private_broker() -> Iterator[LocalJarBroker]:
    """A broker of our own: stopping the session's broker would hit every other test (or be impossible)."""
    broker = LocalJarBroker()
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


def _restart_fenced(driver: ChaosDriver) -> None:
    """What a supervised application does after a fatal consumer error: start a new consumer."""
    for i in (0, 1):
        proc = driver.proc(i)
        if proc is not None and not proc.alive and proc.has("fatal"):
            driver.spawn(i, faults=False)


def _in_plain_commit(stacks: str) -> bool:
    """In the newest faulthandler dump, the main thread waits in confluent_kafka's C ``commit``.

    faulthandler shows Python frames only: the C call is the line of the main thread's innermost
    frame, which must be a call of the plain client's ``commit`` (``_K.commit(``) in a fastrecover
    module, or the worker's own call of a one-record commit that the extension sends on in C:
    ``Consumer.commit`` hands a partition without ranges straight to it, and an offset-less
    synchronous ``commit()`` makes the same call from ``fastrecover/commits.py`` (seen in CI on
    2026-11-23: ``kafka`` in ``commit_both``, the coordinator logging "1 out-queue" every 61 s).
    """
    frames = _main_frames(stacks)
    if not frames:
        return False
    path, line, func = frames[0]
    if path.endswith("/fastrecover_tools/testing/worker.py") and func == "_commit":
        # A one-record commit runs in C when the extension is built (``FastOffsets``): no frame of
        # ``Consumer.commit`` at all, so the innermost is the worker's call of its commit partial (seen in
        # CI on 2026-11-28: m2 in ``_commit``'s ``action()``, "1 out-queue" at socket.timeout.ms). A
        # partial has no frame either; a lambda, or the Python method, would be the innermost frame.
        return _source_line(path, line).strip() == "action()"
    if "/fastrecover/" not in path:  # the library's modules (the tools live in fastrecover_tools/)
        return False
    return "_K.commit(" in _source_line(path, line)


def _source_line(path: str, line: str) -> str:
    return Path(path).read_text(encoding="utf-8").splitlines()[int(line) - 1]


def _never_rejoined(proc: WorkerProc, stacks: str) -> bool:
    """Revoked during the outage and never assigned again, its main thread idle in the plain client's wait.

    Seen in CI on 2026-11-24 (classic, dynamic): the broker stopped 1 s after both members joined; m1's
    synchronous commit waited for the coordinator until its session timed out (3 s), failed with
    _WAIT_COORD, the lost assignment was revoked while the broker was still away, and librdkafka never
    sent another group request: no log line for the 120 s after the broker came back, no assignment,
    the main thread in confluent_kafka's ``consume()``, while m2 rejoined and took every partition.
    fastrecover held no range there and had nothing in flight, so the member is restarted like the
    commit wait above; a member whose main thread is anywhere else still fails the test.
    """
    revoked, assigned = proc.count("revoked"), proc.count("assigned")
    if not revoked or (assigned and assigned[-1]["t"] > revoked[-1]["t"]):
        return False
    frames = _main_frames(stacks)
    if not frames:
        return False
    path, line, _func = frames[0]
    if "/fastrecover/" not in path:
        return False
    source = _source_line(path, line)
    return "_K.consume(" in source or "_K.poll(" in source


def _main_frames(stacks: str) -> list[tuple[str, str, str]]:
    """The main thread's frames (path, line, function), innermost first, in the newest faulthandler dump."""
    blocks = re.split(r"(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):", stacks)
    main = [b for b in blocks[1:] if " in <module>" in b]
    if not main:
        return []
    return re.findall(r'File "([^"]+)", line (\d+) in (\w+)', main[-1])


def _where_they_are(driver: ChaosDriver, back_ms: int) -> str:
    """A line a member: alive, records finished since the broker came back, the main thread's innermost frames.

    It opens a failure message, before the full dumps, so that a report that keeps only the start of a
    failure still says where a member was stuck."""
    out = []
    for i in (0, 1):
        proc = driver.proc(i)
        if proc is None:
            out.append(f"member {i}: no process")
            continue
        frames = _main_frames(proc.dump_stacks(lines=400)) if proc.alive else []
        where = " <- ".join(f"{Path(p).name}:{line} {func}" for p, line, func in frames[:4]) or "no stack"
        state = "alive" if proc.alive else "exited"
        out.append(f"member {i} ({proc.name}, {state}, {driver.finished_by(i, back_ms)} finished since): {where}")
    return "\n".join(out)


def _dump(frames: list[tuple[Path, int, str]]) -> str:
    """A faulthandler dump of a main thread whose innermost frames are ``frames`` (innermost first)."""
    lines = [f'  File "{path}", line {line} in {func}' for path, line, func in frames]
    lines.append('  File "/app/worker.py", line 340 in <module>')
    return "Current thread 0x00007fb2f5dddb80 (most recent call first):\n" + "\n".join(lines) + "\n"


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if text in line)


def test_the_probe_sees_the_plain_commit_wherever_fastrecover_calls_it() -> None:
    """Every frame CI met: ``Consumer.commit``'s own call, the offset-less sync commit's in commits.py, and
    the worker's call of a one-record commit that the extension's C path sends straight to the client."""
    root = Path(__file__).resolve().parents[2]
    consumer, commits = root / "fastrecover" / "consumer.py", root / "fastrecover" / "commits.py"
    direct = _line_of(consumer, "return _K.commit(self, message=message, asynchronous=asynchronous)")
    offsetless = _line_of(commits, "return self._noted(_K.commit(self.app, asynchronous=False))")
    both = _line_of(commits, "result = kafka()")
    worker = root / "tools" / "fastrecover_tools" / "testing" / "worker.py"
    action = _line_of(worker, "        action()")
    assert _in_plain_commit(_dump([(consumer, direct, "commit")]))
    assert _in_plain_commit(_dump([(commits, offsetless, "kafka"), (commits, both, "commit_both")]))
    # the C path of a one-record commit (FastOffsets): the worker's own call is the innermost frame
    assert _in_plain_commit(_dump([(worker, action, "_commit")]))
    assert not _in_plain_commit(_dump([(worker, action + 1, "_commit")]))
    # anything else stuck is not the upstream wait: the test must fail on it
    assert not _in_plain_commit(_dump([(commits, both, "commit_both")]))
    assert not _in_plain_commit(_dump([(consumer, direct - 1, "commit")]))
    assert not _in_plain_commit("no dump at all")
    # a frame with no file behind it (frozen modules) is nobody's commit, and the probe must not raise on it
    assert not _in_plain_commit(_dump([(Path("<frozen runpy>"), 88, "_run_code")]))


class _LivenessProbe:
    """What a liveness probe does: restart a member stuck in librdkafka's synchronous commit (upstream),
    or one librdkafka never put back in the group (cause not established: docs/reliability.md, session 18)."""

    def __init__(self, driver: ChaosDriver, back_ms: int) -> None:
        self.driver = driver
        self.back_ms = back_ms
        self.restarted: list[str] = []
        self.next_look = time.monotonic() + HUNG_S

    def check(self) -> None:
        if time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + 10.0
        for i in (0, 1):
            proc = self.driver.proc(i)
            if proc is None or not proc.alive or self.driver.finished_by(i, self.back_ms) > 0:
                continue
            stacks = proc.dump_stacks(lines=400)
            if _in_plain_commit(stacks):
                why = "hung-in-commit"
            elif _never_rejoined(proc, stacks):
                why = "never-rejoined"
            else:
                continue
            log.warning("%s is stuck (%s): restarting it", proc.name, why)
            self.restarted.append(f"{proc.name}: {why}")
            proc.kill(why)
            self.driver.spawn(i, faults=False)


@pytest.mark.parametrize(
    ("group_protocol", "static"), MEMBERSHIPS, ids=[f"{p}-{'static' if s else 'dynamic'}" for p, s in MEMBERSHIPS]
)
def test_broker_stop_and_restart_loses_nothing_and_both_resume(
    private_broker: LocalJarBroker, chaos_driver: DriverFactory, group_protocol: str, static: bool
) -> None:
    driver = chaos_driver(
        members=2,
        cycles=0,
        topics=2,
        partitions=4,
        rate=200.0,
        bootstrap_servers=private_broker.bootstrap,  # a LocalJarBroker has the KIP-848 session settings
        commit_modes=("sync", "message"),
        stall_share=0.0,
        fail_child_share=0.0,
        group_protocol=group_protocol,
        static=static,
    )
    driver.start()
    wait_for(lambda: all(driver.finished_by(i, 0) >= 100 for i in (0, 1)), 90, 0.2, "both members to finish records")
    producer = driver.producer
    assert producer is not None
    private_broker.stop()
    # keep it away while the producer queues several seconds of records
    wait_for(lambda: producer.sent - producer.acked >= 1000, 60, 0.1, "a backlog of 1000 unacknowledged records")
    private_broker.start()
    back_ms = int(time.time() * 1000)

    probe = _LivenessProbe(driver, back_ms)

    def both_resumed() -> bool:
        if static:
            _restart_fenced(driver)
        probe.check()
        return all(driver.finished_by(i, back_ms) > 0 for i in (0, 1))

    wait_or_report(
        driver,
        both_resumed,
        120,
        0.2,
        "both members to finish records after the broker came back",
        summary=lambda: _where_they_are(driver, back_ms),
    )
    for i in (0, 1):
        proc = driver.proc(i)
        assert proc is not None and proc.alive, f"member {i} died with the broker"
    result = driver.finish()
    table = verdict_ok(result)
    assert result.verdict.ok, table
    assert result.verdict.lost == 0, table
    # a restart is only ever the application's answer to a fatal error (static members only), or a
    # liveness probe's to the upstream commit wait (named in the log)
    assert len(result.incarnations) == 2 + result.fatal_exits + len(probe.restarted), (
        "a member was restarted without a fatal error: " + table
    )
    if not static:
        assert result.fatal_exits == 0, "a dynamic member died with the broker: " + table
