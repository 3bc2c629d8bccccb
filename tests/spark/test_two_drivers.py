"""Two ``start_kafka_stream`` drivers on one checkpoint at once (a scheduler's retry while the old driver
is a zombie, a manual restart): whichever survives, or the next restart, delivers every record of the lag.

Real Spark (local), real broker, a real checkpoint on disk.  The second driver starts at the exact point
where the first has journalled its jump and not yet written the jump batch: the first driver's
``trace`` events (a no-op profiling aid) are where the test interleaves the second one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from fastrecover.errors import CheckpointError
from fastrecover.spark import controller, restart, start_kafka_stream
from fastrecover.spark.checkpoint import parse_journal
from fastrecover.spark.checkpoint_files import CheckpointFiles
from fastrecover.spark.journal import Journal
from fastrecover.spark.offsets import Piece
from fastrecover_tools.testing.broker import Record, produce
from tests.spark.helpers import Sink
from tests.spark.test_kafka_stream import TRIGGER, _batch_ids, _kinds, _log_end, _options, _run, _wait, _warm_up

pytestmark = [pytest.mark.spark, pytest.mark.integration]

JOURNALLED = "kafka-stream recover: jump journalled"
TIDIED = "kafka-stream recover: tidied"


class Killed(Exception):
    """The second driver's process dying at a chosen point of its start."""


def _second_driver_at_the_jump(
    monkeypatch: pytest.MonkeyPatch, second: Callable[[], object], kill_at: str | None = None
) -> list[object]:
    """Run ``second()`` (the second driver's start) once the first driver has journalled its jump, before
    it writes the jump batch; ``kill_at``: the trace event at which the second driver dies.  Returns a
    list that holds what ``second()`` returned (or raised) once it has run."""
    outcome: list[object] = []
    phase = {"second running": False}

    def interleave(event: str) -> None:
        if phase["second running"]:
            if event == kill_at:
                raise Killed(event)
            return
        if event == JOURNALLED and not outcome:
            phase["second running"] = True
            try:
                outcome.append(second())
            except Exception as exc:  # the second driver's own failure is an outcome, not the test's
                outcome.append(exc)
            finally:
                phase["second running"] = False

    monkeypatch.setattr(restart, "trace", interleave)
    return outcome


def _every_offset(bootstrap: str, topic: str, sink: Sink) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    ends = _log_end(bootstrap, topic, 2)
    return {(r.partition, r.offset) for r in sink.rows()}, {(p, o) for p in (0, 1) for o in range(ends[p])}


def _restart_reads_every_offset(
    spark: SparkSession, bootstrap: str, topic: str, options: dict[str, str], sink: Sink, checkpoint: Path
) -> None:
    """A restart after the drivers are gone reads the 400 lag records of the jump the first driver wrote, and
    two fresh ones: every offset of the topic is delivered."""
    produce(bootstrap, topic, [Record(b"G%d" % i, partition=i % 2) for i in range(2)])
    _run(
        spark,
        options,
        sink,
        checkpoint,
        lambda: _kinds(sink)["L"] >= 400 and _kinds(sink)["G"] >= 2,
        120,
        "the lag of the jump the first driver wrote, read after a restart",
    )
    delivered, written = _every_offset(bootstrap, topic, sink)
    assert written - delivered == set()


def test_a_second_driver_that_dies_while_the_first_jumps_leaves_the_jump_s_lag_owed(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path, sink: Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Driver B starts after A journalled jump N+1 and dies before writing anything of its own; A writes
    the jump batch and dies before its first chunk.  The restart owes, and reads, A's whole lag."""
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    options = _options(bootstrap, topic, maxBackfillOffsetsPerTrigger="100000")
    _warm_up(spark, bootstrap, topic, options, sink, checkpoint)
    produce(bootstrap, topic, [Record(b"L%d" % i, partition=i % 2) for i in range(400)])
    jump = max(_batch_ids(checkpoint / "offsets")) + 1

    def driver_b() -> object:
        return start_kafka_stream(spark, options, sink, str(checkpoint), trigger=TRIGGER)

    outcome = _second_driver_at_the_jump(monkeypatch, driver_b, kill_at=TIDIED)
    # Driver A: its trigger does not come back before it dies, so it reads no chunk of its lag.
    query = start_kafka_stream(spark, options, sink, str(checkpoint), trigger={"processingTime": "1 hour"})
    query.stop()
    assert len(outcome) == 1 and isinstance(outcome[0], Killed), outcome
    assert (checkpoint / "commits" / str(jump)).exists()
    assert (checkpoint / "fastrecover" / "jumps" / str(jump)).exists()  # the jump batch's lag is on record
    assert _kinds(sink)["L"] == 0
    monkeypatch.undo()

    _restart_reads_every_offset(spark, bootstrap, topic, options, sink, checkpoint)


def test_a_second_driver_that_runs_on_finishes_the_first_driver_s_jump_which_then_fails(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path, sink: Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Driver B starts after A journalled jump N+1 and runs on: it finishes A's jump (the journal entry is
    never rewritten) and reads its lag; A then fails on the jump batch B wrote, having read nothing."""
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    options = _options(bootstrap, topic, maxBackfillOffsetsPerTrigger="100000")
    _warm_up(spark, bootstrap, topic, options, sink, checkpoint)
    produce(bootstrap, topic, [Record(b"L%d" % i, partition=i % 2) for i in range(400)])
    jump = max(_batch_ids(checkpoint / "offsets")) + 1
    entry = checkpoint / "fastrecover" / "jumps" / str(jump)
    journalled: list[str] = []

    def driver_b() -> object:
        journalled.append(entry.read_text())  # A's entry, as A wrote it
        return start_kafka_stream(spark, options, sink, str(checkpoint), trigger=TRIGGER)

    outcome = _second_driver_at_the_jump(monkeypatch, driver_b)
    with pytest.raises(CheckpointError, match=rf"{checkpoint}/offsets/{jump} exists already"):
        start_kafka_stream(spark, options, sink, str(checkpoint), trigger=TRIGGER)
    assert len(outcome) == 1 and not isinstance(outcome[0], Exception), outcome
    query: Any = outcome[0]
    try:
        produce(bootstrap, topic, [Record(b"G%d" % i, partition=i % 2) for i in range(2)])
        _wait(query, lambda: _kinds(sink)["L"] >= 400 and _kinds(sink)["G"] >= 2, 120, "B reads A's jumped lag")
        query.processAllAvailable()
    finally:
        query.stop()
    assert entry.read_text() == journalled[0]
    assert {(p.partition, p.start, p.end) for p in parse_journal(journalled[0], str(entry))} == {
        (0, 2, 202),
        (1, 2, 202),
    }
    delivered, written = _every_offset(bootstrap, topic, sink)
    assert written - delivered == set()


def test_a_journal_entry_is_written_once_and_another_driver_s_is_never_replaced(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The same decision twice is one entry; a different one stops the later driver, naming the file."""
    checkpoint = tmp_path / "checkpoint"
    first, second, third = (Journal(CheckpointFiles(spark, str(checkpoint))) for _ in range(3))
    theirs = [Piece("t", 0, 10, 200, True), Piece("t", 1, 12, 90, True)]
    first.add_jump(6, theirs)
    second.add_jump(6, list(reversed(theirs)))  # the same ranges: nothing to tell apart
    entry = checkpoint / "fastrecover" / "jumps" / "6"
    written = entry.read_text()
    with pytest.raises(CheckpointError, match=rf"{checkpoint}/fastrecover/jumps/6 exists already .*another driver"):
        third.add_jump(6, [Piece("t", 0, 10, 300, True)])
    assert entry.read_text() == written and 6 not in third.jumps
    assert parse_journal(written, str(entry)) == theirs
    assert sorted(p.name for p in entry.parent.iterdir()) == ["6"]  # no temporary file left behind


def test_of_two_drivers_creating_one_file_at_once_exactly_one_succeeds(spark: SparkSession, tmp_path: Path) -> None:
    """Writing once is one step on local disk (a hard link): Hadoop's local rename would let both win."""
    checkpoint = tmp_path / "checkpoint"
    drivers = [CheckpointFiles(spark, str(checkpoint)) for _ in range(2)]

    def create(i: int, rel: str, start: threading.Barrier, won: list[tuple[int, bool]]) -> None:
        start.wait()
        won.append((i, drivers[i].create(rel, f"driver {i}")))

    for batch in range(20):
        start, won = threading.Barrier(2), list[tuple[int, bool]]()
        threads = [threading.Thread(target=create, args=(i, f"offsets/{batch}", start, won)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        winners = [i for i, ok in won if ok]
        assert len(won) == 2 and len(winners) == 1, won
        assert (checkpoint / "offsets" / str(batch)).read_text() == f"driver {winners[0]}"
    assert sorted(int(p.name) for p in (checkpoint / "offsets").iterdir()) == list(range(20))


def test_a_second_driver_that_loaded_the_journal_before_the_first_wrote_its_jump_keeps_the_entry(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path, sink: Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B loads the journal, then A journals jump N+1 and writes its batch, then B lists the offset log and
    finds N+1 not committed, with no jump entry in the journal it loaded.  B must judge N+1 by the entry on
    disk, not delete it; then both drivers die.  The restart reads A's whole lag."""
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    options = _options(bootstrap, topic, maxBackfillOffsetsPerTrigger="100000")
    _warm_up(spark, bootstrap, topic, options, sink, checkpoint)
    produce(bootstrap, topic, [Record(b"L%d" % i, partition=i % 2) for i in range(400)])
    b_loaded, b_go = threading.Event(), threading.Event()
    b_outcome: list[object] = []
    jump = max(_batch_ids(checkpoint / "offsets")) + 1

    def b_process(_df: Any, batch_id: int) -> None:
        raise Killed(f"B delivered batch {batch_id}")  # B dies as it delivers anything

    def driver_b() -> None:
        try:
            b_outcome.append(start_kafka_stream(spark, options, b_process, str(checkpoint), trigger=TRIGGER))
        except BaseException as exc:  # B's death (or refusal) is an outcome, looked at below
            b_outcome.append(exc)

    b_thread = threading.Thread(target=driver_b, name="driver-b")

    def in_b() -> bool:
        return threading.current_thread() is b_thread

    def controller_trace(event: str) -> None:
        if in_b() and event == "kafka-stream journal loaded":
            b_loaded.set()
            assert b_go.wait(180), "driver A never let driver B go on"

    def restart_trace(event: str) -> None:
        if in_b():
            if event == TIDIED:
                raise Killed(event)
        elif event == "kafka-stream recover: offsets written":  # A's jump batch, not committed yet
            b_go.set()
            b_thread.join(300)
            assert not b_thread.is_alive(), "driver B did not finish"

    monkeypatch.setattr(controller, "trace", controller_trace)
    monkeypatch.setattr(restart, "trace", restart_trace)
    b_thread.start()
    assert b_loaded.wait(180), "driver B did not load the journal"
    try:  # driver A: dies before its first chunk, if it gets to start at all
        start_kafka_stream(spark, options, sink, str(checkpoint), trigger={"processingTime": "1 hour"}).stop()
    except CheckpointError as exc:
        assert "exists already" in str(exc)
    finally:
        b_go.set()
        b_thread.join(300)
    assert len(b_outcome) == 1 and isinstance(b_outcome[0], Killed), b_outcome
    assert (checkpoint / "commits" / str(jump)).exists()
    assert (checkpoint / "fastrecover" / "jumps" / str(jump)).exists()  # the jump batch's lag is on record
    monkeypatch.undo()

    _restart_reads_every_offset(spark, bootstrap, topic, options, sink, checkpoint)


def test_a_jump_journalled_by_a_driver_that_died_is_written_as_journalled_then_the_grown_lag_jumps(
    spark: SparkSession, bootstrap: str, topic_factory: Any, tmp_path: Path, sink: Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver dies right after journalling jump N+1.  Its entry may as well be a live driver's, so the
    next start does not rewrite it: batch N+1 jumps with it, and the lag that grew meanwhile is jumped
    at N+2.  Both are read, in the batches after them."""
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"
    jumps = checkpoint / "fastrecover" / "jumps"
    options = _options(bootstrap, topic, maxBackfillOffsetsPerTrigger="100000")
    _warm_up(spark, bootstrap, topic, options, sink, checkpoint)
    produce(bootstrap, topic, [Record(b"L%d" % i, partition=i % 2) for i in range(400)])
    jump = max(_batch_ids(checkpoint / "offsets")) + 1

    def die_after_the_journal(event: str) -> None:
        if event == JOURNALLED:
            raise Killed(event)

    monkeypatch.setattr(restart, "trace", die_after_the_journal)
    with pytest.raises(Killed):
        start_kafka_stream(spark, options, sink, str(checkpoint), trigger=TRIGGER)
    monkeypatch.undo()
    assert max(_batch_ids(checkpoint / "offsets")) == jump - 1 and (jumps / str(jump)).exists()
    produce(bootstrap, topic, [Record(b"M%d" % i, partition=i % 2) for i in range(400)])
    _run(
        spark,
        options,
        sink,
        checkpoint,
        lambda: _kinds(sink)["L"] >= 400 and _kinds(sink)["M"] >= 400,
        120,
        "the lag journalled by the dead driver and the lag that grew after it",
    )
    journalled = {b: parse_journal((jumps / str(b)).read_text(), str(b)) for b in (jump, jump + 1)}
    assert {b: {(p.partition, p.start, p.end) for p in r} for b, r in journalled.items()} == {
        jump: {(0, 2, 202), (1, 2, 202)},
        jump + 1: {(0, 202, 402), (1, 202, 402)},
    }
    delivered, written = _every_offset(bootstrap, topic, sink)
    assert written - delivered == set()
    assert len(sink.rows()) == len(written)  # and once each: nothing is read twice when no driver runs along
