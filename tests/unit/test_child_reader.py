"""The threadless child against a fake handle: cutting at range ends, gaps, give-back on pause/seek."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, Message, TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrecover.batches import GapEvent
from fastrecover.book import RangeWork
from fastrecover.child import ChildReader
from fastrecover.primary import PrimaryOffsets, last_offsets
from fastrecover.tokens import TopicPartitionKey

KEY = TopicPartitionKey("t", 0)


class FakeHandle:
    """A partition log with holes; consume() serves from each assigned partition's position."""

    def __init__(self, logs: dict[tuple[str, int], list[int]], low: int = 0) -> None:
        self.logs = logs
        self.low = low
        self.pos: dict[tuple[str, int], int] = {}
        self.paused: set[tuple[str, int]] = set()
        self.closed = False

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in self.pos]

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.pos[(tp.topic, tp.partition)] = tp.offset

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.pos.pop((tp.topic, tp.partition), None)

    def seek(self, tp: TopicPartition) -> None:
        self.pos[(tp.topic, tp.partition)] = tp.offset

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in tps}

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        log = self.logs[(tp.topic, tp.partition)]
        return self.low, (log[-1] + 1 if log else 0)

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.pos[(tp.topic, tp.partition)]) for tp in tps]

    def consume(self, n: int, timeout: float) -> list[Message]:
        out: list[Message] = []
        for key, at in list(self.pos.items()):
            if key in self.paused:
                continue
            if at < self.low:  # auto.offset.reset=error: the fetch reports it, and stops
                error = KafkaError(KafkaError._AUTO_OFFSET_RESET, f"offset {at} out of range")
                out.append(Message(topic=key[0], partition=key[1], offset=at, error=error))
                self.pos[key] = 2**62
                continue
            records = [o for o in self.logs[key] if o >= at][: max(0, n - len(out))]
            out.extend(Message(topic=key[0], partition=key[1], offset=o) for o in records)
            if records:
                self.pos[key] = records[-1] + 1
        return out

    def close(self) -> None:
        self.closed = True


def _reader(handle: FakeHandle, batch: int = 7) -> ChildReader:
    return ChildReader({}, batch_size=batch, broker_timeout_s=1.0, consumer_factory=lambda _conf: handle)


def _drain(reader: ChildReader, limit: int = 3, rounds: int = 200) -> list[int]:
    got: list[int] = []
    for _ in range(rounds):
        msgs, _runs = reader.take(limit)
        got.extend(m.offset() for m in msgs)  # type: ignore[misc]
    return got


@settings(max_examples=150, deadline=None)
@given(
    present=st.sets(st.integers(0, 80), min_size=1),
    start=st.integers(0, 40),
    length=st.integers(1, 40),
    limit=st.integers(1, 9),
    batch=st.integers(1, 9),
)
def test_delivers_exactly_the_range_and_marks_holes_as_gaps(
    present: set[int], start: int, length: int, limit: int, batch: int
) -> None:
    end = start + length
    handle = FakeHandle({("t", 0): sorted(present | {end + 5})})  # a record past the end exists
    reader = _reader(handle, batch)
    reader.add([RangeWork(1, KEY, start, start, end)])
    got = _drain(reader, limit)
    assert got == sorted(o for o in present if start <= o < end), "every record of the range, once, in order"
    holes: set[int] = set()
    for event in reader.drain_events():
        assert isinstance(event, GapEvent)
        holes |= set(range(event.start, event.end))
    assert holes == set(range(start, end)) - present, "gaps are exactly the offsets with no record"
    assert reader.drain_finished() == [(1, KEY)]
    assert not reader.has_work


def test_pause_gives_buffered_records_back_and_resume_refetches_them() -> None:
    handle = FakeHandle({("t", 0): list(range(100))})
    reader = _reader(handle, batch=20)
    reader.add([RangeWork(1, KEY, 10, 10, 60)])
    first, _ = reader.take(5)
    assert [m.offset() for m in first] == [10, 11, 12, 13, 14]
    assert reader.buffered() == 15
    reader.pause([KEY])
    assert reader.buffered() == 0
    assert reader.take(10) == ([], [])
    reader.resume([KEY])
    assert _drain(reader, 10)[:3] == [15, 16, 17], "delivery resumes after the last record handed out"


def test_seek_into_the_range_redelivers_from_there_only() -> None:
    handle = FakeHandle({("t", 0): list(range(100))})
    reader = _reader(handle, batch=10)
    reader.add([RangeWork(1, KEY, 20, 20, 50)])
    msgs, _ = reader.take(10)
    assert msgs[-1].offset() == 29
    assert reader.rewind(KEY, 29)
    again, _ = reader.take(2)
    assert [m.offset() for m in again] == [29, 30]
    assert not reader.rewind(KEY, 70), "an offset outside every range is the primary's"


def test_retention_moves_the_cursor_and_reports_the_skip() -> None:
    handle = FakeHandle({("t", 0): list(range(30, 60))}, low=30)
    reader = _reader(handle)
    reader.add([RangeWork(1, KEY, 10, 10, 50)])
    assert reader.drain_events() == [], "no log-start round trip before the first fetch"
    assert reader.take(5) == ([], []), "nothing past the skip before the caller has counted it"
    (event,) = reader.drain_events()
    assert event.low == 30  # type: ignore[union-attr]
    assert _drain(reader)[:2] == [30, 31], "the out-of-range fetch moved the cursor to the log start"


def test_a_failed_batch_replaces_the_handle_and_resumes_at_the_cursor() -> None:
    handles: list[FakeHandle] = []

    def factory(_conf: dict[str, Any]) -> FakeHandle:
        handles.append(FakeHandle({("t", 0): list(range(100))}))
        return handles[-1]

    reader = ChildReader({}, batch_size=5, broker_timeout_s=1.0, consumer_factory=factory)
    reader.add([RangeWork(1, KEY, 0, 0, 40)])
    first, _ = reader.take(5)
    assert len(first) == 5
    reader.failure = RuntimeError("boom")
    assert not reader.is_alive()
    reader.restart()
    assert reader.is_alive() and len(handles) == 2 and handles[0].closed
    more, _ = reader.take(3)
    assert [m.offset() for m in more] == [5, 6, 7]


class BreakingHandle(FakeHandle):
    """A FakeHandle whose ``position`` and ``assignment`` raise once it is broken, as a closed consumer's do."""

    broken = False

    def assignment(self) -> list[TopicPartition]:
        if self.broken:
            raise RuntimeError("Consumer closed")
        return super().assignment()

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        if self.broken:
            raise RuntimeError("Consumer closed")
        return super().position(tps)


def test_a_handle_that_breaks_mid_take_returns_what_was_taken_and_the_next_handle_resumes() -> None:
    """The merge took the primary's records before the child's: a failure raised here would lose them,
    and with them the child's records this call had already handed out."""
    handles: list[BreakingHandle] = []

    def factory(_conf: dict[str, Any]) -> BreakingHandle:
        handles.append(BreakingHandle({("t", 0): [0, 1, 2]}))  # nothing past the range yet
        return handles[-1]

    reader = ChildReader({}, batch_size=8, broker_timeout_s=1.0, consumer_factory=factory)
    reader.add([RangeWork(1, KEY, 0, 0, 3)])
    first, _ = reader.take(2)
    handles[0].broken = True
    # [2] is handed out, then an empty fetch asks the positions (did the fetcher pass the end?): it raises
    more, _ = reader.take(10)
    assert [m.offset() for m in first + more] == [0, 1, 2]
    assert reader.failure is not None and not reader.is_alive(), "the child's failure, not the caller's"
    reader.pause([KEY])
    reader.resume([KEY])
    reader.restart()
    assert reader.is_alive() and len(handles) == 2
    assert _reader_take_all(reader) == [] and reader.drain_finished() == [(1, KEY)], "resumed at the cursor"


def test_ranges_added_while_the_handle_cannot_be_made_are_started_by_the_next_one() -> None:
    made: list[FakeHandle] = []

    def factory(_conf: dict[str, Any]) -> FakeHandle:
        if not made:
            made.append(FakeHandle({}))
            raise RuntimeError("no handle now")
        made.append(FakeHandle({("t", 0): list(range(20))}))
        return made[-1]

    reader = ChildReader({}, batch_size=5, broker_timeout_s=1.0, consumer_factory=factory)
    reader.add([RangeWork(1, KEY, 3, 3, 12)])  # raises nothing: the recovery that called it goes on
    assert reader.failure is not None and reader.has_work
    reader.restart()
    assert [m.offset() for m in _reader_take_all(reader)] == list(range(3, 12))


def test_two_partitions_in_one_batch_are_cut_separately() -> None:
    other = TopicPartitionKey("t", 1)
    handle = FakeHandle({("t", 0): list(range(50)), ("t", 1): list(range(50))})
    reader = _reader(handle, batch=100)
    reader.add([RangeWork(1, KEY, 0, 0, 10), RangeWork(2, other, 5, 5, 8)])
    got = {(m.partition(), m.offset()) for m in _reader_take_all(reader)}
    assert got == {(0, o) for o in range(10)} | {(1, o) for o in range(5, 8)}


class CountingHandle(FakeHandle):
    """A FakeHandle that records every incremental_assign and pause call."""

    def __init__(self, logs: dict[tuple[str, int], list[int]]) -> None:
        super().__init__(logs)
        self.assign_calls: list[list[tuple[str, int, int]]] = []
        self.pause_calls: list[set[tuple[str, int]]] = []

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.assign_calls.append([(tp.topic, tp.partition, tp.offset) for tp in tps])
        super().incremental_assign(tps)

    def pause(self, tps: list[TopicPartition]) -> None:
        self.pause_calls.append({(tp.topic, tp.partition) for tp in tps})
        super().pause(tps)


def test_new_partitions_are_assigned_in_one_call_paused_ones_stay_paused() -> None:
    """librdkafka's incremental_assign costs time in the whole assignment: one call for a recovery's partitions."""
    count = 50
    handle = CountingHandle({("t", p): list(range(40)) for p in range(count)})
    reader = _reader(handle, batch=1000)
    reader.pause([TopicPartitionKey("t", 3), TopicPartitionKey("t", 7)])
    reader.add([RangeWork(100 + p, TopicPartitionKey("t", p), 10, 10 + p % 5, 30) for p in range(count)])
    assert handle.assign_calls == [[("t", p, 10 + p % 5) for p in sorted(range(count), key=lambda p: p % 5)]]
    assert handle.pause_calls == [{("t", 3), ("t", 7)}]
    # a second range of a partition already read queues behind the first: no assign at all
    reader.add([RangeWork(999, TopicPartitionKey("t", 0), 30, 30, 35)])
    assert len(handle.assign_calls) == 1
    got = {(m.partition(), m.offset()) for m in _reader_take_all(reader)}
    expected = {(p, o) for p in range(count) if p not in (3, 7) for o in range(10 + p % 5, 30)}
    assert got == expected | {(0, o) for o in range(30, 35)}, "every range of every unpaused partition, once"


def _reader_take_all(reader: ChildReader) -> list[Message]:
    out: list[Message] = []
    for _ in range(20):
        msgs, _ = reader.take(100)
        out.extend(msgs)
    return out


def test_last_offsets_one_and_many_topics() -> None:
    msgs = [Message(topic="a", partition=p, offset=o) for p, o in [(0, 1), (1, 5), (0, 2), (1, 6)]]
    assert last_offsets(msgs) == {("a", 0): 2, ("a", 1): 6}
    assert last_offsets(msgs, "a") == {("a", 0): 2, ("a", 1): 6}


def test_primary_offsets_count_a_record_once_the_next_call_begins() -> None:
    offsets = PrimaryOffsets()
    offsets.unsettled.extend(Message(topic="a", partition=0, offset=o) for o in (3, 4))
    assert offsets.take_dirty() == {}
    offsets.settle()
    assert offsets.take_dirty() == {("a", 0): 5}
    assert offsets.take_dirty() == {}
