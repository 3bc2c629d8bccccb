"""The streaming reader's planning shell (recovery hold, AvailableNow, read limits) with a fake log.

No Spark session and no broker: the reader is driven the way Spark's source runner drives it.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from fastrecover.ranges import OffsetRange
from fastrecover.spark.offsets import LogBounds, PartitionState, Piece, SourceOffset, batch_pieces
from fastrecover.spark.options import parse_source_options
from fastrecover.spark.source import FastRecoverStreamReader
from fastrecover.tokens import TopicPartitionKey as K

A0 = K("a", 0)


class FakeLog:
    def __init__(self, high: int) -> None:
        self.high = high

    def partitions(self, topics: Any) -> list[K]:
        return [A0]

    def bounds(self, keys: Any) -> dict[K, LogBounds]:
        return {A0: LogBounds(0, self.high)}

    def close(self) -> None:
        pass


def reader(log: FakeLog, **options: str) -> FastRecoverStreamReader:
    opts = {
        "kafka.bootstrap.servers": "x:1",
        "subscribe": "a",
        "fastrecover.query": "q",
        "fastrecover.backfill.min.offsets": "100",
        "maxbackfilloffsetspertrigger": "300",
        **options,
    }
    r = FastRecoverStreamReader(parse_source_options({k.lower(): v for k, v in opts.items()}))
    r._view = log  # type: ignore[assignment]
    return r


START = SourceOffset({A0: PartitionState(0, 100)}).to_json()


def test_the_recovery_batch_waits_for_a_fresh_record_then_carries_only_fresh_records() -> None:
    log = FakeLog(1000)
    r = reader(log, freshWaitMs="60000")
    assert r.latestOffset(START, ReadMaxRows(300)) == START  # jump point fixed at 1000, nothing fresh yet
    assert r.latestOffset(START, ReadMaxRows(300)) == START
    log.high = 1010
    first = r.latestOffset(START, ReadMaxRows(300))
    assert SourceOffset.from_json(first) == SourceOffset({A0: PartitionState(0, 1010, (OffsetRange(100, 1000),))})
    assert batch_pieces(SourceOffset.from_json(START), SourceOffset.from_json(first)) == [
        Piece("a", 0, 1000, 1010, False)
    ]
    second = r.latestOffset(first, ReadMaxRows(300))
    assert SourceOffset.from_json(second).partitions[A0].pending == (OffsetRange(400, 1000),)


def test_without_fresh_records_the_recovery_batch_is_cut_after_fresh_wait() -> None:
    r = reader(FakeLog(1000), freshWaitMs="0")
    assert SourceOffset.from_json(r.latestOffset(START, ReadMaxRows(300))).partitions[A0] == PartitionState(
        0, 1000, (OffsetRange(100, 1000),)
    )


def test_available_now_cuts_at_once_and_stops_at_its_target() -> None:
    log = FakeLog(1000)
    r = reader(log, freshWaitMs="60000")
    r.prepareForTriggerAvailableNow()
    log.high = 5000  # arrives after the trigger started: not part of this run
    offset = START
    batches = 0
    while True:
        end = r.latestOffset(offset, ReadMaxRows(300))
        if end == offset:
            break
        offset, batches = end, batches + 1
    assert SourceOffset.from_json(offset).partitions[A0] == PartitionState(0, 1000)
    assert batches == 4  # the recovery batch, then 900 lag offsets in batches of at most 300


def test_read_all_available_takes_everything_in_one_batch() -> None:
    r = reader(FakeLog(1000))
    end = SourceOffset.from_json(r.latestOffset(START, ReadAllAvailable()))
    assert end.partitions[A0] == PartitionState(0, 1000)


def test_a_small_lag_is_read_live_without_recovery() -> None:
    r = reader(FakeLog(150), freshWaitMs="60000")
    assert SourceOffset.from_json(r.latestOffset(START, ReadMaxRows(300))).partitions[A0] == PartitionState(0, 150)


def test_readers_pickle_without_clients_or_run_state() -> None:
    import pickle

    r = reader(FakeLog(1000))
    r.latestOffset(START, ReadMaxRows(300))
    copy = pickle.loads(pickle.dumps(r))
    assert copy.options == r.options
    assert copy._view is None and copy._hold is None and copy._first_plan
